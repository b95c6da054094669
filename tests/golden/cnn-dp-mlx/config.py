"""cnn-dp: what the spec decided (`mithril-spec plan` shows the same numbers): the mesh, the
parameters, the batch, the optimizer and checkpoints."""

import mlx.core as mx

# ----------------------------------------------------------------------------
# Config: what the spec decided (mithril-spec plan shows the same numbers).
# ----------------------------------------------------------------------------
SPEC_NAME = "cnn-dp"
SPEC_FILE = "cnn-dp.yaml"
MITHRIL_VERSION = "0.1.0"


# Device mesh: axis -> size (axes of size 1 are left out). One process per device.
MESH = {"data": 4}
PROCESSES = 4
DATA = 4  # data-parallel degree: processes reading different rows of each batch

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

# Model inputs in spec order: shape without the batch, dtype, and for integer inputs the exclusive upper
# bound of synthetic values (0 for float inputs).
INPUTS = {
    "images": ((3, 32, 32), "float32", 0),
    "labels": ((), "int32", 10),
}
TOKENS_PER_SAMPLE = None  # for tokens/s: the first input's sequence length
FLOPS_PER_STEP = (
    332034048  # model FLOPs of one optimizer step (forward + backward, no recompute): for MFU
)

# Training
BATCH_SIZE = 32  # global: samples per optimizer step
GRAD_ACCUM = 1  # micro-batches per step
MICRO_BATCH = BATCH_SIZE // GRAD_ACCUM
MICROBATCHES = 1
STEPS = 10  # also T of the lr schedule (--steps changes only how far this run goes)
SEED = 0
DATA_SEED = SEED + 1
OPTIMIZER = "sgd"  # make_optimizer() below is written for it
LR = 0.01
MOMENTUM = 0.9
NESTEROV = False
OPTIMIZER_SLOTS = 1 if MOMENTUM else 0  # state tensors per parameter: the momentum buffer
SCHEDULE = "constant"  # lr_schedule() below is written for it
WARMUP_STEPS = 0
CLIP_GRAD_NORM = None
COMPUTE_DTYPE = mx.float32  # forward and backward; parameters, loss and update in float32
REMAT = "none"  # none | full (mx.checkpoint around each block)
CHECKPOINT_DIR = None  # the spec asks for no checkpoints (--checkpoint-dir DIR writes them)
CHECKPOINT_EVERY = 0
DATA_KIND = "synthetic"
DATA_PATH = None
# Bytes per device the planner predicts (`mithril-spec plan`); the program prints what it really holds.
PLANNED_BYTES = {"params": 3695656, "optimizer": 3695656, "buffers": 0}
