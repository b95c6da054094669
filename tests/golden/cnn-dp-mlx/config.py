"""cnn-dp: what the spec decided that several of the program's files use (`mithril-spec plan` shows
the same numbers): the mesh, every parameter's shape and layout, the batch, precision. Each file opens
with the settings only it uses (the optimizer's in train.py)."""

SPEC_NAME = "cnn-dp"


# Device mesh: axis -> size (axes of size 1 are left out). One process per device.
MESH = {"data": 4}

# Parameters by canonical name: shape (canonical layout), init, std (docs/program.md "Parameters").
PARAMS = {
    "conv1.weight": ((32, 3, 3, 3), "normal", 0.02),
    "conv1.bias": ((32,), "zeros", 0.02),
    "fc1.weight": ((7200, 128), "normal", 0.02),
    "fc1.bias": ((128,), "zeros", 0.02),
    "fc2.weight": ((128, 10), "normal", 0.02),
    "fc2.bias": ((10,), "zeros", 0.02),
}
BUFFERS = {}  # no batch_norm: nothing but parameters and optimizer state


# Training
BATCH_SIZE = 32  # global: samples per optimizer step
GRAD_ACCUM = 1  # micro-batches per step
MICRO_BATCH = BATCH_SIZE // GRAD_ACCUM
SEED = 0
MOMENTUM = 0.9
# Bytes per device the planner predicts (`mithril-spec plan`); the program prints what it really holds.
PLANNED_BYTES = {"params": 3695656, "optimizer": 3695656, "buffers": 0}
