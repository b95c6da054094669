"""Every operator of the JAX target (tests/specs/all-ops.yaml) trained on one device and on a data=2 mesh;
dropout and the noam schedule on an MLP; the learning rate of every example against the documented
schedules."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
from jax_runs import SPECS, WORK, build, max_diff, max_param_diff, report, run, run_many
from program_import import load_program

from mithril_spec.frontend import compile_file
from mithril_spec.ops import OPS

ALL_OPS = Path(__file__).resolve().parent / "specs" / "all-ops.yaml"
MLP_DROPOUT = (
    ("- {op: relu, name: act1}", "- {op: relu, name: act1}\n    - {op: dropout, name: drop1, rate: 0.25}"),
    ("{name: linear-warmup, warmup_steps: 5}", "{name: noam, warmup_steps: 3}"),
)


def all_ops(mesh):
    ck = WORK / f"ckpt-all-ops-{mesh}"
    return run(build(ALL_OPS, mesh), "--steps", "3", "--checkpoint-dir", str(ck)), ck


@pytest.fixture(scope="module", autouse=True)
def runs():
    run_many([
        (build(ALL_OPS, "single"), "--steps", "3", "--checkpoint-dir", str(WORK / "ckpt-all-ops-single")),
        (build(ALL_OPS, "two"), "--steps", "3", "--checkpoint-dir", str(WORK / "ckpt-all-ops-two")),
        (build(SPECS / "mlp-dp.yaml", "data=1", MLP_DROPOUT), "--steps", "5"),
        (build(SPECS / "mlp-dp.yaml", None, MLP_DROPOUT), "--steps", "5"),
    ])


@pytest.mark.runs
def test_all_ops_spec_uses_every_operator():
    c = compile_file(ALL_OPS)
    used = {n.op for top in c.graph.layers for n in getattr(top, "layers", (top,))}
    assert set(OPS) - used == {"moe"}  # moe: tests/test_jax_moe.py (the torch target does not run it yet)


def restore_state(directory: Path, step: int) -> dict:
    """A checkpoint's train state as numpy, read on this process's one CPU device."""
    import jax
    import orbax.checkpoint as ocp

    path = os.path.join(directory, str(step), "state")
    checkpointer = ocp.StandardCheckpointer()
    tree = checkpointer.metadata(path).item_metadata
    one = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), tree)
    return jax.tree.map(np.asarray, checkpointer.restore(path, target))


@pytest.mark.slow
def test_all_ops_one_device_equals_two():
    (one, ck1), (two, ck2) = all_ops("single"), all_ops("two")
    dl, dp = max_diff(one.losses, two.losses), max_param_diff(one.params, two.params)
    s1, s2 = restore_state(ck1, 3), restore_state(ck2, 3)
    db = max(float(np.abs(s1["buffers"][k] - s2["buffers"][k]).max()) for k in s1["buffers"])
    report("all-ops: 1 device == data=2 (3 steps)", max_dloss=dl, max_dparam=dp, max_dbuffer=db)
    assert dl < 1e-5 and db < 1e-5
    # Parameters agree to rounding noise, which adam amplifies up to lr where a gradient is zero up to
    # rounding (attention's k.bias: adding a constant to every key's score of a query changes nothing).
    assert dp < 1e-3
    assert len(one.losses) == 3 and np.isfinite(one.losses).all()
    # batch_norm's running statistics moved, and travel in the checkpoint with the step (a repeated
    # block's stacked over its copies, as the train state holds them)
    assert int(s1["step"]) == 3
    plan = compile_file(ALL_OPS).plan
    stacked = [f"{r.name}.*.{b.local}" for r in plan.repeats for b in r.buffers]
    assert sorted(s1["buffers"]) == sorted([b.name for b in plan.top_buffers] + stacked)
    assert s1["buffers"]["blocks.*.bn_seq.running_var"].shape == (2, 8)
    assert not np.allclose(s1["buffers"]["bn.running_mean"], 0)
    assert not np.allclose(s1["buffers"]["blocks.*.bn_seq.running_var"][1], 1)


@pytest.mark.slow
def test_dropout_is_mesh_independent_and_noam():
    one = run(build(SPECS / "mlp-dp.yaml", "data=1", MLP_DROPOUT), "--steps", "5")
    eight = run(build(SPECS / "mlp-dp.yaml", None, MLP_DROPOUT), "--steps", "5")
    dl = max_diff(one.losses, eight.losses)
    report("dropout 0.25 + noam: 1 device == data=8", max_dloss=dl)
    assert dl < 1e-5
    lr, w = 1e-3, 3
    for r in one.metrics:
        t = r["step"] - 1
        assert math.isclose(r["lr"], lr * min((t + 1) ** -0.5, (t + 1) * w**-1.5) * w**0.5, rel_tol=1e-6)


def documented_lr(schedule, lr, steps, t):
    w, m = schedule.warmup_steps, schedule.min_lr_ratio
    if schedule.name == "noam":
        return lr * min((t + 1) ** -0.5, (t + 1) * w**-1.5) * w**0.5
    if w and t < w:
        return lr * (t + 1) / w
    if schedule.name == "cosine":
        return lr * (m + (1 - m) * 0.5 * (1 + math.cos(math.pi * min(1, (t - w) / max(1, steps - w)))))
    return lr


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["mlp-dp.yaml", "mlp-tp.yaml", "cnn-dp.yaml", "gpt-tiny.yaml"])
def test_lr_follows_the_documented_schedule(spec):
    tr = compile_file(SPECS / spec).spec.training
    steps = 10 if spec.startswith("gpt") else 6
    got = run(build(SPECS / spec, "data=1"), "--steps", str(steps))
    for r in got.metrics:
        want = documented_lr(tr.schedule, tr.optimizer.lr, tr.steps, r["step"] - 1)
        assert math.isclose(r["lr"], want, rel_tol=1e-6, abs_tol=1e-12), (r["step"], r["lr"], want)


def numpy_attention(x, p, pre, heads, kv_heads, head_dim, base):
    """docs/program.md "Operators": causal GQA (kv head j // (H/K)), rotate-half rotary, in float64."""
    B, T, _ = x.shape

    def proj(n, count):
        return (x @ p[pre + n + ".weight"] + p[pre + n + ".bias"]).reshape(B, T, count, head_dim)

    def rope(t):
        half = head_dim // 2
        ang = np.arange(T)[:, None] * base ** (-np.arange(half) * 2 / head_dim)[None]
        cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
        a, b = t[..., :half], t[..., half:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    q, k, v = rope(proj("q", heads)), rope(proj("k", kv_heads)), proj("v", kv_heads)
    out = np.zeros((B, T, heads, head_dim))
    for j in range(heads):
        kv = j // (heads // kv_heads)
        s = np.einsum("btd,bsd->bts", q[:, :, j], k[:, :, kv]) / math.sqrt(head_dim)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        out[:, :, j] = np.einsum("bts,bsd->btd", w, v[:, :, kv])
    return out.reshape(B, T, -1) @ p[pre + "o.weight"] + p[pre + "o.bias"]


@pytest.mark.runs
def test_attention_matches_a_numpy_reference():
    """The generated attention (grouped-query, rotary, bias, causal) against the documented conventions."""

    train = load_program(build(ALL_OPS, "single"))
    rng = np.random.default_rng(0)
    pre = "blocks.0.attn."
    p = {n: rng.standard_normal(shape).astype(np.float32) * 0.3 for n, (shape, _, _) in train.PARAMS.items()
         if n.startswith(pre)}
    x = rng.standard_normal((2, 8, 32)).astype(np.float32)
    got = np.asarray(train.attention(x, p, pre, heads=4, head_dim=8, kv_heads=2, causal=True, rotary_base=10000.0,
                                     bias=True))
    want = numpy_attention(x.astype(np.float64), {k: v.astype(np.float64) for k, v in p.items()}, pre, 4, 2, 8,
                           10000.0)
    assert np.abs(got - want).max() < 1e-4
