"""Gradient compression in a generated DDP program, checked from the inside (tests/test_communication.py).

    python tests/communication_check.py OUT.json KIND=BUILD_DIR [KIND=BUILD_DIR...]   (KIND: fp16, bf16, powersgd)

For each build (the same model over `data`, one per compression), two spawned ranks import its train.py,
build the model as `main` does, and wrap it with its `replicate` and `compress_gradients`. Each rank then
takes a backward pass on its own samples without communication (`no_sync`: its local gradients) and one
with it (the hook's reduced gradients), counting the bytes every `dist.all_reduce` the hook calls sends.
Rank 0 writes per build: the bytes sent per synchronised backward pass (one per pass, in order), and for a
cast compression whether the reduced gradients equal the explicit cast reference bit for bit: each rank's
local gradient cast to the compression dtype and divided by the group size, summed in that dtype in rank
order, cast back to float32.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
SYNCED_PASSES = 3  # PowerSGD compresses from its start step (2 in the tests) on: the third pass


def _load(build: str):
    from program_import import load_program  # (this script's directory is on sys.path)

    return load_program(build)


def _batch(mod, rank: int):
    """This rank's samples (its own, so the ranks' gradients differ): synthetic features and classes."""
    g = torch.Generator().manual_seed(100 + rank)
    n = mod.MICRO_BATCH // WORLD
    features = mod.PARAMS["fc1.weight"][0][0]
    classes = mod.PARAMS["head.weight"][0][1]
    return torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g, dtype=torch.int32)


def compressed_ddp(mod):
    """The build's model as its main() builds it, wrapped by its `replicate` and `compress_gradients`:
    (device, model, DDP wrapper). (benchmarks/controls.py uses it too.)"""
    device, mesh, _ = mod.setup()
    with torch.device("meta"):
        model = mod.Model()
    model.to_empty(device=device)
    mod.fill_model(model, mod.initial_params(mod.PARAMS, 0), 0)
    ddp = mod.replicate(model, mesh)
    mod.compress_gradients(ddp)
    return device, model, ddp


def _check(mod, rank: int, kind: str) -> dict:
    _, model, ddp = compressed_ddp(mod)
    params = list(model.parameters())
    x, y = _batch(mod, rank)

    with ddp.no_sync():  # this rank's own gradients, no communication
        ddp(x, y).backward()
    local = [p.grad.detach().clone() for p in params]

    sent: list[int] = []
    plain = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        sent.append(tensor.numel() * tensor.element_size())
        return plain(tensor, *args, **kwargs)

    passes = []
    for i in range(SYNCED_PASSES):
        for p in params:
            p.grad.zero_()  # (in place: the gradients are views of DDP's buckets)
        sent.clear()
        dist.all_reduce = counting
        ddp(x, y).backward()
        dist.all_reduce = plain
        passes.append(sum(sent))
        if i == 0:
            reduced = [p.grad.detach().clone() for p in params]
    out = {"bytes": passes, "numel": sum(p.numel() for p in params)}
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(kind)
    if dtype is not None:
        equal = True
        worst = 0.0
        for g, r in zip(local, reduced):
            every = [torch.empty_like(g) for _ in range(WORLD)]
            dist.all_gather(every, g)
            acc = torch.zeros_like(g, dtype=dtype)
            for h in every:  # the hook: cast, divide by the group size, sum in that dtype, cast back
                acc = acc + h.to(dtype).div_(WORLD)
            ref = acc.to(g.dtype)
            equal &= torch.equal(ref, r)
            worst = max(worst, (ref - r).abs().max().item())
        # how far the compressed reduction is from the float32 average (so the check is not vacuous)
        exact = [torch.zeros_like(g) for g in local]
        for g, e in zip(local, exact):
            every = [torch.empty_like(g) for _ in range(WORLD)]
            dist.all_gather(every, g)
            e.copy_(sum(every) / WORLD)
        out.update(equal=bool(equal), max_diff=worst,
                   diff_from_float32=max((e - r).abs().max().item() for e, r in zip(exact, reduced)))
    return out


def _rank(rank: int, ports: list[int], builds: list[str], out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD),
                      MASTER_ADDR="127.0.0.1")
    torch.set_num_threads(1)
    results = {}
    for port, job in zip(ports, builds):
        kind, build = job.split("=", 1)
        os.environ["MASTER_PORT"] = str(port)  # each build's setup starts its own process group
        results[kind] = _check(_load(build), rank, kind)
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    out_file, *build_dirs = sys.argv[1:]
    mp.spawn(_rank, args=([_port() for _ in build_dirs], build_dirs, out_file), nprocs=WORLD)
