"""Parameters in a torch program: the part of a (possibly sharded) tensor this rank holds, filling the
model's shards from canonical values, and writing parameters or gradients whole in canonical layout
(nn.Linear weights, which torch keeps as [out, in], transposed back to the canonical [in, out])."""

import numpy as np
import torch
import torch.distributed as dist

from runtime.torch.ranks import is_first


def local_part(t):
    """This rank's part of a tensor: its local shard for a DTensor (autograd flows back through it)."""
    return t.to_local() if hasattr(t, "to_local") else t


def local_box(p, mesh, rank=None):
    """The shape and offset (torch layout) of the part of parameter `p` that `rank` (default: this one)
    holds: a DTensor's shard, from its placements over its mesh (whose axes are `mesh`'s, by name: axis ->
    size), else the whole. Computed without touching the data (the model may be on the meta device)."""
    if not hasattr(p, "placements"):  # a plain tensor, whole
        return tuple(p.shape), (0,) * p.ndim
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    at = dict(
        zip(mesh, np.unravel_index(dist.get_rank() if rank is None else rank, tuple(mesh.values())))
    )
    m = p.device_mesh
    where = [int(at[axis]) for axis in m.mesh_dim_names]
    return _compute_local_shape_and_global_offset(p.shape, m.shape, where, p.placements)


def canonical(name, tensor, transposed):
    """A whole parameter as numpy in canonical layout: nn.Linear weights (`transposed`) transposed back."""
    return (tensor.T if name in transposed else tensor).detach().float().cpu().numpy()


@torch.no_grad()
def fill_params(model, source, mesh, transposed):
    """Every parameter's local part (its shard on this rank, or the whole), in place, from `source`
    (canonical name -> a lazy tensor or an array, canonical layout): only the slices this rank holds are
    computed or read. `transposed`: the names of the nn.Linear weights, whose canonical layout is the
    transpose of torch's."""
    for name, p in model.named_parameters():
        shape, offset = local_box(p, mesh)
        box = tuple(slice(o, o + n) for o, n in zip(offset, shape))  # torch layout
        if name in transposed:  # the same block of the canonical [in, out] layout
            values = np.asarray(source[name][box[::-1]], dtype=np.float32).T
        else:
            values = np.asarray(source[name][box], dtype=np.float32)
        local_part(p).copy_(torch.from_numpy(np.ascontiguousarray(values)))


def grads_of(named):
    """(canonical name, gradient) of (canonical name, the tensor whose .grad the optimizer reads: the
    parameter or its ZeRO / master copy). A parameter nothing reached has no gradient: zeros stand in."""
    return ((n, p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in named)


@torch.no_grad()
def export_tensors(named, path, names, transposed, save, pipe_group=None):
    """(canonical name, tensor) pairs in named_parameters order, whole, canonical layout, saved by the first
    rank as `save(path, {name: array})` in the order of `names`. With a process group, a collective: every
    rank calls it, in the same order; one tensor at a time, full_tensor() gathers its shards and the first
    rank keeps it. With `pipe_group` (pipeline stages), the first rank of each stage keeps its stage's
    tensors, and the pipe ranks send theirs to the first."""
    wholes = ((n, p.full_tensor() if hasattr(p, "full_tensor") else p) for n, p in named)
    if pipe_group is None:
        # every rank gathers each in turn (full_tensor is a collective); the first keeps them
        arrays = {n: canonical(n, whole, transposed) for n, whole in wholes if is_first()}
        if is_first():
            save(path, {name: arrays[name] for name in names})
        return
    # the pipe ranks of the first rank's coordinates
    mine = 0 in dist.get_process_group_ranks(pipe_group)
    arrays = {n: canonical(n, whole, transposed) for n, whole in wholes if mine}
    parts = [None] * pipe_group.size() if dist.get_rank(pipe_group) == 0 else None
    dist.gather_object(arrays, parts, group=pipe_group, group_dst=0)
    if is_first():
        arrays = {k: v for part in parts for k, v in part.items()}
        save(path, {name: arrays[name] for name in names})
