"""Measures this machine for `mithril-spec calibrate --target jax` (run as a script, never imported).

Sets up devices as the generated JAX programs do: the accelerators present, or without one `--processes`
simulated CPU devices in this process (`jax_num_cpu_devices`), which share the host's cores. Every figure
is taken with all devices working at once on their own shard of a jitted computation: matrix
multiplications per dtype, a large element-wise pass (memory bandwidth), a chain of tiny dependent
operations (the fixed cost of one kernel) and `psum` all-reduces over all devices at several sizes (the
ring's bandwidth and per-step latency). Prints one JSON object of raw timings (seconds) to `--out`."""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=1, help="devices to simulate without an accelerator")
    ap.add_argument("--config", required=True, help="JSON: what to measure (mithril_spec/calibrate.py)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = json.loads(args.config)

    import jax

    flags = os.environ.get("XLA_FLAGS", "")
    if "JAX_NUM_CPU_DEVICES" not in os.environ and "xla_force_host_platform_device_count" not in flags:
        jax.config.update("jax_num_cpu_devices", args.processes)  # before any device is touched
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()[: args.processes]
    if len(devices) < args.processes:
        raise SystemExit(f"error: {args.processes} devices asked for, {len(devices)} visible")
    n = len(devices)
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    split = NamedSharding(mesh, P("d"))

    def put(shape, dtype):
        """A [n, *shape] array, one slice per device."""
        return jax.device_put(jnp.ones((n, *shape), dtype), split)

    def timed(fn, *xs, repeats=1):
        """Seconds per call, all devices at once, the median of three windows (after one compiling call; on a
        shared machine, the load of the moment, as a program's median step sees it)."""
        jax.block_until_ready(fn(*xs))
        windows = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(repeats):
                # one call at a time: queued calls of a program with collectives can take every thread
                # of the CPU client's pool while a device of the call before still has to join
                jax.block_until_ready(fn(*xs))
            windows.append((time.perf_counter() - t0) / repeats)
        return sorted(windows)[1]

    def repeats_for(fn, *xs):
        once = timed(fn, *xs)
        return max(1, int(cfg["budget_s"] / max(once, 1e-9)))

    stats = devices[0].memory_stats() or {}
    res = {"device": devices[0].device_kind, "platform": devices[0].platform, "processes": n, "matmul": {},
           "allreduce": [],
           # bytes one device holds: the accelerator's memory, or the host's shared by the simulated devices
           "memory_bytes": stats.get("bytes_limit") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // n}
    # each device multiplies its own [m, k] x [k, n] (a 2-D dot, as the programs' layers lower to)
    mm = jax.jit(jax.shard_map(lambda a, b: (a[0] @ b[0])[None], mesh=mesh, in_specs=(P("d"), P("d")),
                               out_specs=P("d")))
    # an accelerator also gets large products (its small ones are bound by the launch, not the FLOPs)
    shapes = cfg["matmul_shapes"] + (cfg["accelerator_shapes"] if devices[0].platform != "cpu" else [])
    for dtype in cfg["dtypes"]:
        rows = []
        for m, k, nn in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
            a, b = put((m, k), dtype), put((k, nn), dtype)
            rows.append([m, k, nn, timed(mm, a, b, repeats=repeats_for(mm, a, b))])
            if rows[-1][-1] > 10 * cfg["budget_s"]:
                break  # a dtype this device runs slowly (emulated): larger shapes would take minutes
        res["matmul"][dtype] = rows
    # memory bandwidth: `x + 1` reads and writes every byte; its output takes the input's buffer (donated),
    # as XLA reuses a program's buffers from step to step, so that what is timed is the traffic, not the
    # first touch of fresh memory
    add = jax.jit(lambda v: v + 1.0, out_shardings=split, donate_argnums=0)
    x = add(put((cfg["copy_bytes"] // 4,), jnp.float32))
    jax.block_until_ready(x)
    windows, repeats = [], None
    for _ in range(4):  # (the first window sizes the others)
        t0 = time.perf_counter()
        for _ in range(repeats or 1):
            x = jax.block_until_ready(add(x))
        dt = (time.perf_counter() - t0) / (repeats or 1)
        if repeats is None:
            repeats = max(1, int(cfg["budget_s"] / max(dt, 1e-9)))
        else:
            windows.append(dt)
    res["copy"] = [cfg["copy_bytes"], sorted(windows)[1]]
    chain = cfg["tiny_ops"]

    def tiny(ws, v):
        # a chain of tiny layers (8 features), each device its own: the fixed cost of a layer's kernels
        for w in ws:
            v = jnp.tanh(jnp.einsum("dij,djk->dik", v, w))
        return v.sum()

    t = jax.jit(jax.grad(tiny))
    ws, v = [put((8, 8), jnp.float32) for _ in range(chain)], put((8, 8), jnp.float32)
    # a layer is 3 kernels: forward; backward: the input's and the weight's gradients
    res["tiny_op"] = timed(t, ws, v, repeats=repeats_for(t, ws, v)) / (3 * chain)
    if n > 1:
        reduce = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "d"), mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        for size in cfg["allreduce_bytes"]:
            v = put((max(1, size // 4),), jnp.float32)
            res["allreduce"].append([size, timed(reduce, v, repeats=repeats_for(reduce, v))])
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
