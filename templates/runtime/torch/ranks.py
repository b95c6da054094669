"""The processes and devices of a torch program: rank 0's output, stopping with exit code 2, the launch
checked against the mesh, the device, the process group and the device mesh, and the collectives of a
few numbers every rank calls."""

import logging
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

from runtime.errors import require
from runtime.processes import keep_host_memory_compact, keep_host_memory_mapped


def is_first():
    return int(os.environ.get("RANK", "0")) == 0


def log(*args, **kwargs):
    """Rank 0 prints; the others stay quiet."""
    if is_first():
        print(*args, **kwargs, flush=True)


def refuse(refusal):
    """Stops with exit code 2 and the Refusal's one line (runtime/errors.py): every rank reaches the same
    verdict, so every rank stops, and rank 0 says why; a `local` verdict (about this rank's own samples) is
    said by the rank that reaches it. Once the process group exists, its teardown is skipped (see shutdown)."""
    if refusal.local or is_first():
        print(f"error: {refusal}", file=sys.stderr, flush=True)
    else:
        # torchrun stops every rank at the first exit: the others wait a moment, so that rank 0, which
        # reaches the same verdict, is not stopped before it has said why
        time.sleep(3)
    (os._exit if dist.is_initialized() else sys.exit)(2)


def start_ranks(mesh, batch_axes, tf32, dry_run=False, sharded=False, view_outputs=False):
    """Check the launch against the mesh (axis -> size) before anything else, then the device and, with more
    than one rank, the process group and the device mesh. `tf32`: float32 matmuls in TensorFloat-32 on GPUs
    (None: the compute dtype is not float32, the defaults stay); `sharded`: parameters sharded over fsdp
    (the host memory kept compact, else kept mapped); `view_outputs`: FSDP2's warning about a block that
    hands back a view silenced. --dry-run in one plain process (no torchrun) stands in for the whole mesh
    with a fake process group: rank 0 of the mesh, whose collectives do nothing (the dry run runs none).
    Returns the device, the device mesh (None for one rank) and this rank's data shard: its index over
    `batch_axes` (the other ranks share it)."""
    ranks = 1
    for n in mesh.values():
        ranks *= n
    world = int(os.environ.get("WORLD_SIZE", "1"))
    fake = ranks > 1 and dry_run and world == 1
    script = os.path.basename(sys.argv[0]) or "train.py"  # train.py, or generate.py that imports it
    launch = f"torchrun --nproc-per-node {ranks} " if ranks > 1 else "python "
    require(
        world == ranks or fake,
        f"this program was built for the mesh {', '.join(f'{a}={n}' for a, n in mesh.items())}: it needs "
        f"{ranks} rank(s), but WORLD_SIZE is {world}. Launch it with "
        f"`{launch}{script}`"
        f"{' (or launch.sh)' if script == 'train.py' else ''}, "
        f"or rebuild it for {world} rank(s) with `mithril-spec build --mesh ...`.",
    )
    if sharded:
        keep_host_memory_compact()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # a fake process group lays out on the CPU: nothing runs
    cuda = torch.cuda.is_available() and not fake
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        if tf32 is not None:
            # "high": float32 matmuls in TensorFloat-32 (on GPUs only: on CPUs "high" may mean bfloat16)
            torch.set_float32_matmul_precision("high" if tf32 else "highest")
            torch.backends.cudnn.allow_tf32 = tf32
    else:
        # ranks on one host share its cores: oversubscribed threads make every rank slower
        torch.set_num_threads(
            max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
        )
        if not sharded:
            keep_host_memory_mapped()  # a step reuses the host memory the step before it freed
    if ranks == 1:
        # DCP warns on every single-process save and load
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        return device, None, 0
    if not is_first():
        warnings.simplefilter("ignore")  # logs from rank 0 only
    # a norm Partial over 2 mesh dims logs a perf warning
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    if view_outputs:
        # the last block hands back its gathered output as a view; nothing writes into it in place
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    from torch.distributed.device_mesh import init_device_mesh

    if fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    else:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    device_mesh = init_device_mesh(device.type, tuple(mesh.values()), mesh_dim_names=tuple(mesh))
    at = dict(zip(mesh, device_mesh.get_coordinate()))
    dp_rank = 0
    for axis in batch_axes:
        dp_rank = dp_rank * mesh.get(axis, 1) + at.get(axis, 0)
    return device, device_mesh, dp_rank


def shutdown(code=0):
    """The end of the program: with a process group, once every rank has finished, the process exits with
    `code` at once; with none, a nonzero `code` exits."""
    sys.stdout.flush()
    sys.stderr.flush()
    if not dist.is_initialized():
        if code:
            sys.exit(code)
        return
    # under gloo the interpreter sometimes aborts while tearing down after FSDP2 work (SIGABRT);
    # once every rank has finished, skip that teardown
    dist.barrier()
    dist.destroy_process_group()
    os._exit(code)


def any_rank(flag, device):
    """Whether `flag` holds on any rank, on every rank (a collective of one number: every rank calls it)."""
    x = torch.tensor(float(flag), device=device)
    dist.all_reduce(x)
    return x.item() > 0


def most(n, device):
    """The largest of the ranks' numbers `n`, on every rank (a collective of one number: every rank calls
    it)."""
    x = torch.tensor(float(n), device=device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return int(x.item())


def all_ranks(value):
    """`value` of every rank, in rank order (a collective; with no process group: this one's)."""
    if not dist.is_initialized():
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def all_reduce_local(g, group):
    """Sum a rank's local tensor over `group` in place (a non-contiguous view through a contiguous copy)."""
    if g.is_contiguous():
        dist.all_reduce(g, group=group)
    else:
        c = g.contiguous()
        dist.all_reduce(c, group=group)
        g.copy_(c)
