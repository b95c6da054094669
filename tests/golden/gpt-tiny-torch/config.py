"""gpt-tiny: what the spec decided that several of the program's files use (`mithril-spec plan` shows
the same numbers): the mesh, every parameter's shape and layout, the batch, precision. Each file opens
with the settings only it uses (the optimizer's in train.py)."""

import torch

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from runtime.params import every_copy

SPEC_NAME = "gpt-tiny"
SPEC_FILE = "gpt-tiny.yaml"

# Device mesh: every axis in canonical order (size 1 where the spec has none). Ranks are laid out
# data-major: rank = (d * fsdp + f) * tensor + t; tensor-parallel peers share a data shard.
MESH = {"data": 2, "fsdp": 2, "tensor": 2}

# Repeated blocks: name -> number of copies. The tables below list a block's parameters once, by their name
# inside the block; every_copy() gives them their canonical names (copy i of `ln1.weight` in
# `blocks` is `blocks.i.ln1.weight`).
REPEATS = {"blocks": 4}

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
    REPEATS,
)


# Training
BATCH_SIZE = 16  # global: samples per optimizer step
GRAD_ACCUM = 1  # micro-batches per step
MICRO_BATCH = BATCH_SIZE // GRAD_ACCUM
SEED = 0
COMPUTE_DTYPE = torch.float32  # forward and backward; loss and update in float32
# Bytes per rank the planner predicts (`mithril-spec plan`); the program prints what it really holds.
PLANNED_BYTES = {"params": 876032, "grads": 876032, "optimizer": 1752064, "buffers": 0}
