"""gpt-pipe: what the spec decided (`mithril-spec plan` shows the same numbers): the mesh, every
parameter's layout, the batch, the optimizer, precision, checkpoints and the plan's predictions."""

from jax.sharding import PartitionSpec as P

# ----------------------------------------------------------------------------
# Config: what the spec decided (mithril-spec plan shows the same numbers).
# ----------------------------------------------------------------------------
SPEC_NAME = "gpt-pipe"
SPEC_FILE = "gpt-pipe.yaml"
MITHRIL_VERSION = "0.1.0"
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


# Device mesh: axis -> size in canonical order (axes of size 1 are left out).
MESH = {"pipe": 2, "data": 2, "tensor": 2}
BATCH_AXES = ("data",)  # the batch is split over these (data-parallel degree 2)

# Parameters by canonical name: shape (canonical layout), init, std (docs/program.md "Parameters").
PARAMS = every_copy(
    {
        "wte.weight": ((256, 64), "normal", 0.02),
        "wpe.weight": ((32, 64), "normal", 0.02),
        "ln_f.weight": ((64,), "ones", 0.02),
        "ln_f.bias": ((64,), "zeros", 0.02),
        "lm_head.weight": ((64, 256), "normal", 0.02),
    },
    {
        "blocks": {
            "ln1.weight": ((64,), "ones", 0.02),
            "ln1.bias": ((64,), "zeros", 0.02),
            "attn.q.weight": ((64, 64), "normal", 0.02),
            "attn.k.weight": ((64, 64), "normal", 0.02),
            "attn.v.weight": ((64, 64), "normal", 0.02),
            "attn.o.weight": ((64, 64), "normal", 0.02),
            "ln2.weight": ((64,), "ones", 0.02),
            "ln2.bias": ((64,), "zeros", 0.02),
            "mlp.fc.weight": ((64, 256), "normal", 0.02),
            "mlp.fc.bias": ((256,), "zeros", 0.02),
            "mlp.proj.weight": ((256, 64), "normal", 0.02),
            "mlp.proj.bias": ((64,), "zeros", 0.02),
        },
    },
)
# The train state's parameters and the plan's layout of each: the mesh axes each dimension is split over.
# Gradients and the optimizer state take the layout of their parameter.
# A parameter of a repeated block is one array over its copies, "<repeat>.*.<param>" = [copies, ...], each
# copy laid out as the plan says, and the model runs the block under lax.scan over the copies.
# The copy dimension of `blocks` is split over `pipe`: each pipe rank holds the copies of its stages.
# Checkpoints hold the stacked arrays; --init-params and --export-params use the canonical names.
STATE_LAYOUTS = {
    "wte.weight": P(None, None),
    "wpe.weight": P(None, None),
    "ln_f.weight": P(None),
    "ln_f.bias": P(None),
    "lm_head.weight": P(None, None),
    "blocks.*.ln1.weight": P("pipe", None),
    "blocks.*.ln1.bias": P("pipe", None),
    "blocks.*.attn.q.weight": P("pipe", None, "tensor"),
    "blocks.*.attn.k.weight": P("pipe", None, "tensor"),
    "blocks.*.attn.v.weight": P("pipe", None, "tensor"),
    "blocks.*.attn.o.weight": P("pipe", "tensor", None),
    "blocks.*.ln2.weight": P("pipe", None),
    "blocks.*.ln2.bias": P("pipe", None),
    "blocks.*.mlp.fc.weight": P("pipe", None, "tensor"),
    "blocks.*.mlp.fc.bias": P("pipe", "tensor"),
    "blocks.*.mlp.proj.weight": P("pipe", "tensor", None),
    "blocks.*.mlp.proj.bias": P("pipe", None),
}
BUFFERS = {}  # no batch_norm: nothing but parameters and optimizer state
BUFFER_LAYOUTS = {}

# Model inputs in spec order: shape without the batch, dtype, and for integer inputs the exclusive upper
# bound of synthetic values (0 for float inputs).
INPUTS = {
    "tokens": ((32,), "int32", 256),
    "targets": ((32,), "int32", 256),
}
INPUT_LAYOUTS = {  # batch dimension first
    "tokens": P("data", None),
    "targets": P("data", None),
}
TOKENS_PER_SAMPLE = 32  # for tokens/s: the first input's sequence length
FLOPS_PER_STEP = (
    725188608  # model FLOPs of one optimizer step (forward + backward, no recompute): for MFU
)

# Training
BATCH_SIZE = 16  # global: samples per optimizer step
GRAD_ACCUM = 1  # micro-batches per step
MICRO_BATCH = BATCH_SIZE // GRAD_ACCUM
# Pipeline micro-batches (docs/program.md "Pipeline stages"): a micro-batch is split into MICROBATCHES of
# CHUNK samples, which flow through the pipeline stages.
MICROBATCHES = 4
CHUNKS = GRAD_ACCUM * MICROBATCHES
CHUNK = MICRO_BATCH // MICROBATCHES
STEPS = 10  # also T of the lr schedule (--steps changes only how far this run goes)
SEED = 0
DATA_SEED = SEED + 1
OPTIMIZER = "adamw"  # make_optimizer() below is written for it
LR = 0.001
BETAS = (0.9, 0.95)
EPS = 1e-08
WEIGHT_DECAY = 0.1  # decoupled; only parameters with 2 or more dimensions
SCHEDULE = "cosine"  # lr_schedule() below is written for it
WARMUP_STEPS = 2
MIN_LR_RATIO = 0.0
CLIP_GRAD_NORM = 1.0
PARAM_DTYPE = "float32"  # how parameters (and optimizer state) are stored
# a float32 master copy of 16-bit parameters in the optimizer state, whose moments are then float32 too
MASTER_WEIGHTS = False
COMPUTE_DTYPE = "float32"  # forward and backward; loss and update in float32
TF32 = True  # on GPUs: float32 matmuls and convolutions in TensorFloat-32 (precision.tf32)
REMAT = "none"  # none | selective | full
ZERO = 0  # 1: optimizer state split over the batch axes too; 2: gradients as well
CHECKPOINT_DIR = None  # the spec asks for no checkpoints (--checkpoint-dir DIR writes them)
CHECKPOINT_EVERY = 0
DATA_KIND = "synthetic"
DATA_PATH = None
# Bytes per device the planner predicts (`mithril-spec plan`); the program prints what it really holds.
PLANNED_BYTES = {"params": 339968, "optimizer": 679936, "buffers": 0}
# What the plan predicts for one step (`mithril-spec plan --target jax`): per device, the peak bytes,
# the bytes and calls of each collective kind, and per hardware profile the step time, its compute and each
# kind's seconds. --profile prints them next to what it measures, on the profile of this device's name
# (PREDICTED["device_profiles"]).
PREDICTED = {
    "peak_bytes": 2261504,
    "comm_bytes": {
        "all-reduce": 790548,
        "send/recv": 65536,
    },
    "comm_calls": {
        "all-reduce": 38,
        "send/recv": 4,
    },
    "profiles": {
        "h200-141gb": {
            "step_s": 0.0003104,
            "compute_s": 4.475e-07,
            "offload_s": 0.0,
            "comm_s": {
                "all-reduce": 0.0002358,
                "send/recv": 1.215e-05,
            },
        },
        "h100-sxm-80gb": {
            "step_s": 0.0003106,
            "compute_s": 4.475e-07,
            "offload_s": 0.0,
            "comm_s": {
                "all-reduce": 0.0002358,
                "send/recv": 1.215e-05,
            },
        },
        "a100-80gb": {
            "step_s": 0.0003122,
            "compute_s": 1.419e-06,
            "offload_s": 0.0,
            "comm_s": {
                "all-reduce": 0.0002366,
                "send/recv": 1.222e-05,
            },
        },
        "tpu-v5e": {
            "step_s": 0.0001161,
            "compute_s": 3.371e-06,
            "offload_s": 0.0,
            "comm_s": {
                "all-reduce": 8.591e-05,
                "send/recv": 4.655e-06,
            },
        },
        "cpu": {
            "step_s": 0.001983,
            "compute_s": 0.0007379,
            "offload_s": 0.0,
            "comm_s": {
                "all-reduce": 0.0008195,
                "send/recv": 4.328e-05,
            },
        },
    },
    "device_profiles": [
        ["H200", "h200-141gb"],
        ["H100", "h100-sxm-80gb"],
        ["A100", "a100-80gb"],
        ["TPU v5", "tpu-v5e"],
        ["cpu", "cpu"],
    ],
    "offload": None,
}
