"""What each rank holds (printed after the first step, docs/program.md "Memory report") and what --dry-run
prints: the mesh, every parameter's layout and its part on this rank, and the bytes each rank would hold."""

import json

import numpy as np
import torch

from runtime.torch.params import local_box
from runtime.torch.ranks import all_ranks, log


def local_bytes(t):
    """Bytes of this rank's part of a tensor (a DTensor's local shard, else the whole)."""
    return (t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size()


def held_bytes(model, optimizer, shards=None, master=False):
    """What this rank holds: parameters, gradients, optimizer state and buffers. The optimizer's slot
    tensors only (exp_avg, exp_avg_sq / momentum_buffer), not its scalar `step`: the planner counts the
    same (docs/program.md "Memory report"). With `shards` (ZeRO or master weights: what the optimizer steps
    on) the gradients are those it keeps, and with `master` the float32 master copies count as optimizer
    state."""
    params = list(model.parameters())
    slots = [
        v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.ndim > 0
    ]
    if shards is not None and master:
        slots += shards.leaves  # the float32 copies the optimizer updates
    grads = (
        [p.grad for p in params if p.grad is not None]
        if shards is None
        else shards.held_grads(model)
    )
    return {
        "params": sum(local_bytes(p) for p in params),
        "grads": sum(local_bytes(g) for g in grads),
        "optimizer": sum(local_bytes(v) for v in slots),
        "buffers": sum(local_bytes(b) for b in model.buffers()),
    }


def report_memory(model, optimizer, planned, resumed=None, start=0, shards=None, master=False):
    """After the first step (gradients and optimizer state exist now): what every rank holds (held_bytes),
    printed by rank 0 beside `planned`, what the planner predicts per rank; a run `resumed` from a
    checkpoint says so first (a collective)."""
    every = all_ranks(held_bytes(model, optimizer, shards, master))
    report = {"device0": every[0], "ranks": every, "planned": planned}
    note = f"resumed from {resumed} at step {start}\n" if resumed else ""
    log(f"{note}memory {json.dumps(report)}")


def rank_bytes(
    model,
    mesh,
    slots,
    owns=None,
    split_buffers=False,
    state_element=None,
    zero_dims=None,
    split_grads=False,
):
    """--dry-run: the bytes each rank of `mesh` (axis -> size) would hold, from the layouts of the model on
    the meta device: its parameter shards, gradients like their parameters and `slots` optimizer tensors
    each, and its buffers (whole; `split_buffers`: their shards). `owns(name, rank)`: whether a rank holds
    a parameter or buffer at all (pipeline stages). With `state_element` (ZeRO or master weights: bytes of
    optimizer state per element of a parameter) the optimizer state is counted per element, over the ZeRO
    slice (`zero_dims`: parameter -> the dimension split over `data`, None where none is) and, with
    `split_grads` (ZeRO-2), so are the gradients. A dict per rank."""
    named = list(model.named_parameters())

    def mine(name, r):
        return owns is None or owns(name, r)

    def numel(t, r):
        return int(np.prod(local_box(t, mesh, r)[0]))

    def state_numel(name, p, r):  # elements of a parameter's optimizer state (and ZeRO-2 gradient)
        n = numel(p, r)
        return n // mesh["data"] if zero_dims is not None and zero_dims[name] is not None else n

    out = []
    for r in range(int(np.prod(tuple(mesh.values())))):
        params = sum(numel(p, r) * p.element_size() for n, p in named if mine(n, r))
        buffers = sum(
            (numel(b, r) if split_buffers else b.numel()) * b.element_size()
            for n, b in model.named_buffers()
            if mine(n, r)
        )
        grads, optimizer = params, slots * params
        if state_element is not None:
            optimizer = sum(state_numel(n, p, r) * state_element for n, p in named if mine(n, r))
            if split_grads:
                grads = sum(state_numel(n, p, r) * p.element_size() for n, p in named if mine(n, r))
        out.append({"params": params, "grads": grads, "optimizer": optimizer, "buffers": buffers})
    return out


def print_layouts(model, mesh, batch_axes, table, replicated, ranks, planned):
    """--dry-run's report: the mesh (axis -> size) and `batch_axes`; every parameter's canonical shape
    (`table`: PARAMS), torch shape, its shape on this rank (local_box) and its placement over the mesh
    (`replicated`: what a parameter no mesh axis splits is called); then `ranks`, the bytes each rank would
    hold (a dict per rank), and `planned`, what the planner predicts per rank."""
    world = len(ranks)
    log(
        f"mesh: {', '.join(f'{a}={k}' for a, k in mesh.items())} ({world} rank(s)); batch over "
        f"{batch_axes or 'no axis'}",
        f"{'parameter':32s} {'canonical':>12s} {'torch':>12s} {'this rank':>12s}  placement",
        *(
            f"{name:32s} {list(table[name][0])!s:>12s} {list(p.shape)!s:>12s} "
            f"{list(local_box(p, mesh)[0])!s:>12s}  "
            + (
                f"{','.join(p.device_mesh.mesh_dim_names)}: {', '.join(map(str, p.placements))}"
                if hasattr(p, "placements")
                else replicated
            )
            for name, p in model.named_parameters()
        ),
        *(f"rank {r} bytes: " + json.dumps(held) for r, held in enumerate(ranks)),
        f"planned per rank: {json.dumps(planned)}",
        sep="\n",
    )
