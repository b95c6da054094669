"""gpt-tiny: the processes and devices, and how the mesh (data=2, fsdp=2, tensor=2) is applied to the model;
what each rank holds (the memory report, --dry-run)."""

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import MESH, PARAMS, PLANNED_BYTES, REPEATS
from runtime.params import every_copy
from runtime.torch.fsdp import gloo_collectives
from runtime.torch.memory import print_layouts, rank_bytes
from runtime.torch.ranks import shutdown, start_ranks
from runtime.torch.tensor_parallel import apply_tp_plan

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
# Processes and devices (runtime/torch/ranks.py).


def setup(dry_run=False):
    """runtime/torch/ranks.py's start_ranks for this mesh: (device, device mesh, this rank's data shard)."""
    return start_ranks(MESH, BATCH_AXES, TF32, dry_run, sharded=True, view_outputs=False)


# ----------------------------------------------------------------------------
# Parallelism
def parallelize(model, mesh):
    """The mesh's parallelism, applied in place to `model` (whose parameter names stay canonical) on the
    meta device: the parameters become the shards each rank holds, and nothing is allocated until
    to_empty (then fill_model writes each rank's shards).
    Tensor parallelism first: the TP_PLAN layers' weights become DTensors split over `tensor`.
    Then FSDP2 as HSDP on the 2-D (data, fsdp) mesh: parameters, gradients and optimizer state sharded
    over `fsdp`, replicated over `data`.
    """
    # the styles TP_PLAN names: runtime/torch/tensor_parallel.py
    apply_tp_plan(model, mesh["tensor"], TP_PLAN)

    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

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


# ----------------------------------------------------------------------------
# Memory report and dry run


def dry_run(model):
    """--dry-run: the mesh, every parameter's torch layout and its shape on this rank (its placement over
    the mesh), and the bytes each rank would hold (runtime/torch/memory.py rank_bytes), from the layouts of
    the model on the meta device: nothing is allocated, and
    one plain process does it for any mesh (a fake process group stands in for the other ranks).
    Then the program stops."""

    ranks = rank_bytes(model, MESH, OPTIMIZER_SLOTS)
    placement = "whole"  # a parameter no mesh axis splits
    print_layouts(model, MESH, BATCH_AXES, PARAMS, placement, ranks, PLANNED_BYTES)
    shutdown()
