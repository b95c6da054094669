"""Hand-written baseline: gpt-tiny trained the way one would write it by hand (nanoGPT style).

The same model and training step as the program mithril-spec generates for gpt-tiny (vocab 256,
seq 64, d 128, 4 heads, ff 512, 4 layers, tied lm_head, AdamW + clip 1.0), without the
generated program's conventions (numpy init, canonical export, metrics, checkpoints). It times
N optimizer steps after some warm-up steps and prints ms/step, to compare against the
`step_time_s` the generated program writes to its metrics file.

    python benchmarks/handwritten_torch_gpt.py --steps 20                     # 1 process
    python benchmarks/handwritten_torch_gpt.py --nproc 4 --parallel fsdp      # 4 gloo ranks
    torchrun --nproc-per-node 4 benchmarks/handwritten_torch_gpt.py --parallel ddp
"""

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, D, HEADS, FF, LAYERS = 256, 64, 128, 4, 512, 4


class Block(nn.Module):
    def __init__(self, fused_qkv):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.fused = fused_qkv
        if fused_qkv:  # nanoGPT's c_attn: one matmul for q, k, v
            self.qkv = nn.Linear(D, 3 * D, bias=False)
        else:
            self.q, self.k, self.v = (nn.Linear(D, D, bias=False) for _ in range(3))
        self.o = nn.Linear(D, D, bias=False)
        self.fc, self.proj = nn.Linear(D, FF), nn.Linear(FF, D)

    def attn(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split(D, dim=2) if self.fused else (self.q(x), self.k(x), self.v(x))
        q, k, v = (t.view(B, T, HEADS, D // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, fused_qkv=False):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Parameter(torch.zeros(SEQ, D))
        self.blocks = nn.ModuleList(Block(fused_qkv) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D)
        for n, p in self.named_parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, std=0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def worker(rank, world, port, args):
    distributed = world > 1
    if distributed:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(0)
    model = GPT(args.fused_qkv)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else torch.autocast("cpu", enabled=False)
    if distributed and args.parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.bf16 else MixedPrecisionPolicy()
        for b in model.blocks:
            fully_shard(b, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        amp = torch.autocast("cpu", enabled=False)
    elif distributed:
        model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    if args.compile:
        for b in (model.module if hasattr(model, "module") else model).blocks:
            b.compile()
    params = list(model.parameters())
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
         {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
        lr=3e-4, betas=(0.9, 0.95))
    local_batch = args.batch // world
    g = torch.Generator().manual_seed(1 + rank)
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randint(0, VOCAB, (local_batch, SEQ), generator=g)
        y = torch.randint(0, VOCAB, (local_batch, SEQ), generator=g)
        t0 = time.perf_counter()
        with amp:
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # DTensor grads on one mesh: stock clipping works
        opt.step()
        opt.zero_grad(set_to_none=True)
        if distributed:
            dist.all_reduce(loss.detach())  # like the real loop, report a global loss each step
        loss.item()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        ms = [t * 1000 for t in times]
        print(f"handwritten gpt-tiny: {world} rank(s), {args.parallel if distributed else 'single'}, "
              f"{'bf16' if args.bf16 else 'fp32'}{', compiled' if args.compile else ''}, batch {args.batch}: "
              f"{statistics.median(ms):.1f} ms/step median, {statistics.mean(ms):.1f} mean over {len(ms)} steps")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
        os._exit(0)  # avoid the gloo/FSDP2 abort at interpreter exit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="global batch")
    ap.add_argument("--nproc", type=int, default=1, help="ranks to spawn (ignored under torchrun)")
    ap.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--fused-qkv", action="store_true", help="nanoGPT's single qkv matmul")
    args = ap.parse_args()
    if "WORLD_SIZE" in os.environ:  # torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, args)
    elif args.nproc > 1:
        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(worker, args=(args.nproc, port, args), nprocs=args.nproc)
    else:
        worker(0, 1, None, args)


if __name__ == "__main__":
    main()
