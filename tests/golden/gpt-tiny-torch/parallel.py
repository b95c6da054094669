"""gpt-tiny: the processes and devices, and how the mesh (data=2, fsdp=2, tensor=2) is applied to the model;
what each rank holds (the memory report, --dry-run)."""

import json
import logging
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import MESH, PARAMS, PLANNED_BYTES, REPEATS, WORLD
from model import local_box, local_part
from runtime.errors import require
from runtime.params import every_copy
from runtime.processes import keep_host_memory_compact

# what the spec decided that only this file uses (the settings several files share: config.py)
BATCH_AXES = ("data", "fsdp")  # the batch is split over these (data-parallel degree 4)
# The torch dimension FSDP2 shards each parameter along: the plan's fsdp dimension (None: FSDP2's
# default, dimension 0).
FSDP_DIMS = every_copy(
    {
        "wte.weight": 1,
        "wpe.weight": 1,
        "ln_f.weight": 0,
        "ln_f.bias": 0,
    },
    {
        "blocks": {
            "ln1.weight": 0,
            "ln1.bias": 0,
            "attn.q.weight": 1,
            "attn.k.weight": 1,
            "attn.v.weight": 1,
            "attn.o.weight": 0,
            "ln2.weight": 0,
            "ln2.bias": 0,
            "mlp.fc.weight": 1,
            "mlp.fc.bias": 0,
            "mlp.proj.weight": 0,
            "mlp.proj.bias": 0,
        },
    },
    REPEATS,
)
# Tensor parallelism: parallelize_module style per sub-module (`*`: every copy of a block).
TP_PLAN = {
    "blocks.*.attn.q": "colwise",
    "blocks.*.attn.k": "colwise",
    "blocks.*.attn.v": "colwise",
    "blocks.*.attn.o": "rowwise",
    "blocks.*.attn": "replicate_input",
    "blocks.*.mlp.fc": "colwise",
    "blocks.*.mlp.proj": "rowwise",
}
TF32 = True  # on GPUs: float32 matmuls and convolutions in TensorFloat-32 (precision.tf32)
OPTIMIZER_SLOTS = 2  # state tensors per parameter (adamw)


# ----------------------------------------------------------------------------
# Processes and devices.
# ----------------------------------------------------------------------------


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


def setup(dry_run=False):
    """Check the launch against the mesh before anything else, then the device and process group.
    --dry-run in one plain process (no torchrun) stands in for the whole mesh with a fake process group:
    rank 0 of WORLD, whose collectives do nothing (the dry run runs none)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    fake = dry_run and world == 1
    script = os.path.basename(sys.argv[0]) or "train.py"  # train.py, or generate.py that imports it
    require(
        world == WORLD or fake,
        f"this program was built for the mesh {', '.join(f'{a}={n}' for a, n in MESH.items())}: it needs "
        f"{WORLD} rank(s), but WORLD_SIZE is {world}. Launch it with "
        f"`torchrun --nproc-per-node 8 {script}`"
        f"{' (or launch.sh)' if script == 'train.py' else ''}, "
        f"or rebuild it for {world} rank(s) with `mithril-spec build --mesh ...`.",
    )
    keep_host_memory_compact()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # a fake process group lays out on the CPU: nothing runs
    cuda = torch.cuda.is_available() and not fake
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        # "high": float32 matmuls in TensorFloat-32 (on GPUs only: on CPUs "high" may mean bfloat16 passes)
        torch.set_float32_matmul_precision("high" if TF32 else "highest")
        torch.backends.cudnn.allow_tf32 = TF32
    else:
        # ranks on one host share its cores: oversubscribed threads make every rank slower
        torch.set_num_threads(
            max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
        )
    if not is_first():
        warnings.simplefilter("ignore")  # logs from rank 0 only
    # a norm Partial over 2 mesh dims logs a perf warning
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    from torch.distributed.device_mesh import init_device_mesh

    if fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    else:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    mesh = init_device_mesh(device.type, tuple(MESH.values()), mesh_dim_names=tuple(MESH))
    at = dict(zip(MESH, mesh.get_coordinate()))
    dp_rank = 0  # which data shard this rank reads: its index over the batch axes (the other ranks share it)
    for axis in BATCH_AXES:
        dp_rank = dp_rank * MESH.get(axis, 1) + at.get(axis, 0)
    return device, mesh, dp_rank


def shutdown(code=0):
    sys.stdout.flush()
    sys.stderr.flush()
    # under gloo the interpreter sometimes aborts while tearing down after FSDP2 work (SIGABRT);
    # once every rank has finished, skip that teardown
    dist.barrier()
    dist.destroy_process_group()
    os._exit(code)


def most(n, device):
    """The largest of the ranks' numbers `n`, on every rank (a collective of one number: every rank calls it)."""
    x = torch.tensor(float(n), device=device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return int(x.item())


# ----------------------------------------------------------------------------
# Parallelism
# ----------------------------------------------------------------------------
def parallelize(model, mesh):
    """The mesh's parallelism, applied in place to `model` (whose parameter names stay canonical) on the
    meta device: the parameters become the shards each rank holds, and nothing is allocated until
    to_empty (then fill_model writes each rank's shards).
    Tensor parallelism first: the TP_PLAN layers' weights become DTensors split over `tensor`.
    Then FSDP2 as HSDP on the 2-D (data, fsdp) mesh: parameters, gradients and optimizer state sharded
    over `fsdp`, replicated over `data`.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    styles = {
        # output features split: no communication
        "colwise": lambda: ColwiseParallel(),
        # input features split: all-reduce the output
        "rowwise": lambda: RowwiseParallel(),
        # the layer's input projections read one DTensor: their input gradients add up as partial sums
        # and are all-reduced once (Megatron's count), not once per projection
        "replicate_input": lambda: PrepareModuleInput(
            input_layouts=(Replicate(),),
            desired_input_layouts=(Replicate(),),
            use_local_output=False,
        ),
    }
    parallelize_module(model, mesh["tensor"], {fqn: styles[s]() for fqn, s in TP_PLAN.items()})

    from torch.distributed.fsdp import fully_shard

    by_param = {p: FSDP_DIMS[name] for name, p in model.named_parameters()}

    def placement(p):  # shard the dimension the plan shards over fsdp
        return None if by_param[p] is None else Shard(by_param[p])

    kw = dict(mesh=mesh["data", "fsdp"])
    kw["shard_placement_fn"] = placement
    for block in model.blocks:  # one all-gather / reduce-scatter group per block
        fully_shard(block, **kw)
    fully_shard(model, **kw)  # the root: every parameter outside the blocks
    if mesh.device_type == "cpu":
        gloo_collectives(model)


class GlooAllGather:
    """FSDP2's all-gather on gloo (CPU), into FSDP2's output buffer itself: each rank's slice broadcast from
    it. gloo's all_gather_into_tensor gathers into a buffer of its own the size of the output first."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        # (input_tensor is this rank's slice of output_tensor: FSDP2 copies the shards in there)
        for i, part in enumerate(output_tensor.view(group.size(), -1)):
            dist.broadcast(part, src=dist.get_global_rank(group, i), group=group)
        return None  # done: FSDP2 waits on nothing


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
        return None


def gloo_collectives(model):
    """On CPU (gloo), FSDP2 keeps less on the host: its collectives without gloo's full-size staging
    buffers (GlooAllGather, GlooReduceScatter), and no backward prefetch (a gloo all-gather is
    synchronous: prefetching overlaps nothing, and only holds the next block's gathered parameters longer)."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule) and hasattr(m, "set_custom_reduce_scatter"):  # torch >= 2.8
            m.set_custom_all_gather(GlooAllGather())
            m.set_custom_reduce_scatter(GlooReduceScatter())
        if isinstance(m, FSDPModule):
            m.set_modules_to_backward_prefetch([])


# ----------------------------------------------------------------------------
# Memory report and dry run
# ----------------------------------------------------------------------------


def local_bytes(t):
    """Bytes of this rank's part of a tensor."""
    return local_part(t).numel() * t.element_size()


def held_bytes(model, optimizer):
    """What this rank holds: parameters, gradients, optimizer state and buffers. The optimizer's slot
    tensors only (exp_avg, exp_avg_sq / momentum_buffer), not its scalar `step`: the planner counts the
    same (docs/program.md "Memory report")."""
    params = list(model.parameters())
    return {
        "params": sum(local_bytes(p) for p in params),
        "grads": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(
            local_bytes(v)
            for s in optimizer.state.values()
            for v in s.values()
            if torch.is_tensor(v) and v.ndim > 0
        ),
        "buffers": sum(local_bytes(b) for b in model.buffers()),
    }


def all_ranks(value):
    """`value` of every rank, in rank order (a collective)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def dry_run(model):
    """--dry-run: the mesh, every parameter's torch layout and its shape on this rank (its placement over
    the mesh), and the bytes each rank would hold (gradients like their parameters, OPTIMIZER_SLOTS
    optimizer tensors each), from the layouts of the model on the meta device: nothing is allocated, and
    one plain process does it for any mesh (a fake process group stands in for the other ranks).
    Then the program stops."""

    # per rank: the bytes of its parameter shards, and of its buffers (whole)
    params = [
        sum(
            int(np.prod(local_box(p, r)[0])) * p.element_size() for n, p in model.named_parameters()
        )
        for r in range(WORLD)
    ]
    held = [
        sum(b.numel() * b.element_size() for n, b in model.named_buffers()) for r in range(WORLD)
    ]
    log(
        f"mesh: {', '.join(f'{a}={k}' for a, k in MESH.items())} ({WORLD} rank(s)); batch over {BATCH_AXES or 'no axis'}",
        f"{'parameter':32s} {'canonical':>12s} {'torch':>12s} {'this rank':>12s}  placement",
        *(
            f"{name:32s} {str(list(PARAMS[name][0])):>12s} {str(list(p.shape)):>12s} "
            f"{str(list(local_box(p)[0])):>12s}  "
            + (
                f"{','.join(p.device_mesh.mesh_dim_names)}: {', '.join(map(str, p.placements))}"
                if hasattr(p, "placements")
                else "whole"
            )
            for name, p in model.named_parameters()
        ),
        *(
            f"rank {r} bytes: "
            + json.dumps(
                {"params": n, "grads": n, "optimizer": OPTIMIZER_SLOTS * n, "buffers": held[r]}
            )
            for r, n in enumerate(params)
        ),
        f"planned per rank: {json.dumps(PLANNED_BYTES)}",
        sep="\n",
    )
    shutdown()
