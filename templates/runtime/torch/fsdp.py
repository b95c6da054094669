"""FSDP2 on gloo (CPU): its all-gather and reduce-scatter without gloo's full-size staging buffers, so that
a sharded program keeps less on the host."""

import torch
import torch.distributed as dist


class GlooAllGather:
    """FSDP2's all-gather on gloo (CPU), into FSDP2's output buffer itself: each rank's slice broadcast from
    it. gloo's all_gather_into_tensor gathers into a buffer of its own the size of the output first."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        # (input_tensor is this rank's slice of output_tensor: FSDP2 copies the shards in there)
        for i, part in enumerate(output_tensor.view(group.size(), -1)):
            dist.broadcast(part, src=dist.get_global_rank(group, i), group=group)
        # done (None returned): FSDP2 waits on nothing


class GlooReduceScatter:
    """FSDP2's reduce-scatter on gloo (CPU): an all-reduce in place on FSDP2's input buffer, then this rank's
    slice. gloo's reduce_scatter_tensor copies its input into a buffer of the same size first (and sums the
    same way: the same bits); the input buffer, which FSDP2 keeps until the next block's reduce-scatter, is
    released as soon as this one is done."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        dist.all_reduce(input_tensor, op=op, group=group)
        output_tensor.copy_(input_tensor.view(group.size(), -1)[group.rank()])
        input_tensor.untyped_storage().resize_(0)


def gloo_collectives(model, prefetch=False):
    """On CPU (gloo), FSDP2 keeps less on the host: its collectives without gloo's full-size staging
    buffers (GlooAllGather, GlooReduceScatter), and unless the spec asks for `prefetch`
    (communication.prefetch), no backward prefetch (a gloo all-gather is synchronous: prefetching overlaps
    nothing, and only holds the next block's gathered parameters longer)."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule) and hasattr(m, "set_custom_reduce_scatter"):  # torch >= 2.8
            m.set_custom_all_gather(GlooAllGather())
            m.set_custom_reduce_scatter(GlooReduceScatter())
        if isinstance(m, FSDPModule) and not prefetch:
            m.set_modules_to_backward_prefetch([])
