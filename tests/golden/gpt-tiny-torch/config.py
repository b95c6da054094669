"""gpt-tiny: what the spec decided (`mithril-spec plan` shows the same numbers): the mesh, every
parameter's layout, the batch, the optimizer, precision, checkpoints and the plan's predictions."""

import torch

# ----------------------------------------------------------------------------
# Config: what the spec decided (mithril-spec plan shows the same numbers).
# ----------------------------------------------------------------------------
SPEC_NAME = "gpt-tiny"
SPEC_FILE = "gpt-tiny.yaml"
MITHRIL_VERSION = "0.1.0"

# Device mesh: every axis in canonical order (size 1 where the spec has none). Ranks are laid out
# data-major: rank = (d * fsdp + f) * tensor + t; tensor-parallel peers share a data shard.
MESH = {"data": 2, "fsdp": 2, "tensor": 2}
WORLD = 8  # ranks the program must be launched on
BATCH_AXES = ("data", "fsdp")  # the batch is split over these (data-parallel degree 4)

# Repeated blocks: name -> number of copies. The tables below list a block's parameters once, by their name
# inside the block; every_copy() gives them their canonical names (copy i of `ln1.weight` in
# `blocks` is `blocks.i.ln1.weight`).
REPEATS = {"blocks": 4}


def every_copy(top, blocks):
    """A table by canonical name: `top` as it is, and each block entry once per copy (an entry that is a
    function gets the copy index)."""
    each = [
        (
            f"{r}.{i}.{k}",
            (rows[k](i) if callable(rows[k]) else rows[k]) if isinstance(rows, dict) else True,
        )
        for r, rows in blocks.items()
        for i in range(REPEATS[r])
        for k in rows
    ]
    if isinstance(top, set):
        return top | {name for name, _ in each}
    return {**top, **dict(each)}


# Parameters by canonical name: shape (canonical layout), init, std (docs/program.md "Parameters").
PARAMS = every_copy(
    {
        "wte.weight": ((256, 128), "normal", 0.02),
        "wpe.weight": ((64, 128), "normal", 0.02),
        "ln_f.weight": ((128,), "ones", 0.02),
        "ln_f.bias": ((128,), "zeros", 0.02),
    },
    {
        "blocks": {
            "ln1.weight": ((128,), "ones", 0.02),
            "ln1.bias": ((128,), "zeros", 0.02),
            "attn.q.weight": ((128, 128), "normal", 0.02),
            "attn.k.weight": ((128, 128), "normal", 0.02),
            "attn.v.weight": ((128, 128), "normal", 0.02),
            "attn.o.weight": ((128, 128), "normal", 0.02),
            "ln2.weight": ((128,), "ones", 0.02),
            "ln2.bias": ((128,), "zeros", 0.02),
            "mlp.fc.weight": ((128, 512), "normal", 0.02),
            "mlp.fc.bias": ((512,), "zeros", 0.02),
            "mlp.proj.weight": ((512, 128), "normal", 0.02),
            "mlp.proj.bias": ((128,), "zeros", 0.02),
        },
    },
)
# nn.Linear keeps its weight as [out, in]; the canonical layout is [in, out]: transposed at the boundary
# (initialisation, --init-params, --export-params).
TRANSPOSED = every_copy(
    set(),
    {
        "blocks": {
            "attn.q.weight",
            "attn.k.weight",
            "attn.v.weight",
            "attn.o.weight",
            "mlp.fc.weight",
            "mlp.proj.weight",
        },
    },
)
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
)
BUFFERS = {}
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

# Model inputs in spec order: shape without the batch, dtype, and for integer inputs the exclusive upper
# bound of synthetic values (0 for float inputs).
INPUTS = {
    "tokens": ((64,), "int32", 256),
    "targets": ((64,), "int32", 256),
}
TOKENS_PER_SAMPLE = 64  # for tokens/s: the first input's sequence length
FLOPS_PER_STEP = (
    5518000128  # model FLOPs of one optimizer step (forward + backward, no recompute): for MFU
)

# Training
BATCH_SIZE = 16  # global: samples per optimizer step
GRAD_ACCUM = 1  # micro-batches per step
MICRO_BATCH = BATCH_SIZE // GRAD_ACCUM
STEPS = 20  # also T of the lr schedule (--steps changes only how far this run goes)
SEED = 0
DATA_SEED = SEED + 1
OPTIMIZER = "adamw"
LR = 0.0003
BETAS = (0.9, 0.95)
EPS = 1e-08
WEIGHT_DECAY = 0.1  # decoupled; only parameters with 2 or more dimensions
SCHEDULE = "cosine"
WARMUP_STEPS = 5
MIN_LR_RATIO = 0.0
CLIP_GRAD_NORM = 1.0
PARAM_DTYPE = torch.float32  # how parameters (and optimizer state) are stored
COMPUTE_DTYPE = torch.float32  # forward and backward; loss and update in float32
TF32 = True  # on GPUs: float32 matmuls and convolutions in TensorFloat-32 (precision.tf32)
REMAT = "none"  # activation checkpointing per block: none | selective | full
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_EVERY = 10
DATA_KIND = "synthetic"
DATA_PATH = None
# Bytes per rank the planner predicts (`mithril-spec plan`); the program prints what it really holds.
PLANNED_BYTES = {"params": 876032, "grads": 876032, "optimizer": 1752064, "buffers": 0}
# What the plan predicts for one step (`mithril-spec plan --target torch`): per device, the peak bytes,
# the bytes and calls of each collective kind, and per hardware profile the step time, its compute and each
# kind's seconds. --profile prints them next to what it measures, on the profile of this device's name
# (PREDICTED["device_profiles"]).
PREDICTED = {
    "peak_bytes": 11916288,
    "comm_bytes": {
        "all-reduce": 2973195,
        "all-gather": 3504128,
        "reduce-scatter": 1752064,
    },
    "comm_calls": {
        "all-reduce": 23,
        "all-gather": 14,
        "reduce-scatter": 7,
    },
    "profiles": {
        "h200-141gb": {
            "step_s": 0.0002267,
            "compute_s": 2.906e-06,
            "offload_s": 0.0,
            "comm_s": {
                "all-reduce": 0.0001566,
                "all-gather": 4.589e-05,
                "reduce-scatter": 2.295e-05,
            },
        },
        "h100-sxm-80gb": {
            "step_s": 0.0002273,
            "compute_s": 2.906e-06,
            "offload_s": 0.0,
            "comm_s": {
                "all-reduce": 0.0001566,
                "all-gather": 4.589e-05,
                "reduce-scatter": 2.295e-05,
            },
        },
        "a100-80gb": {
            "step_s": 0.0002347,
            "compute_s": 9.217e-06,
            "offload_s": 0.0,
            "comm_s": {
                "all-reduce": 0.0001599,
                "all-gather": 4.784e-05,
                "reduce-scatter": 2.392e-05,
            },
        },
        "cpu": {
            "step_s": 0.005359,
            "compute_s": 0.004793,
            "offload_s": 0.0,
            "comm_s": {
                "all-reduce": 0.0006487,
                "all-gather": 0.0002276,
                "reduce-scatter": 0.0001138,
            },
        },
    },
    "device_profiles": [
        ["H200", "h200-141gb"],
        ["H100", "h100-sxm-80gb"],
        ["A100", "a100-80gb"],
        ["cpu", "cpu"],
    ],
    "offload": None,
}
OPTIMIZER_SLOTS = 2  # state tensors per parameter (adamw)
