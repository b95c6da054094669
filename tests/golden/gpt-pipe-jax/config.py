"""gpt-pipe: what the spec decided that several of the program's files use (`mithril-spec plan` shows
the same numbers): the mesh, every parameter's shape and layout, the batch, precision. Each file opens
with the settings only it uses (the optimizer's in train.py)."""

from jax.sharding import PartitionSpec as P

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from runtime.params import every_copy

SPEC_NAME = "gpt-pipe"
SPEC_FILE = "gpt-pipe.yaml"
# Repeated blocks: name -> number of copies. The tables below list a block's parameters once, by their name
# inside the block; every_copy() gives them their canonical names (copy i of `ln1.weight` in
# `blocks` is `blocks.i.ln1.weight`).
REPEATS = {"blocks": 4}


# Device mesh: axis -> size in canonical order (axes of size 1 are left out).
MESH = {"pipe": 2, "data": 2, "tensor": 2}

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
    REPEATS,
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

INPUT_LAYOUTS = {  # batch dimension first
    "tokens": P("data", None),
    "targets": P("data", None),
}

# Training
BATCH_SIZE = 16  # global: samples per optimizer step
GRAD_ACCUM = 1  # micro-batches per step
MICRO_BATCH = BATCH_SIZE // GRAD_ACCUM
# Pipeline micro-batches (docs/program.md "Pipeline stages"): a micro-batch is split into MICROBATCHES of
# CHUNK samples, which flow through the pipeline stages.
MICROBATCHES = 4
CHUNK = MICRO_BATCH // MICROBATCHES
SEED = 0
PARAM_DTYPE = "float32"  # how parameters (and optimizer state) are stored
COMPUTE_DTYPE = "float32"  # forward and backward; loss and update in float32
