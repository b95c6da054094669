"""gpt-tiny: the model, one nn.Module per block; parameter names are the spec's canonical names."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    """Multi-head self-attention over [B, T, dim] with separate q, k, v and o projections: tensor parallelism
    splits whole heads (q, k, v column-parallel, o row-parallel), FSDP2 gathers and frees each weight on its
    own. Query head j reads key/value head j // (heads // kv_heads) (grouped-query attention); rotary
    embeddings when rotary_base is set; biases on q, k, v and o with `bias` (on q, k and v only when o_bias
    is False)."""

    def __init__(
        self, dim, heads, kv_heads, head_dim, causal, rotary_base=None, bias=False, o_bias=None
    ):
        super().__init__()
        self.head_dim, self.causal, self.rotary_base = head_dim, causal, rotary_base
        self.q = nn.Linear(dim, heads * head_dim, bias=bias)
        self.k = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.v = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.o = nn.Linear(heads * head_dim, dim, bias=bias if o_bias is None else o_bias)

    def forward(self, x):
        B, T, _ = x.shape
        # -1, not the head count: under tensor parallelism each rank holds heads / tensor whole heads
        q = self.q(x).view(B, T, -1, self.head_dim)
        k = self.k(x).view(B, T, -1, self.head_dim)
        v = self.v(x).view(B, T, -1, self.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, h]
        # softmax(q k^T / sqrt(h)) v; the fused kernels accumulate the softmax in float32
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, enable_gqa=k.shape[1] != q.shape[1]
        )
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm, computed in float32 whatever the compute dtype (docs/program.md "Operators")."""

    def forward(self, x):
        bias = None if self.bias is None else self.bias.float()
        y = F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), bias, self.eps)
        return y.to(x.dtype)


class MLP(nn.Module):
    """The feed-forward block: proj(act(fc(x))). Its gelu is
    the tanh approximation (GPT-2's), as in the JAX target."""

    def __init__(self, dim, hidden, activation, bias):
        super().__init__()
        self.activation = activation
        self.fc = nn.Linear(dim, hidden, bias=bias)
        self.proj = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x):
        h = self.fc(x)
        h = F.gelu(h, approximate="tanh")
        return self.proj(h)


class PosEmbedding(nn.Module):
    """A learned position embedding added to its [batch, seq, dim] input (weight [max_len, dim])."""

    def __init__(self, max_len, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, dim))

    def forward(self, x):
        return x + self.weight[: x.shape[1]]


class Decoder(nn.Module):
    """The `decoder` block of the spec."""

    def __init__(self):
        super().__init__()
        self.ln1 = LayerNorm(128, eps=1e-05, bias=True)
        self.attn = Attention(128, heads=4, kv_heads=4, head_dim=32, causal=True)
        self.ln2 = LayerNorm(128, eps=1e-05, bias=True)
        self.mlp = MLP(128, 512, activation="gelu", bias=True)

    def forward(self, block_input):
        ln1 = self.ln1(block_input)
        attn = self.attn(ln1)
        res1 = block_input + attn
        ln2 = self.ln2(res1)
        mlp_ = self.mlp(ln2)
        res2 = res1 + mlp_
        return res2


class Model(nn.Module):
    """The whole model: inputs -> `lm_head` -> cross_entropy loss (a float32 scalar)."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(256, 128)
        self.wpe = PosEmbedding(64, 128)
        self.blocks = nn.ModuleList(Decoder() for _ in range(4))
        self.ln_f = LayerNorm(128, eps=1e-05, bias=True)

    def forward(self, tokens, targets, predict=False):
        wte = self.wte(tokens)
        wpe = self.wpe(wte)
        blocks = wpe
        for block in self.blocks:
            blocks = block(blocks)
        ln_f = self.ln_f(blocks)
        # tied to wte.weight: the table [vocab, dim] already is nn.Linear's [out, in] layout
        lm_head = F.linear(ln_f, self.wte.weight)
        if predict:  # generate.py --check: the model's output instead of the loss
            return lm_head
        # mean over every target position of the (micro-)batch, in float32
        return F.cross_entropy(lm_head.float().flatten(0, -2), targets.flatten().long())
