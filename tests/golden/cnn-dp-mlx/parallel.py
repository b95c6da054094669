"""cnn-dp: the processes (`mx.distributed`) and what each holds (--dry-run)."""

import json
import math
import os
import sys

import mlx.core as mx

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import BUFFERS, MESH, MOMENTUM, PARAMS, PLANNED_BYTES
from runtime.console import process_peak_rss
from runtime.errors import require

# what the spec decided that only this file uses (the settings several files share: config.py)
PROCESSES = 4
OPTIMIZER_SLOTS = 1 if MOMENTUM else 0  # state tensors per parameter: the momentum buffer


# ----------------------------------------------------------------------------
# Processes.


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


def any_process(world, flag):
    """Whether `flag` holds on any process (one number summed over the processes)."""
    if world.size() == 1:
        return flag
    return mx.distributed.all_sum(mx.array(float(flag)), group=world).item() > 0


def barrier(world):
    """Waits until every process gets here."""
    if world.size() > 1:
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=world))


def peak_bytes():
    """The peak bytes of this process's device so far (mlx's count, else the process's peak RSS)."""
    return (mx.get_peak_memory() if hasattr(mx, "get_peak_memory") else 0) or process_peak_rss()


def held_bytes(state):
    """{params, optimizer, buffers}: the bytes of the train state's arrays (state_arrays) with at least one
    dimension (step counters are not counted)."""
    held = {"params": 0, "optimizer": 0, "buffers": 0}
    for name, a in state.items():
        held[name.split("/")[0]] += a.nbytes if a.ndim > 0 else 0
    return held


def local_shape(name, shape):
    """The shape of the part of a parameter each process holds."""
    return tuple(shape)  # every process holds every parameter whole


def dry_run():
    """What every process would hold, computed without allocating: its part of each parameter,
    OPTIMIZER_SLOTS float32 tensors of state per parameter, the buffers."""
    params = 4 * sum(math.prod(local_shape(name, shape)) for name, (shape, _, _) in PARAMS.items())
    buffers = 4 * sum(math.prod(shape) for shape, _ in BUFFERS.values())
    held = {"params": params, "optimizer": OPTIMIZER_SLOTS * params, "buffers": buffers}
    print(f"mesh: {MESH or '(one device)'} ({PROCESSES} process(es), {mx.default_device()})")
    print(f"{'parameter':40s} {'shape':>16s} per-process shape")
    for name, (shape, _, _) in PARAMS.items():
        print(f"{name:40s} {list(shape)!s:>16s} {list(local_shape(name, shape))}")
    print("per-process bytes " + json.dumps({"held": held, "planned": PLANNED_BYTES}))
