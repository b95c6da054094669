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
    keys = iter(jax.random.split(jax.random.key(0), 64))

    def put(shape, dtype, random=False):
        """A [n, *shape] array, one slice per device (random values: a GPU's power, hence its clock, depends on
        the data its matmuls see)."""
        x = jax.random.normal(next(keys), (n, *shape), jnp.float32) if random else jnp.zeros((n, *shape))
        return jax.device_put(x.astype(dtype), split)

    def poke(x, i):
        """`x` with one element set from the loop index (i mod 2), in place: what the loop body computes from
        it then depends on the iteration, so that XLA cannot hoist it out of the loop as invariant."""
        return x.at[(0,) * x.ndim].set((i % 2).astype(x.dtype))

    def looped(body):
        """`body(i, carry) -> carry` run `iters` times inside one jitted program on every device at once
        (`fori_loop` with the trip count an argument: one compilation for every count)."""
        def run(carry, iters):
            return jax.lax.fori_loop(0, iters[0], body, carry)

        return jax.jit(jax.shard_map(run, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d")))

    def timed(fn, carry):
        """Seconds per loop iteration, all devices at once: one call runs as many iterations as fill the time
        budget and is synchronised once (`block_until_ready`), so that neither the Python dispatch nor the host
        sync of a call is in the figure; the median of three such calls (on a shared machine: the load of the
        moment, as a program's median step sees it), after calls that compile it and size the count."""
        def call(iters):
            count = jax.device_put(jnp.full((n,), iters, jnp.int32), split)
            jax.block_until_ready(count)
            t0 = time.perf_counter()
            jax.block_until_ready(fn(carry, count))
            return time.perf_counter() - t0

        call(1)  # compiles
        once = max(call(1), 1e-9)
        iters = 1
        while iters * once < cfg["budget_s"] / 4 and iters < 1 << 20:  # grow until the call dwarfs its dispatch
            iters *= 4
            once = call(iters) / iters
        iters = max(1, min(1 << 22, int(cfg["budget_s"] / once)))
        return sorted(call(iters) / iters for _ in range(3))[1]

    stats = devices[0].memory_stats() or {}
    precision = jax.config.jax_default_matmul_precision  # the programs set none: XLA's default
    res = {"device": devices[0].device_kind, "platform": devices[0].platform, "processes": n, "matmul": {},
           "allreduce": [], "matmul_precision": str(precision or "default"),
           # bytes one device holds: the accelerator's memory, or the host's shared by the simulated devices
           "memory_bytes": stats.get("bytes_limit") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // n}

    # matmuls: each device multiplies its own [m, k] x [k, n] (a 2-D dot, as the programs' layers lower to) at
    # the default precision, as the programs do (float32 on an NVIDIA GPU: TF32 tensor-core passes); the
    # product replaces the carry, so that it is computed every iteration
    def matmul(i, carry):
        a, b, c = carry
        a = poke(a, i)
        return a, b, (a[0] @ b[0])[None]

    mm = looped(matmul)
    # an accelerator also gets large products (its small ones are bound by the launch, not the FLOPs)
    shapes = cfg["matmul_shapes"] + (cfg["accelerator_shapes"] if devices[0].platform != "cpu" else [])
    for dtype in cfg["dtypes"]:
        rows = []
        for m, k, nn in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
            carry = (put((m, k), dtype, True), put((k, nn), dtype, True), put((m, nn), dtype))
            rows.append([m, k, nn, timed(mm, carry)])
            if rows[-1][-1] > 10 * cfg["budget_s"]:
                break  # a dtype this device runs slowly (emulated): larger shapes would take minutes
        res["matmul"][dtype] = rows
    # memory bandwidth: `x + i` reads and writes every byte (the loop index keeps it from being folded into one
    # pass), in place in the loop's buffer, as XLA reuses a program's buffers from step to step
    copy = looped(lambda i, x: x + i.astype(x.dtype))
    res["copy"] = [cfg["copy_bytes"], timed(copy, put((cfg["copy_bytes"] // 4,), jnp.float32))]
    chain = cfg["tiny_ops"]

    def tiny(ws, v):
        # a chain of tiny layers (8 features), each device its own: the fixed cost of a layer's kernels
        for w in ws:
            v = jnp.tanh(jnp.einsum("dij,djk->dik", v, w))
        return v.sum()

    def layers(i, carry):
        ws, v, _ = carry
        v = poke(v, i)
        return ws, v, jax.grad(tiny)(ws, v)  # the gradients replace the carry: every kernel runs

    ws, v = [put((8, 8), jnp.float32, True) for _ in range(chain)], put((8, 8), jnp.float32, True)
    # a layer is 3 kernels: forward; backward: the input's and the weight's gradients. Inside one compiled
    # program, as a training step runs them: the per-dispatch cost of a call (`dispatch`) is paid once a step
    res["tiny_op"] = timed(looped(layers), (ws, v, ws)) / (3 * chain)
    noop = jax.jit(lambda x: x + 1)
    x = put((1,), jnp.float32)
    jax.block_until_ready(noop(x))
    t0 = time.perf_counter()
    for _ in range(100):
        jax.block_until_ready(noop(x))
    res["dispatch"] = (time.perf_counter() - t0) / 100  # one call and its host sync (reported, not in the profile)
    if n > 1:
        # all-reduces back to back inside one program, as a step's collectives run (the sum of zeros stays
        # zeros and feeds the next one)
        reduce = looped(lambda i, v: jax.lax.psum(v, "d"))
        for size in cfg["allreduce_bytes"]:
            res["allreduce"].append([size, timed(reduce, put((max(1, size // 4),), jnp.float32)), n])
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
