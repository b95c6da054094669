"""The processes and devices of a JAX program: refusals, the distributed runtime, the mesh, what the devices
hold (the memory line, --dry-run) and the console's device figures. The program passes what its spec
decided: the mesh, the communication settings, the planned bytes."""

import json
import math
import os
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType

from runtime.console import peak_flops, process_peak_rss
from runtime.errors import require


def refuse(refusal):
    """Exits with code 2 and the Refusal's one line (runtime/errors.py): what was asked cannot run. Every
    process reaches the same verdict and the first one says why; a `local` verdict (about this process's own
    samples) is said by the process that reaches it."""
    if refusal.local or os.environ.get("MITHRIL_PROCESS_ID", "0") == "0":
        print(f"error: {refusal}", file=sys.stderr, flush=True)
    sys.exit(2)


def start_devices(args, mesh, tf32=None, xla_flags=(), nccl_algo=None):
    """The devices of the mesh `mesh` ({axis: size}) and, with several processes, the distributed runtime:
    both can only be configured before JAX touches a device. `xla_flags` and `nccl_algo` (the spec's
    `communication`, read when XLA starts its backend) steer XLA's GPU compiler and NCCL; XLA:CPU ignores
    them. `tf32` (float32 compute): whether float32 matmuls on GPUs run in TensorFloat-32 (None: left as
    they are)."""
    devices = math.prod(mesh.values())
    n = args.num_processes
    require(
        n >= 1 and devices % n == 0 and 0 <= args.process_id < n,
        f"{n} processes cannot share a mesh of {devices} devices (process id {args.process_id})",
    )
    require(
        n == 1 or args.coordinator,
        "several processes need MITHRIL_COORDINATOR=host:port (or --coordinator)",
    )
    if xla_flags:
        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *xla_flags]).strip()
    if nccl_algo:
        os.environ["NCCL_ALGO"] = nccl_algo
    # Without an accelerator, simulate the mesh with CPU devices: mesh size / processes per process.
    # This only affects the CPU backend. An explicit setting wins (and can provoke a wrong count).
    flags = os.environ.get("XLA_FLAGS", "")
    explicit = (
        "JAX_NUM_CPU_DEVICES" in os.environ or "xla_force_host_platform_device_count" in flags
    )
    if not explicit:
        jax.config.update("jax_num_cpu_devices", devices // n)
    if n > 1:
        # CPU collectives across processes need gloo (the default fails at the first all-reduce).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(args.coordinator, num_processes=n, process_id=args.process_id)
    # XLA:CPU computes float32 matmuls in float32 whatever this says
    if tf32 is not None and jax.devices()[0].platform == "gpu":
        jax.config.update("jax_default_matmul_precision", "tensorfloat32" if tf32 else "highest")
    require(
        jax.device_count() == devices,
        f"this program was built for the mesh {mesh or '(one device)'}: it needs {devices} device(s), "
        f"but {jax.device_count()} are visible ({jax.process_count()} process(es) x "
        f"{jax.local_device_count()} {jax.devices()[0].platform} device(s)). Run it with {devices} "
        "devices in all, or rebuild it for this machine with `mithril-spec build --mesh ...`.",
    )


def mesh_of(mesh):
    """The device mesh of `mesh` ({axis: size}). A single-device build gets a one-device mesh, so there is
    one code path."""
    shape, names = tuple(mesh.values()) or (1,), tuple(mesh) or ("data",)
    # Auto axes: XLA propagates layouts from the jit shardings and the constraints in the model.
    # (jax.make_mesh defaults to Explicit axes in recent jax; the programs are not written for them.)
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))


def device0_bytes(tree):
    """Bytes of the arrays (ndim > 0) of `tree` that the first device holds: its addressable shards."""
    d0 = jax.devices()[0]
    shards = [s for x in jax.tree.leaves(tree) if x.ndim > 0 for s in x.addressable_shards]
    return sum(s.data.nbytes for s in shards if s.device == d0)


def held_bytes(state):
    """{params, optimizer, buffers}: the bytes of the train state that the first device holds (arrays with
    ndim > 0 only: optax's step counters are not counted)."""
    parts = {"params": "params", "optimizer": "opt_state", "buffers": "buffers"}
    return {k: device0_bytes(state[part]) for k, part in parts.items()}


def say_memory(args, start, state, planned):
    """The first process's lines before the first step: where the run resumed, and the bytes of the train
    state the first device holds next to the `planned` ones."""
    if jax.process_index() == 0:
        memory = {"device0": held_bytes(state), "planned": planned}
        resumed = f"resumed from {args.resume} at step {start}\n" if args.resume else ""
        print(resumed + "memory " + json.dumps(memory), flush=True)


def device_figures(mesh, compute):
    """What the console (runtime/console.py) reports of the devices: how many, a GPU's peak FLOP/s in the
    `compute` precision (None elsewhere: no MFU), memory(): the peak bytes of the first local one so far."""
    device = jax.local_devices()[0]
    peak = peak_flops(device.device_kind, compute) if device.platform == "gpu" else None

    def memory():
        return (device.memory_stats() or {}).get("peak_bytes_in_use") or process_peak_rss()

    return {"devices": mesh.devices.size, "compiles": True, "peak": peak, "memory": memory}


def dry_run(mesh, shardings, abstract, batch_axes, planned):
    """--dry-run: what the program would hold: the mesh (the batch split over `batch_axes`), every
    parameter's layout and per-device shape (as the train state holds them: a repeated block's stacked over
    its copies), bytes per device next to the `planned` ones."""
    held = {
        key: sum(
            math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
            for a, s in zip(jax.tree.leaves(abstract[key]), jax.tree.leaves(shardings[key]))
            if a.ndim > 0
        )
        for key in ("params", "opt_state", "buffers")
    }
    print(
        f"mesh: {dict(mesh.shape)} ({mesh.devices.size} {jax.devices()[0].platform} devices, "
        f"{jax.process_count()} process(es)); batch over {batch_axes or 'no axis'}",
        f"{'parameter':40s} {'shape':>16s} {'layout':32s} per-device shape",
        *(
            f"{name:40s} {list(a.shape)!s:>16s} {s.spec!s:32s} {list(s.shard_shape(a.shape))}"
            for name, a in abstract["params"].items()
            for s in [shardings["params"][name]]
        ),
        f"device 0 bytes: params {held['params']}, optimizer state {held['opt_state']}, buffers "
        f"{held['buffers']}; planned: {planned}",
        sep="\n",
    )


def any_process(flag):
    """Whether `flag` holds on any process, on every process (a collective when there are several)."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(multihost_utils.process_allgather(np.int32(flag)).any())
