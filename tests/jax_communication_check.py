"""Gradient compression in a generated JAX program, checked from the inside (tests/test_communication.py).

    python tests/jax_communication_check.py OUT.json BUILD_DIR [BUILD_DIR...]

Each build is the same model over `data` (2 simulated CPU devices) with a cast compression (fp16 or bf16)
or PowerSGD (for which only the collectives of its compiled step are written, per branch of its start-step
switch).
Its train.py is imported and its own train step is jitted twice, on one batch of random samples, with the
optimizer update replaced by "return the gradients" (so the step's new parameters are its gradients):

1. as built: the gradients reduced in the compression dtype (reduce_replicas);
2. with reduce_replicas replaced by an all-gather of every replica's float32 gradients, uncompressed.

From 2 the reference: each replica's gradient cast to the compression dtype and divided by the replicas,
summed in that dtype in rank order, cast back to float32 (torch's fp16_compress_hook). Written per build:
whether 1 equals the reference bit for bit, how far 1 is from the float32 mean of 2 (non-zero: the cast
did something), and the collectives of the compiled step 1 (kind, element type, bytes of the operands).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from jax_runs import FAST_COMPILE  # (this script's directory: tests/)

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=2 {FAST_COMPILE}"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

BYTES = {"u16": 2, "f16": 2, "bf16": 2, "f32": 4, "s32": 4, "u32": 4}
COLLECTIVE = re.compile(r"= \(?((?:[a-z0-9]+\[[0-9,]*\][^ ]*,? ?)+)\)? (all-reduce|all-gather|all-to-all|"
                        r"reduce-scatter|collective-permute)\(")


def _load(build: str):
    from program_import import load_program  # (this script's directory is on sys.path)

    return load_program(build)


def _collectives(hlo: str) -> list[dict]:
    """Each collective of the compiled module: kind, element types and the bytes of its results."""
    out = []
    for line in hlo.splitlines():
        line = re.sub(r"/\*.*?\*/", "", line)  # (long tuples carry /*index=N*/ comments)
        m = COLLECTIVE.search(line)
        if not m or "-done" in line:
            continue
        shapes = re.findall(r"([a-z0-9]+)\[([0-9,]*)\]", m.group(1))
        branch = re.search(r"/branch_(\d+)_fun/", line)  # inside a lax.cond: which branch
        out.append({"kind": m.group(2), "types": sorted({t for t, _ in shapes}),
                    "branch": int(branch.group(1)) if branch else None,
                    "bytes": sum(BYTES[t] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
                                 for t, dims in shapes)})
    return out


def _powersgd(mod) -> dict:
    """A PowerSGD build: the collectives of its compiled train step (in the lax.cond's branches: 0 before the
    start step, 1 from it on), as main() builds its state."""
    mesh = mod.make_mesh()
    with jax.set_mesh(mesh):
        optimizer = mod.make_optimizer()
        shardings, batch_shardings, abstract = mod.layouts(mesh, optimizer)
        args = argparse.Namespace(resume=None, init_params=None, seed=0)
        state = mod.init_state(args, optimizer, shardings, abstract)
        batch = mod.global_batch(mod.Data(None, seed=1), 0, batch_shardings)
        hlo = jax.jit(mod.make_train_step(optimizer, 0)).lower(state, batch).compile().as_text()
    numel = sum(int(np.prod(a.shape)) for a in abstract["params"].values())
    return {"numel": numel, "collectives": _collectives(hlo)}


def _check(build: str) -> dict:
    mod = _load(build)
    if hasattr(mod, "POWERSGD_RANK"):
        return _powersgd(mod)
    mesh = mod.make_mesh()
    rng = np.random.default_rng(0)
    with jax.set_mesh(mesh):
        params = {n: jax.device_put(rng.standard_normal(mod.state_shape(n, mod.PARAMS)).astype(np.float32),
                                    NamedSharding(mesh, spec)) for n, spec in mod.STATE_LAYOUTS.items()}
        batch = {}
        for name, (shape, dtype, high) in mod.INPUTS.items():  # (high: an integer input's values are below it)
            full = (mod.GRAD_ACCUM, mod.MICRO_BATCH, *shape)
            values = rng.integers(0, high, full) if np.dtype(dtype).kind == "i" else rng.standard_normal(full)
            batch[name] = jax.device_put(values.astype(dtype), NamedSharding(mesh, P(None, *mod.INPUT_LAYOUTS[name])))
        state = {"params": params, "opt_state": {}, "buffers": {}, "step": jnp.zeros((), jnp.int32)}

        mod.apply_optimizer = lambda optimizer, grads, opt_state, params: (grads, opt_state)
        step = jax.jit(mod.make_train_step(None, 0))
        compressed = {n: np.asarray(g) for n, g in step(state, batch)[0]["params"].items()}
        hlo = step.lower(state, batch).compile().as_text()

        mod.reduce_replicas = lambda grads: {n: jax.lax.all_gather(g, "data") for n, g in grads.items()}
        mod.gradient_specs = lambda params: {n: P() for n in params}
        per_replica = {n: np.asarray(g) for n, g in jax.jit(mod.make_train_step(None, 0))(state, batch)[0]["params"].items()}

    dtype = mod.COMPRESS_DTYPE
    equal, diff, numel = True, 0.0, 0
    for n, g in per_replica.items():
        total = None
        for r in range(g.shape[0]):
            part = jnp.asarray(g[r]).astype(dtype) / mod.REPLICAS
            total = part if total is None else total + part
        reference = np.asarray(total.astype(jnp.float32))
        equal &= bool(np.array_equal(reference, compressed[n]))
        diff = max(diff, float(np.abs(g.mean(0) - compressed[n]).max()))
        numel += g[0].size
    return {"equal": equal, "diff_from_float32": diff, "numel": numel, "collectives": _collectives(hlo)}


def main(argv: list[str]) -> int:
    out, builds = argv[0], argv[1:]
    result = {build: _check(build) for build in builds}
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
