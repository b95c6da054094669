"""Measures this machine for `mithril-spec calibrate --target torch` (run as a script, never imported).

Launches `--processes` ranks as the generated PyTorch programs run (one process per device, gloo on CPU,
NCCL on GPUs; on CPU each rank takes cores / ranks threads) and, with every rank working at once, times:
matrix multiplications per dtype, a large copy (memory bandwidth), a layer's element-wise kernels, on CPU a
reference decoder block forward and backward (mithril_spec/probe.py), a chain of tiny operations (the fixed
cost of one kernel: dispatch and launch) and all-reduces at several sizes over groups of every size a
mesh axis can have, each after a burst of compute (the ring's bandwidth and per-step latency), and whether an
all-reduce issued beside a burst, as the programs issue their gradient reductions, overlaps it. Rank 0
prints one JSON object: the raw timings (seconds)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, budget: float, device, world: int) -> float:
    """Seconds per call of `fn` with every rank calling it at once: the slowest rank's pace (barriers
    around the window), the median of three windows of about `budget` seconds each (on a shared machine,
    the load of the moment, as a program's median step sees it)."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    repeats = torch.tensor([max(1, int(budget / max(time.perf_counter() - t0, 1e-9)))], device=device)  # (NCCL)
    if world > 1:  # every rank repeats as often as rank 0 (its time, its budget), or the collectives would not pair up
        dist.broadcast(repeats, 0)
    repeats = int(repeats)
    median = sorted(window(fn, repeats, device, world) for _ in range(3))[1]
    if world > 1:  # the slowest rank's figure on every rank: a decision taken on it (a slow dtype's matmuls stop
        # at the first shape over the budget) is the same on every rank, or their collectives would not pair up
        agreed = torch.tensor([median], dtype=torch.float64, device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        median = float(agreed)
    return median


def window(fn, repeats: int, device, world: int) -> float:
    """Seconds per call of `fn` over one window of `repeats` calls, every rank starting and ending together."""
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    if world > 1:
        dist.barrier()
    return (time.perf_counter() - t0) / repeats


def interleaved(fns, budget: float, device, world: int, rounds: int = 5) -> list[float]:
    """Seconds per call of each of `fns` (every rank calling it at once), their windows taken in turn, one of
    each per round, so that all see the load of the same moments (a comparison of timings taken one after the
    other on a shared machine compares its loads): the median over the rounds, the slowest rank's."""
    per_call = max(timed(fn, budget / 4, device, world) for fn in fns)
    repeats = max(2, int(budget / max(per_call, 1e-9)))  # (every rank the same: the timings are agreed)
    windows = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            windows[i].append(window(fn, repeats, device, world))
    medians = torch.tensor([sorted(w)[rounds // 2] for w in windows], dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    return [float(x) for x in medians]


def measure(rank: int, world: int, port: int, cfg: dict, out: str) -> None:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:  # as the generated programs do: ranks on one host share its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, device_id=device if cuda else None)
        # the groups a mesh axis can form: consecutive ranks in groups of every size that divides the ranks,
        # created by every rank in the same order before any other traffic (torch.distributed requires it)
        groups = {size: dist.new_subgroups(size)[0] for size in range(2, world) if world % size == 0}
        groups[world] = dist.group.WORLD
        alone = dist.new_subgroups(1)[0]  # each rank by itself: a mesh whose DTensors send nothing
    res: dict = {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "platform": device.type,
                 "processes": world, "threads": torch.get_num_threads(), "matmul": {}, "allreduce": [],
                 # bytes one device holds: the GPU's memory, or the host's shared by the ranks
                 "memory_bytes": torch.cuda.get_device_properties(device).total_memory if cuda else
                 os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // world}
    # matmuls: [m, k] x [k, n] per dtype, at each shape given
    # an accelerator also gets large products (its small ones are bound by the launch, not the FLOPs)
    shapes = cfg["matmul_shapes"] + (cfg["accelerator_shapes"] if cuda else [])
    for dtype in cfg["dtypes"]:
        rows = []
        for m, k, n in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
            a = torch.randn(m, k, device=device).to(getattr(torch, dtype))
            b = torch.randn(k, n, device=device).to(getattr(torch, dtype))
            rows.append([m, k, n, timed(lambda a=a, b=b: torch.mm(a, b), cfg["budget_s"], device, world)])
            if rows[-1][-1] > 10 * cfg["budget_s"]:
                break  # a dtype this device runs slowly (emulated): larger shapes would take minutes
        res["matmul"][dtype] = rows
    # memory bandwidth: a copy reads and writes every byte
    n = cfg["copy_bytes"] // 4
    src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
    res["copy"] = [cfg["copy_bytes"], timed(lambda: dst.copy_(src), cfg["budget_s"], device, world)]
    # element-wise kernels as a layer runs them: on an activation-sized [tokens, features] float32 tensor, a
    # layer norm, a gelu (tanh), a softmax and a residual add, forward and backward under autograd. A CPU
    # runs these slower than a copy (transcendentals, several passes, one kernel each): the rate the model's
    # element-wise term needs. Raw: [bytes of one kernel's output, kernels, seconds of forward and backward]
    rows, cols = cfg["elementwise_shape"]
    act = torch.randn(rows, cols, device=device, requires_grad=True)
    gain = torch.ones(cols, device=device, requires_grad=True)
    shift = torch.zeros(cols, device=device, requires_grad=True)
    seed = torch.ones(rows, cols, device=device)

    def elementwise():
        y = torch.nn.functional.layer_norm(act, (cols,), gain, shift)
        y = torch.nn.functional.gelu(y, approximate="tanh")
        y = torch.softmax(y, dim=-1)
        (y + act).backward(seed)

    res["elementwise"] = [rows * cols * 4, 4, timed(elementwise, cfg["budget_s"], device, world)]
    # a reference layer (calibrate.PROBE): a pre-norm decoder block, forward and backward under autograd, as the
    # programs' modules run it: layer norm, q, k, v and o projections, causal scaled_dot_product_attention,
    # residual add, layer norm, fc, gelu (tanh), proj with biases, residual add, a mean-square loss; the
    # gradients set to None before each pass (as the programs' zero_grad). Raw: [batch, seq, dim, heads, ff,
    # seconds per forward and backward]
    if not cuda:
        F = torch.nn.functional
        b, s, d, heads, ff = cfg["probe"]

        def linear(i, o, bias=False):
            return torch.nn.Linear(i, o, bias=bias, device=device)

        class Attention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.q, self.k, self.v, self.o = (linear(d, d) for _ in range(4))

            def forward(self, h):  # (run tensor-parallel, q, k and v hold a rank's heads: the views take its width)
                q, k, v = (w(h).view(b, s, -1, d // heads).transpose(1, 2) for w in (self.q, self.k, self.v))
                return self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1, self.ln2 = torch.nn.LayerNorm(d, device=device), torch.nn.LayerNorm(d, device=device)
                self.attn, self.fc, self.proj = Attention(), linear(d, ff, bias=True), linear(ff, d, bias=True)

            def forward(self, x):
                x = x + self.attn(self.ln1(x))
                return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

        xin, target = torch.randn(b, s, d, device=device, requires_grad=True), torch.randn(b, s, d, device=device)

        def passes(block):
            def one():
                block.zero_grad(set_to_none=True)
                xin.grad = None
                F.mse_loss(block(xin), target).backward()
            return one

        # (windows of 5 budgets: a block takes some 100-250 ms here, and its time sets the efficiency, the
        # largest term of a CPU step: several passes per window, not one)
        if world % 2:
            res["probe"] = [*cfg["probe"], timed(passes(Block()), 5 * cfg["budget_s"], device, world)]
        else:
            # and the block run as the programs run a tensor-parallel block over a pair of ranks (every pair at
            # once): q, k, v and fc column-wise, o and proj row-wise, as DTensor modules, the attention's input
            # one replicated DTensor (its input gradient all-reduced once, not once per projection): four
            # all-reduces over the pair. What it takes beyond the model's terms for it (matmuls, element-wise
            # traffic, kernels, collectives) is the sharded-tensor layers' fixed cost on this machine
            # (mithril_spec/probe.py). The two blocks are timed in turn: the efficiency the first sets and the
            # cost the second sets then see the load of the same moments. Raw: [batch, seq, dim, heads, ff,
            # ranks, seconds per forward and backward]
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.tensor import Replicate
            from torch.distributed.tensor.parallel import (
                ColwiseParallel,
                PrepareModuleInput,
                RowwiseParallel,
                parallelize_module,
            )

            pair = Block()
            one = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                     use_local_output=False)
            parallelize_module(pair, DeviceMesh.from_group(groups[2], device.type),
                               {"attn": one, **{w: ColwiseParallel() for w in ("attn.q", "attn.k", "attn.v", "fc")},
                                **{w: RowwiseParallel() for w in ("attn.o", "proj")}})
            whole, split = interleaved([passes(Block()), passes(pair)], 5 * cfg["budget_s"], device, world)
            res["probe"], res["probe_tensor"] = [*cfg["probe"], whole], [*cfg["probe"], 2, split]
    # the fixed cost of a layer's kernel: a chain of tiny layers (8 features), forward and backward as
    # autograd runs them; a layer is 3 kernels (forward; backward: input and weight gradients)
    chain = cfg["tiny_ops"]
    weights = [torch.randn(8, 8, device=device, requires_grad=True) for _ in range(chain)]
    x = torch.randn(8, 8, device=device)

    def tiny():
        y = x
        for w in weights:
            y = torch.tanh(y @ w)
        y.sum().backward()

    res["tiny_op"] = timed(tiny, cfg["budget_s"], device, world) / (3 * chain)
    if world > 1:
        # the fixed cost of a tensor-parallel layer beyond its kernels: the programs run such a layer as a
        # DTensor module (parallelize_module), whose every op goes through DTensor's dispatch in Python (sharding
        # propagation, wrapping and unwrapping local shards, redistributing partial sums). The same chain of tiny
        # linear layers, forward and backward, plain and as DTensor modules over a mesh of this rank alone
        # (nothing is sent: the collectives are costed on their own), two column-wise for each row-wise one, as
        # a transformer block's (q, k, v and o; fc and proj), timed in turn. Raw: [plain, DTensor, layers] (s)
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        def linears():
            torch.manual_seed(0)
            return torch.nn.Sequential(*[torch.nn.Linear(8, 8, device=device) for _ in range(chain)])

        plain, sharded = linears(), linears()
        parallelize_module(sharded, DeviceMesh.from_group(alone, device.type),
                           {str(i): RowwiseParallel() if i % 3 == 2 else ColwiseParallel() for i in range(chain)})
        res["sharded_layer"] = [*interleaved([lambda: plain(x).sum().backward(),
                                              lambda: sharded(x).sum().backward()], cfg["budget_s"], device, world),
                                chain]
        # all-reduces as a training step meets them: each after a burst of compute on every rank (a matmul of
        # `burst_shape`), so that ranks arrive at it out of step, as they do between a program's layers
        # (on CPU, ranks time-share the cores: a rank waits for a partner that is descheduled), over each
        # group size (pairs ... all). What is timed is the time each rank spends inside the all-reduce (its
        # wait for the group, then the transfer), the mean over ranks and calls, the median of three windows
        m, k, n = cfg["burst_shape"]
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        burst = timed(lambda: torch.mm(a, b), cfg["budget_s"], device, world)
        repeats = torch.tensor([max(10, int(cfg["budget_s"] / max(burst, 1e-9)))], device=device)
        dist.broadcast(repeats, 0)  # every rank calls as often as rank 0
        for size, group in groups.items():
            for nbytes in cfg["allreduce_bytes"]:
                buf = torch.zeros(max(1, nbytes // 4), device=device)
                windows = []
                for _ in range(3):
                    inside = 0.0
                    dist.barrier()
                    for _ in range(int(repeats)):
                        torch.mm(a, b)
                        sync(device)
                        t0 = time.perf_counter()
                        dist.all_reduce(buf, group=group)
                        sync(device)
                        inside += time.perf_counter() - t0
                    total = torch.tensor([inside], dtype=torch.float64, device=device)
                    dist.all_reduce(total)
                    windows.append(float(total) / world / int(repeats))
                res["allreduce"].append([nbytes, sorted(windows)[1], size])
        # whether a collective overlaps compute on this device, issued as the programs issue their data-parallel
        # reductions (FSDP2: a blocking `dist.all_reduce` inside the device's side-stream context; on a GPU it is
        # queued on that stream and returns, on CPU, which has no streams, the calling thread waits for it): a
        # burst with the largest all-reduce over all ranks issued on a side stream just before it, against the
        # two one after the other. Raw: [burst alone, burst then all-reduce, all-reduce beside the burst]
        handle = torch.cuda if cuda else torch.cpu
        side = handle.Stream()
        buf = torch.zeros(max(1, max(cfg["allreduce_bytes"]) // 4), device=device)

        def apart():
            torch.mm(a, b)
            dist.all_reduce(buf)

        def beside():
            with handle.stream(side):
                dist.all_reduce(buf)
            torch.mm(a, b)

        res["overlap"] = interleaved([lambda: torch.mm(a, b), apart, beside], cfg["budget_s"], device, world)
        dist.barrier()
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(res, f)
    if world > 1:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--config", required=True, help="JSON: what to measure (mithril_spec/calibrate.py)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = json.loads(args.config)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    world = args.processes
    if torch.cuda.is_available() and torch.cuda.device_count() < world:
        print(f"error: {world} processes but {torch.cuda.device_count()} GPU(s)", file=sys.stderr)
        sys.exit(2)
    if world == 1:
        measure(0, 1, 0, cfg, args.out)
    else:
        mp.spawn(measure, args=(world, free_port(), cfg, args.out), nprocs=world, join=True)


if __name__ == "__main__":
    main()
