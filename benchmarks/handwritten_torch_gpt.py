"""Hand-written baseline: a GPT trained the way nanoGPT's model.py and train.py do it, for
benchmarks/torch_gpt_vs_handwritten.py.

The model and loop follow nanoGPT (github.com/karpathy/nanoGPT) line by line where they apply: one fused
c_attn matmul for q, k, v, F.scaled_dot_product_attention, GELU, LayerNorm, weight tying, dropout modules
(rate 0), AdamW over two groups (decay on parameters of 2 or more dimensions) with `fused` only on CUDA,
the lr set by hand each iteration, GradScaler (disabled in float32), clip_grad_norm_, zero_grad(set_to_none),
`loss.item()` every `--log-interval` iterations, the next batch drawn (get_batch over a memmap of uint16
token ids, re-opened per batch) while the current one trains, DDP under torchrun with
`require_backward_grad_sync` on the last micro-step. What differs from nanoGPT is only what makes it the
same model and run as the spec: the sizes, no bias in the attention projections (bias in LayerNorm and the
MLP), the GELU's tanh approximation (`--gelu`), and the spec's schedule (linear warmup `lr*(t+1)/W`, then
cosine to 0 at `--lr-steps`). It computes in float32 (no TF32, no autocast), like the spec's program.

Each iteration's wall-clock time (nanoGPT's `t1 - t0`: everything the loop does, drawing the batch and
logging included) is printed at the end as one JSON line by rank 0, `{"step_ms": [...], "params": N}` (N
counts the tied embedding once).

    python benchmarks/handwritten_torch_gpt.py --data tokens.bin --steps 10
    torchrun --standalone --nproc-per-node 2 benchmarks/handwritten_torch_gpt.py --data tokens.bin --batch 16
"""

import argparse
import json
import math
import os
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads, but in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.attn_bias)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.attn_bias)
        # regularization
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        # causal self-attention; Self-attend: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.n_ff, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu)
        self.c_proj = nn.Linear(config.n_ff, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPTConfig:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # with weight tying when using torch.compile() some warnings get generated:
        self.transformer.wte.weight = self.lm_head.weight  # https://paperswithcode.com/method/weight-tying
        # init all weights
        self.apply(self._init_weights)
        # apply special scaled init to the residual projections, per GPT-2 paper
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=device)  # shape (t)
        # forward the GPT model itself
        tok_emb = self.transformer.wte(idx)  # token embeddings of shape (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # position embeddings of shape (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        # weight tensors in matmuls + embeddings decay, biases and layernorms don't
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        # Create AdamW optimizer and use the fused version if it is available (nanoGPT: on CUDA only)
        use_fused = device_type == "cuda"
        extra_args = dict(fused=True) if use_fused else dict()
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="uint16 token ids (nanoGPT's train.bin)")
    ap.add_argument("--steps", type=int, default=20, help="iterations to run")
    ap.add_argument("--batch", type=int, default=16, help="global batch (each rank takes batch / ranks)")
    ap.add_argument("--vocab-size", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=64, help="sequence length")
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-ff", type=int, default=512, help="MLP width")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--gelu", choices=["tanh", "none"], default="tanh")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.95))
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=5, help="warmup iterations of the lr schedule")
    ap.add_argument("--lr-steps", type=int, default=20, help="length of the lr schedule (the spec's steps)")
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--log-interval", type=int, default=1, help="loss.item() every this many iterations")
    ap.add_argument("--compile", action="store_true", help="torch.compile(model), as nanoGPT's default")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="compute dtype: bfloat16 runs forward and backward under torch.autocast, as nanoGPT's "
                    "default on GPUs (parameters and the optimizer stay float32)")
    args = ap.parse_args()

    # various inits, derived attributes, I/O setup
    ddp = int(os.environ.get("RANK", -1)) != -1  # is this a ddp run?
    if ddp:
        init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        ddp_rank = int(os.environ["RANK"])
        ddp_local_rank = int(os.environ["LOCAL_RANK"])
        ddp_world_size = int(os.environ["WORLD_SIZE"])
        device = f"cuda:{ddp_local_rank}" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
        master_process = ddp_rank == 0  # this process will do logging, checkpointing etc.
        seed_offset = ddp_rank  # each process gets a different seed
    else:
        master_process, seed_offset, ddp_world_size = True, 0, 1
        device = "cuda" if torch.cuda.is_available() else "cpu"
    batch_size = args.batch // ddp_world_size
    block_size = args.block_size
    torch.manual_seed(1337 + seed_offset)
    device_type = "cuda" if "cuda" in device else "cpu"  # for later use in torch.autocast
    # float32: no autocast; bfloat16: nanoGPT's autocast context
    ctx = nullcontext() if args.dtype == "float32" else torch.autocast(device_type, dtype=torch.bfloat16)

    def get_batch():
        # We recreate np.memmap every batch to avoid a memory leak, as per
        # https://stackoverflow.com/questions/45132940/numpy-memmap-memory-usage-want-to-iterate-once/61472122#61472122
        data = np.memmap(args.data, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy((data[i : i + block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix])
        if device_type == "cuda":
            # pin arrays x,y, which allows us to move them to GPU asynchronously (non_blocking=True)
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        else:
            x, y = x.to(device), y.to(device)
        return x, y

    config = GPTConfig(
        vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
        n_embd=args.n_embd, n_ff=args.n_ff, dropout=0.0, bias=True, attn_bias=False, gelu=args.gelu,
    )
    model = GPT(config)
    model.to(device)
    # initialize a GradScaler. If enabled=False scaler is a no-op
    scaler = torch.amp.GradScaler(device_type, enabled=False)
    optimizer = model.configure_optimizers(args.weight_decay, args.lr, tuple(args.betas), device_type)
    if args.compile:
        model = torch.compile(model)  # requires PyTorch 2.0
    if ddp:
        model = DDP(model, device_ids=[ddp_local_rank] if device_type == "cuda" else None)

    # learning rate decay scheduler (the spec's: linear warmup, then cosine to 0)
    def get_lr(it):
        if it < args.warmup:
            return args.lr * (it + 1) / args.warmup
        progress = min(1.0, (it - args.warmup) / max(1, args.lr_steps - args.warmup))
        return args.lr * 0.5 * (1.0 + math.cos(math.pi * progress))

    gradient_accumulation_steps = 1
    times = []
    X, Y = get_batch()  # fetch the very first batch
    t0 = time.perf_counter()
    for iter_num in range(args.steps):
        # determine and set the learning rate for this iteration
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        # forward backward update, with optional gradient accumulation to simulate larger batch size
        for micro_step in range(gradient_accumulation_steps):
            if ddp:
                # in DDP training we only need to sync gradients at the last micro step.
                model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
            with ctx:
                logits, loss = model(X, Y)
                loss = loss / gradient_accumulation_steps  # scale the loss to account for gradient accumulation
            # immediately async prefetch next batch while model is doing the forward pass on the GPU
            X, Y = get_batch()
            # backward pass, with gradient scaling if training in fp16
            scaler.scale(loss).backward()
        # clip the gradient
        if args.grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        # step the optimizer and scaler if training in fp16
        scaler.step(optimizer)
        scaler.update()
        # flush the gradients as soon as we can, no need for this memory anymore
        optimizer.zero_grad(set_to_none=True)
        # timing and logging
        t1 = time.perf_counter()
        dt = t1 - t0
        t0 = t1
        if iter_num % args.log_interval == 0 and master_process:
            # get loss as float. note: this is a CPU-GPU sync point
            # scale up to undo the division above, approximating the true total loss (exact would have been a sum)
            lossf = loss.item() * gradient_accumulation_steps
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms", flush=True)
        times.append(dt)
    if master_process:
        params = sum(p.numel() for p in (model.module if ddp else model).parameters())  # (tied: once)
        peak = torch.cuda.max_memory_allocated(device) if device_type == "cuda" else None
        print(json.dumps({"step_ms": [t * 1e3 for t in times], "params": params, "peak_bytes": peak}), flush=True)
    if ddp:
        destroy_process_group()


if __name__ == "__main__":
    main()
