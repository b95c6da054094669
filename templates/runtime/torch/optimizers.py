"""The optimizer's update kernel and the global gradient norm (clipped to the spec's clip_grad_norm) over
gradients that may be plain tensors or DTensors on different meshes."""

from collections import defaultdict

import torch
import torch.distributed as dist


def update_kernel(params, sgd=False):
    """How the optimizer runs its update (its `fused` and `foreach`; set again on --resume, as a checkpoint
    carries its writer's choice): torch's fused kernel, one pass over the memory of all parameters of a
    dtype (CPU and CUDA), for plain tensors and DTensors alike (`sgd`: for plain tensors; its foreach
    kernels for DTensors), but for a mix of both (tensor or expert parallelism without FSDP2 leaves some
    parameters plain) one parameter at a time."""
    dtensors = {hasattr(p, "placements") for p in params}
    if len(dtensors) > 1:
        return {"fused": False, "foreach": False}
    if sgd:
        return {"fused": dtensors == {False}, "foreach": dtensors == {True}}
    return {"fused": True, "foreach": False}


@torch.no_grad()
def clip_grad_norm(params, max_norm, pipe_group=None, copies=()):
    """The global L2 norm of all gradients (returned); with `max_norm` (the spec's clip_grad_norm; None:
    it clips none) every gradient is scaled by min(1, max_norm / (norm + 1e-6)).

    With a process group, gradients may be DTensors on *different* meshes (tensor-parallel weights on
    (data, fsdp, tensor), the rest on the data axes, or plain tensors); torch's clip_grad_norm_ stacks every
    per-tensor norm and fails on mixed meshes. So each mesh's group is reduced to one full scalar first
    (full_tensor() sums the partial norms across ranks), then the plain scalars are combined.
    `pipe_group`: the pipe ranks whose stages' norms add up to the whole; `copies`: the ids of the tied
    tables' copies on this rank, clipped but left out of the norm (their table's pipe rank counts the
    summed gradient once).
    """
    if not dist.is_initialized():
        grads = [p.grad for p in params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, 2.0).float()
        if max_norm:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total
    from torch.distributed.tensor import DTensor

    groups = defaultdict(list)  # insertion order: the same on every rank
    for p in params:
        if p.grad is not None:
            groups[p.grad.device_mesh if isinstance(p.grad, DTensor) else None].append(p)
    squares = []
    for group in groups.values():
        # foreach kernels: one call per mesh (torch picks them itself for plain tensors only)
        counted = [p.grad for p in group if id(p) not in copies]
        if (
            not counted
        ):  # (the same on every rank of the mesh: a stage's ranks hold the same copies)
            squares.append(torch.zeros((), device=group[0].grad.device))
            continue
        n = torch.nn.utils.get_total_norm(counted, 2.0, foreach=True)
        squares.append((n.full_tensor() if isinstance(n, DTensor) else n).float() ** 2)
    if pipe_group is not None:
        total = torch.stack(squares).sum()
        dist.all_reduce(total, group=pipe_group)  # over the stages of the other pipe ranks
        total = total.sqrt()
    else:
        total = torch.stack(squares).sum().sqrt()
    if max_norm:
        for group in groups.values():  # one mesh at a time: foreach ops need a common mesh
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
    return total
