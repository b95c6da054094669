"""cnn-dp: the processes (`mx.distributed`) and what each holds (--dry-run)."""

import json
import math
import os
import sys

import mlx.core as mx

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import BUFFERS, MESH, MOMENTUM, PARAMS, PLANNED_BYTES
from runtime.errors import require

# what the spec decided that only this file uses (the settings several files share: config.py)
PROCESSES = 4
OPTIMIZER_SLOTS = 1 if MOMENTUM else 0  # state tensors per parameter: the momentum buffer


# ----------------------------------------------------------------------------
# Processes.
# ----------------------------------------------------------------------------


def refuse(refusal):
    """Exits with code 2 and the Refusal's one line (runtime/errors.py): what was asked cannot run. Every
    process reaches the same verdict and the first one (MLX_RANK 0, or alone) says why; a `local` verdict
    (about this process's own samples) is said by the process that reaches it."""
    if refusal.local or os.environ.get("MLX_RANK", "0") == "0":
        print(f"error: {refusal}", file=sys.stderr, flush=True)
    sys.exit(2)


def join_processes():
    """The process group: under mlx.launch (launch.sh) every process of the mesh, else this one alone."""
    world = mx.distributed.init()
    require(
        world.size() == PROCESSES,
        f"this program was built for the mesh {MESH or '(one device)'}: it needs {PROCESSES} process(es), "
        f"but {world.size()} started. Run it with ./launch.sh (mlx.launch starts {PROCESSES}), or rebuild it "
        "for this machine with `mithril-spec build --target mlx --mesh ...`.",
    )
    return world


def nbytes(arrays):
    """Bytes of the arrays with at least one dimension (step counters are not counted)."""
    return sum(a.nbytes for a in arrays if a.ndim > 0)


def local_shape(name, shape):
    """The shape of the part of a parameter each process holds."""
    return tuple(shape)  # every process holds every parameter whole


def dry_run():
    """What every process would hold, computed without allocating: its part of each parameter,
    OPTIMIZER_SLOTS float32 tensors of state per parameter, the buffers."""
    params = 4 * sum(math.prod(local_shape(name, shape)) for name, (shape, _, _) in PARAMS.items())
    held = {
        "params": params,
        "optimizer": OPTIMIZER_SLOTS * params,
        "buffers": 4 * sum(math.prod(shape) for shape, _ in BUFFERS.values()),
    }
    print(
        f"mesh: {MESH or '(one device)'} ({PROCESSES} process(es), {mx.default_device()})",
        f"{'parameter':40s} {'shape':>16s} per-process shape",
        *(
            f"{name:40s} {list(shape)!s:>16s} {list(local_shape(name, shape))}"
            for name, (shape, _, _) in PARAMS.items()
        ),
        "per-process bytes " + json.dumps({"held": held, "planned": PLANNED_BYTES}),
        sep="\n",
    )
