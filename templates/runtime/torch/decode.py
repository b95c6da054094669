"""generate.py's decode, the parts no spec changes: the weights it reads, the activations a pipeline stage
sends to the next, and the layers at one position over a key/value cache (the DecodeLayers base class; the
build's KVCacheDecoder adds its blocks and its step)."""

import math

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

# The dtypes an activation passed between stages may have (its header names one by index)
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.long)


def send(x, group, dst):
    """x to pipe rank `dst` of `group`: a header (its dtype, number of dimensions and shape), then its
    values."""
    head = torch.zeros(8, dtype=torch.long, device=x.device)
    head[0], head[1] = DTYPES.index(x.dtype), x.dim()
    head[2 : 2 + x.dim()] = torch.tensor(x.shape)
    dist.send(head, group=group, group_dst=dst)
    dist.send(x.contiguous(), group=group, group_dst=dst)


def receive(group, src, device):
    """What pipe rank `src` of `group` sends (send)."""
    head = torch.zeros(8, dtype=torch.long, device=device)
    dist.recv(head, group=group, group_src=src)
    x = torch.empty(head[2 : 2 + int(head[1])].tolist(), dtype=DTYPES[int(head[0])], device=device)
    dist.recv(x, group=group, group_src=src)
    return x


@torch.no_grad()
def decode_weights(model, dtype, tensor_local=()):
    """Every parameter by canonical name, in torch's layout and `dtype` (the compute dtype): whole on every
    rank, except those of the `tensor_local` layers (module FQNs, `*` for every copy of a repeated block),
    which keep this rank's shard over `tensor`."""
    from torch.distributed.tensor import DTensor, Replicate

    out = {}
    for name, p in model.named_parameters():
        if isinstance(
            p, DTensor
        ):  # gathered over every mesh axis (but `tensor` for tensor_local's)
            module = ".".join("*" if part.isdigit() else part for part in name.split(".")[:-1])
            keep = module in tensor_local
            axes = p.device_mesh.mesh_dim_names
            places = [
                x if keep and axis == "tensor" else Replicate()
                for axis, x in zip(axes, p.placements)
            ]
            p = p.redistribute(p.device_mesh, places).to_local()
        out[name] = p.detach().to(dtype)
    return out


def head_norm(x, weight, eps):
    """train.py's HeadNorm: RMS norm over each head in float32, then the weight."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def scale_inv_freq(inv_freq, scaling):
    """The rotary inverse frequencies (numpy, float64) scaled as transformers scales them: `linear` divides
    them by factor; `llama3` divides the low ones (wavelengths above original_max_position_embeddings /
    low_freq_factor) by factor, keeps the high ones (wavelengths below original_max_position_embeddings /
    high_freq_factor) and interpolates smoothly between."""
    if scaling["type"] == "linear":
        return inv_freq / scaling["factor"]
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def rope_angles(base, head_dim, seq, device, scaling=None):
    """cos and sin of the rotary angles of every position [seq, head_dim / 2], computed as train.py's rope
    computes them."""
    inv_freq = base ** (-torch.arange(0, head_dim // 2, dtype=torch.float64) * 2 / head_dim)
    if scaling:  # transformers' rope_scaling
        inv_freq = torch.from_numpy(scale_inv_freq(inv_freq.numpy(), scaling))
    angles = (torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None]).float().to(device)
    return angles.cos(), angles.sin()


def rope_at(x, cos, sin):
    """train.py's rope of x [B, 1, heads, h] at one position, whose angles' cos and sin [h / 2] are given."""
    h = x.shape[-1]
    xf = x.float()
    x1, x2 = xf[..., : h // 2], xf[..., h // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class DecodeLayers:
    """The layers of the model at one position at a time, over `w` (decode_weights), with a cache of the
    keys and values of `seq` positions per attention layer (and copy of a repeated block), allocated at its
    first use. `group`: the ranks of this rank's `tensor` axis (the row-parallel layers' partial results
    are summed there); `pipe_group`, `pipe_rank`: those of its `pipe` axis, and its place there."""

    def __init__(self, w, seq, group=None, pipe_group=None, pipe_rank=None):
        self.w, self.seq, self.cache, self.angles = w, seq, {}, {}
        self.group, self.pipe_group, self.pipe_rank = group, pipe_group, pipe_rank

    def next_logits(self, token, pos, device):
        """The logits of the token after `token` at position `pos` (numpy, [vocab], float32): the build's
        step on a batch of one sequence."""
        ids = torch.full((1, 1), token, dtype=torch.long, device=device)
        return self.step(ids, pos)[0].cpu().numpy()

    def tp_sum(self, y):
        """The sum over `tensor` of the partial results of a row-parallel layer (an all-reduce)."""
        dist.all_reduce(y, group=self.group)
        return y

    def attention(
        self,
        x,
        pre,
        pos,
        head_dim,
        rotary_base=None,
        rope_scaling=None,
        qk_norm=None,
        scale=None,
        softcap=None,
        bias=False,
        o_bias=True,
        split=False,
    ):
        """train.py's causal attention at position `pos` of x [B, 1, dim]: the position's key and value go
        into the layer's cache at `pos`, and its query reads those of positions 0 .. pos. Query head j reads
        key/value head j // (heads / kv_heads); with `split`, this rank's heads, the output projection's
        partial results summed over `tensor`. Scores and softmax in float32."""
        w, B = self.w, x.shape[0]
        q, k, v = (
            F.linear(x, w[pre + n + ".weight"], w[pre + n + ".bias"] if bias else None)
            for n in "qkv"
        )
        q, k, v = (y.view(B, 1, -1, head_dim) for y in (q, k, v))  # [B, 1, heads (of this rank), h]
        if qk_norm:  # the q/k norms over each head, before the rotation
            q = head_norm(q, w[pre + "q_norm.weight"], qk_norm)
            k = head_norm(k, w[pre + "k_norm.weight"], qk_norm)
        if rotary_base:
            at = (rotary_base, head_dim, repr(rope_scaling))
            if at not in self.angles:
                self.angles[at] = rope_angles(
                    rotary_base, head_dim, self.seq, x.device, rope_scaling
                )
            cos, sin = self.angles[at]
            q, k = rope_at(q, cos[pos], sin[pos]), rope_at(k, cos[pos], sin[pos])
        if pre not in self.cache:
            shape = (B, self.seq)
            self.cache[pre] = (x.new_zeros(*shape, *k.shape[2:]), x.new_zeros(*shape, *v.shape[2:]))
        keys, values = self.cache[pre]
        keys[:, pos], values[:, pos] = k[:, 0], v[:, 0]
        kk, vv = keys[:, : pos + 1], values[:, : pos + 1]  # the positions so far
        if kk.shape[2] != q.shape[2]:  # grouped-query
            kk, vv = (y.repeat_interleave(q.shape[2] // y.shape[2], dim=2) for y in (kk, vv))
        scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk.float())
        scores = scores * scale if scale else scores / math.sqrt(head_dim)
        if softcap:  # capped at +-softcap
            scores = torch.tanh(scores / softcap) * softcap
        probs = torch.softmax(scores, dim=-1).to(x.dtype)
        y = torch.einsum("bhqk,bkhd->bqhd", probs, vv).reshape(B, 1, -1)
        bo = w[pre + "o.bias"] if bias and o_bias else None
        if split:  # row-parallel output projection
            y = self.tp_sum(F.linear(y, w[pre + "o.weight"]))
            return y if bo is None else y + bo
        return F.linear(y, w[pre + "o.weight"], bo)

    def mlp(self, x, pre, activation, bias, split=False, gate_act="silu"):
        """train.py's MLP at one position (swiglu: down(gate_act(gate(x)) * up(x)), else proj(act(fc(x))));
        with `split`, this rank's hidden units, the output projection's partial results summed over
        `tensor`."""
        w = self.w

        def dense(name, h, last=False):
            b = w[pre + name + ".bias"] if bias else None
            if last and split:
                y = self.tp_sum(F.linear(h, w[pre + name + ".weight"]))
                return y if b is None else y + b
            return F.linear(h, w[pre + name + ".weight"], b)

        if activation == "swiglu":
            gate = (
                F.silu if gate_act == "silu" else (lambda h: F.gelu(h, approximate="tanh"))
            )  # (GeGLU)
            return dense("down", gate(dense("gate", x)) * dense("up", x), last=True)
        act = {"gelu": lambda h: F.gelu(h, approximate="tanh"), "relu": F.relu, "silu": F.silu}[
            activation
        ]
        return dense("proj", act(dense("fc", x)), last=True)

    def moe(self, x, pre, top_k, activation, normalize=False, shared=False, shared_gate=False):
        """train.py's MoE (dropless routing: every choice kept) at one position: each token's top_k experts
        by the router's probabilities (float32; ties to the lower expert), the gates times the chosen
        experts' outputs summed in choice order, plus (`shared`) the shared experts' output."""
        w, xs = self.w, x.reshape(-1, x.shape[-1])  # [B, d]
        probs = torch.softmax(xs.float() @ w[pre + "router.weight"].float(), dim=-1)
        gates, choice = torch.sort(probs, dim=-1, descending=True, stable=True)
        gates, choice = gates[:, :top_k], choice[:, :top_k]
        if normalize:
            gates = gates / gates.sum(-1, keepdim=True)
        rows, y = xs[:, None], 0.0  # [B, 1, d]

        def expert(name, e):  # the chosen experts' weights, one per token: [B, ...]
            return w[pre + "experts." + name][e]

        for j in range(top_k):
            e = choice[:, j]
            if activation == "swiglu":
                h = F.silu(rows @ expert("gate.weight", e)) * (rows @ expert("up.weight", e))
                out = h @ expert("down.weight", e)
            else:
                act = {
                    "gelu": lambda h: F.gelu(h, approximate="tanh"),
                    "relu": F.relu,
                    "silu": F.silu,
                }[activation]
                h = act(rows @ expert("fc.weight", e) + expert("fc.bias", e)[:, None])
                out = h @ expert("proj.weight", e) + expert("proj.bias", e)[:, None]
            y = y + out[:, 0].float() * gates[:, j : j + 1]
        if shared:  # every token through the shared experts (one SwiGLU MLP)
            gate = F.silu(xs @ w[pre + "shared.gate.weight"])
            ys = (gate * (xs @ w[pre + "shared.up.weight"])) @ w[pre + "shared.down.weight"]
            if shared_gate:
                ys = torch.sigmoid(xs @ w[pre + "shared_gate.weight"]) * ys
            y = y + ys.float()
        return y.to(x.dtype).reshape(x.shape)
