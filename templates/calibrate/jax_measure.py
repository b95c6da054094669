"""Measures this machine for `mithril-spec calibrate --target jax` (run as a script, never imported).

Sets up devices as the generated JAX programs do: the accelerators present, or without one `--processes`
simulated CPU devices in this process (`jax_num_cpu_devices`), which share the host's cores. Every figure
is taken with all devices working at once on their own shard, in a `fori_loop` inside one jitted program
synchronised once per call (no Python dispatch or host sync per operation): matrix multiplications per
dtype, a large element-wise pass (memory bandwidth), a layer's element-wise kernels forward and backward,
on CPU devices a reference decoder block forward and backward (mithril_spec/probe.py),
and `psum` all-reduces over all devices at several sizes, each after a compute burst (the ring's bandwidth
and per-step latency), and the largest beside a burst (whether a collective overlaps compute); and one
jitted chain of tiny
dependent operations (the fixed cost of one kernel inside a program). Prints one JSON object of raw
timings (seconds) to `--out`."""

from __future__ import annotations

import argparse
import itertools
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
    keys = (jax.random.fold_in(jax.random.key(0), i) for i in itertools.count())

    def put(shape, dtype, random=False):
        """A [n, *shape] array, one slice per device (random values: a GPU's power, hence its clock, depends on
        the data its matmuls see)."""
        x = jax.random.normal(next(keys), (n, *shape), jnp.float32) if random else jnp.zeros((n, *shape))
        return jax.device_put(x.astype(dtype), split)

    def looped(body):
        """`body(carry) -> carry` run `iters` times inside one jitted program on every device at once
        (`fori_loop`). The trip count is static: XLA then knows it, and a GPU runs the loop without reading its
        condition back to the host each iteration. Each iteration's result is the next one's input, so that XLA
        can neither hoist the work out of the loop nor drop an iteration's work (were the loop unrolled)."""
        def run(carry, iters):
            return jax.shard_map(lambda c: jax.lax.fori_loop(0, iters, lambda _, x: body(x), c), mesh=mesh,
                                 in_specs=P("d"), out_specs=P("d"))(carry)

        return jax.jit(run, static_argnums=1, donate_argnums=0)

    def timed(fn, carry, budget=cfg["budget_s"]):
        """Seconds per loop iteration, all devices at once: one call runs as many iterations as fill the time
        budget and is synchronised once (`block_until_ready`), so that neither the Python dispatch nor the host
        sync of a call is in the figure; the median of three such calls (on a shared machine: the load of the
        moment, as a program's median step sees it). The count, a power of 2 (few compilations), is sized by a
        call of 1 iteration, then by one of the count that gives."""

        def call(iters):
            nonlocal carry
            t0 = time.perf_counter()
            carry = jax.block_until_ready(fn(carry, iters))  # (the carry's buffers are donated: reused)
            return time.perf_counter() - t0

        def count(per_iteration):
            return 1 << max(0, min(22, int(budget / max(per_iteration, 1e-9)).bit_length() - 1))

        iters, sized = 1, []
        while iters not in sized and len(sized) < 2:
            sized.append(iters)
            call(iters)  # compiles
            iters = count(call(iters) / iters)
        if iters not in sized:
            call(iters)  # compiles
        return sorted(call(iters) / iters for _ in range(3))[1]

    stats = devices[0].memory_stats() or {}
    precision = jax.config.jax_default_matmul_precision  # the programs set none: XLA's default
    res = {"device": devices[0].device_kind, "platform": devices[0].platform, "processes": n, "matmul": {},
           "allreduce": [], "matmul_precision": str(precision or "default"),
           # bytes one device holds: the accelerator's memory, or the host's shared by the simulated devices
           "memory_bytes": stats.get("bytes_limit") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // n}

    # matmuls: each device multiplies its own [m, k] x [k, k] (a 2-D dot, as the programs' layers lower to) at
    # the default precision, as the programs do (float32 on an NVIDIA GPU: TF32 tensor-core passes). The
    # product is the next iteration's input: the second factor is orthogonal, so that the values stay of the
    # same size from iteration to iteration, random, as a training step's are
    def matmul(carry):
        x, q = carry
        return (x[0] @ q[0])[None], q

    def orthogonal(k, dtype):
        q = jnp.linalg.qr(jax.random.normal(next(keys), (n, k, k), jnp.float32))[0]
        return jax.device_put(q.astype(dtype), split)

    mm = looped(matmul)
    # an accelerator also gets large products (its small ones are bound by the launch, not the FLOPs)
    shapes = cfg["matmul_shapes"] + (cfg["accelerator_shapes"] if devices[0].platform != "cpu" else [])
    for dtype in cfg["dtypes"]:
        rows = []
        for m, k, nn in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
            if k != nn:
                raise SystemExit(f"error: matmul shape {[m, k, nn]}: the jax script chains square products")
            rows.append([m, k, nn, timed(mm, (put((m, k), dtype, True), orthogonal(k, dtype)))])
            if rows[-1][-1] > 10 * cfg["budget_s"]:
                break  # a dtype this device runs slowly (emulated): larger shapes would take minutes
        res["matmul"][dtype] = rows
    # memory bandwidth: `x + 1` reads and writes every byte, in place in the loop's buffer, as XLA reuses a
    # program's buffers from step to step (each pass the next one's input: none can be folded away)
    copy = looped(lambda x: x + 1.0)
    res["copy"] = [cfg["copy_bytes"], timed(copy, put((cfg["copy_bytes"] // 4,), jnp.float32))]
    # element-wise kernels as a layer runs them: on an activation-sized [tokens, features] float32 tensor, a
    # layer norm, a gelu (tanh), a softmax and a residual add, forward and backward (`jax.vjp`), in the loop
    # above (as XLA fuses them in a program). A CPU runs these slower than a copy (transcendentals, several
    # passes): the rate the model's element-wise term needs. Raw: [bytes of one kernel's output, kernels,
    # seconds of forward and backward]
    rows, cols = cfg["elementwise_shape"]

    def normalised(a):  # a layer norm's normalisation over the features (no gain or shift)
        mean = a.mean(-1, keepdims=True)
        return (a - mean) * jax.lax.rsqrt(((a - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    def layer(a):
        y = normalised(a)
        return jax.nn.softmax(jax.nn.gelu(y, approximate=True), axis=-1) + a

    def forward_backward(x):
        y, pull = jax.vjp(layer, x[0])
        (g,) = pull(jnp.ones_like(y))
        return (0.5 * y + 0.5 * g)[None]  # (both the next iteration's input: neither pass can be dropped)

    res["elementwise"] = [rows * cols * 4, 4, timed(looped(forward_backward), put((rows, cols), jnp.float32, True))]
    # a reference layer (calibrate.PROBE): a pre-norm decoder block, forward and backward (the parameters'
    # gradients and the input's) as the programs compute it: layer norm, q, k, v and o projections, causal
    # attention with its scores and softmax in float32 (einsum, as the programs' `attention`), residual add, layer
    # norm, fc, gelu (tanh), proj with biases, residual add, a mean-square loss. Each iteration the parameters take
    # a small step down their gradient: the next iteration's input. Raw: [batch, seq, dim, heads, ff, seconds per
    # forward and backward]
    if devices[0].platform == "cpu":
        b, s, d, heads, ff = cfg["probe"]
        hd = d // heads

        def norm(a, g, sh):
            return normalised(a) * g + sh

        def block(p, x, y):
            h = norm(x, p["ln1.g"], p["ln1.b"])
            q, k, v = ((h @ p[w]).reshape(b, s, heads, hd) for w in ("q", "k", "v"))
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / hd**0.5
            scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
            probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
            x = x + jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, d) @ p["o"]
            h = norm(x, p["ln2.g"], p["ln2.b"])
            x = x + jax.nn.gelu(h @ p["fc"] + p["fc.b"], approximate=True) @ p["proj"] + p["proj.b"]
            return ((x - y) ** 2).mean()

        def probe_step(carry):
            p, x, y = carry
            grads = jax.grad(block, argnums=(0, 1))({k: v[0] for k, v in p.items()}, x[0], y[0])
            return {k: v - 1e-6 * grads[0][k][None] for k, v in p.items()}, x - 1e-6 * grads[1][None], y

        shapes = {"ln1.g": (d,), "ln1.b": (d,), "q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d),
                  "ln2.g": (d,), "ln2.b": (d,), "fc": (d, ff), "fc.b": (ff,), "proj": (ff, d), "proj.b": (d,)}
        # (weights of unit gain, 1 / sqrt(fan-in), norms' gains 1 and shifts 0: values of a trained layer's size)
        params = {k: put(v, jnp.float32, True) / v[0] ** 0.5 if len(v) == 2 else
                  put(v, jnp.float32) + (1.0 if k.endswith(".g") else 0.0) for k, v in shapes.items()}
        data = put((b, s, d), jnp.float32, True), put((b, s, d), jnp.float32, True)
        # (windows of 5 budgets: a block takes some 100-250 ms here, and its time sets the efficiency, the
        # largest term of a CPU step: several passes per window, not one)
        res["probe"] = [*cfg["probe"], timed(looped(probe_step), (params, *data), 5 * cfg["budget_s"])]
    chain = cfg["tiny_ops"]

    def tiny(ws, v):
        # a chain of tiny layers (8 features), each device its own: the fixed cost of a layer's kernels
        for w in ws:
            v = jnp.tanh(jnp.einsum("dij,djk->dik", v, w))
        return v.sum()

    t = jax.jit(jax.grad(tiny))
    ws, v = [put((8, 8), jnp.float32, True) for _ in range(chain)], put((8, 8), jnp.float32, True)
    jax.block_until_ready(t(ws, v))  # compiles
    t0 = time.perf_counter()
    jax.block_until_ready(t(ws, v))
    repeats = max(1, int(cfg["budget_s"] / max(time.perf_counter() - t0, 1e-9)))
    # a layer is 3 kernels: forward; backward: the input's and the weight's gradients. All of them inside one
    # compiled program, as a training step runs them: what the model charges is a kernel's cost within a step;
    # a call's own dispatch and host sync (`dispatch`, below) is spread over its 3 x chain kernels
    windows = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeats):
            jax.block_until_ready(t(ws, v))
        windows.append((time.perf_counter() - t0) / repeats / (3 * chain))
    res["tiny_op"] = sorted(windows)[1]
    noop = jax.jit(lambda x: x + 1)
    x = put((1,), jnp.float32)
    jax.block_until_ready(noop(x))
    t0 = time.perf_counter()
    for _ in range(100):
        jax.block_until_ready(noop(x))
    res["dispatch"] = (time.perf_counter() - t0) / 100  # one call and its host sync (reported, not in the profile)
    if n > 1:
        # all-reduces as a step meets them: each after a burst of compute on every device (a layer's chain of
        # dependent kernels on a [m, k] activation of `burst_shape`: matmul, gelu, matmul, residual add, norm;
        # the all-reduce's input depending on it), so that devices reach it out of step, as between a program's
        # layers. Simulated CPU devices share the cores and one thread pool: a single large matmul is split
        # evenly over the pool, a chain of smaller kernels is not, and the devices that finish first wait at the
        # collective for the last (measured on 4 devices sharing 2 cores: 3.7 ms per 512 KiB all-reduce after
        # such a chain of 20 ms, 1 ms after a single matmul). Each row: the time per iteration of burst and
        # all-reduce, less that of the burst alone (the sum of zeros stays zeros, `pcast` only retypes the sum
        # as per-device again)
        m, k, _ = cfg["burst_shape"]

        def burst(carry):
            x, q, v = carry
            h = x[0] + jax.nn.gelu(x[0] @ q[0]) @ q[0].T  # (q orthogonal: the values stay of the same size)
            return normalised(h)[None], q, v

        def burst_reduce(carry):
            x, q, v = burst(carry)
            v = v.at[0, 0].add(x[0, 0, 0] * 0)  # (in place: after the burst, not beside it)
            return x, q, jax.lax.pcast(jax.lax.psum(v, "d"), "d", to="varying")

        def carry(size):  # (a loop's carry is donated: fresh arrays for each)
            return put((m, k), jnp.float32, True), orthogonal(k, jnp.float32), put((max(1, size // 4),), jnp.float32)

        def burst_beside(carry):  # the all-reduce's input independent of the burst: XLA may run them at once
            x, q, _ = burst(carry)
            return x, q, jax.lax.pcast(jax.lax.psum(carry[2], "d"), "d", to="varying")

        alone, both = looped(burst), looped(burst_reduce)
        budget = max(cfg["budget_s"], 10 * timed(alone, carry(4)))  # some 10 bursts a call at least
        for size in cfg["allreduce_bytes"]:
            net = timed(both, carry(size), budget) - timed(alone, carry(size), budget)
            res["allreduce"].append([size, max(0.0, net), n])
        # whether a collective overlaps compute on these devices: the largest all-reduce beside the burst (no
        # dependence between them, as a gradient's reduction and the next layer's backward pass) against the two
        # one after the other. Raw: [burst alone, burst then all-reduce, all-reduce beside the burst]
        # (taken in turn, three rounds, the median of each: on a shared machine, timings taken one after the
        # other compare its loads)
        size, beside = max(cfg["allreduce_bytes"]), looped(burst_beside)
        rounds = [[timed(fn, carry(size), budget) for fn in (alone, both, beside)] for _ in range(3)]
        res["overlap"] = [sorted(r[i] for r in rounds)[1] for i in range(3)]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
