"""conv1d, concat and split: their shape rules, and tests/specs/branches.yaml (a multi-branch model that uses
all three) trained in both targets.

- JAX: the data=2 build (2 simulated devices) against the one-device build, 5 steps (losses within 1e-5).
- PyTorch: DDP on 2 gloo ranks against one process, 5 steps (losses within 1e-5).
- Across targets: both one-device programs train 5 steps from the parameters the JAX program exports
  (--init-params); losses within 1e-4, parameters within 1e-3 (as tests/test_cross_target.py); the
  parameters the torch program exports load into the JAX program unchanged (conv1d's canonical layout is
  nn.Conv1d's [filters, channels, k]).
"""

from __future__ import annotations

import concurrent.futures
import textwrap
from pathlib import Path

import jax_runs as jr
import numpy as np
import pytest
import torch_runs as tr

from mithril_spec.frontend import compile_file

BRANCHES = Path(__file__).resolve().parent / "specs" / "branches.yaml"
STEPS = "5"


# ---------------------------------------------------------------- shape rules


def layers_of(tmp_path, layers: str, inputs: str = "x: {shape: [batch, seq, d]}"):
    """The resolved top-level layers of a small spec (cross-entropy on a linear head over the last layer)."""
    text = "\n".join([
        "version: 1",
        "name: t",
        "dims: {seq: 16, d: 32, classes: 3}",
        "model:",
        "  inputs:",
        f"    {inputs}",
        "    y: {shape: [batch], dtype: int32}",
        "  layers:",
        *("    " + line for line in textwrap.dedent(layers).splitlines()),
        "    - {op: flatten, name: flat}",
        "    - {op: linear, name: head, dimension: classes}",
        "  loss: {op: cross_entropy, logits: head, targets: y}",
        "training: {batch_size: 8, steps: 1, optimizer: {name: sgd, lr: 0.1}}",
    ]) + "\n"
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return {n.name: n for n in compile_file(path).graph.layers}


def test_split_reads_a_bert_style_pooler_position(tmp_path):
    got = layers_of(tmp_path, "- {op: split, name: cls, dim: 0, sizes: [1, seq - 1], index: 0, input: x}\n",
                    "x: {shape: [batch, seq, d], axes: [batch, seq, embed]}")
    cls = got["cls"]
    assert cls.out.shape == (1, 32) and cls.out.axes == (None, "embed")
    assert cls.attrs == {"dim": 0, "start": 0, "stop": 1} and cls.params == () and cls.flops == 0


def test_split_pieces_and_concat_join_them(tmp_path):
    got = layers_of(tmp_path, """\
        - {op: split, name: a, sizes: [d / 4, 3 * d / 4], index: 1, input: x}
        - {op: split, name: b, dim: -1, sizes: [d / 4, 3 * d / 4], index: 0, input: x}
        - {op: concat, name: c, dim: 1, inputs: [a, b, a]}
        """, "x: {shape: [batch, seq, d], axes: [batch, seq, embed]}")
    assert got["a"].out.shape == (16, 24) and got["a"].attrs == {"dim": 1, "start": 8, "stop": 32}
    assert got["b"].out.shape == (16, 8) and got["b"].attrs["start"] == 0
    c = got["c"]
    assert c.out.shape == (16, 56) and c.out.axes == ("seq", None) and c.out.dtype == "float32"
    assert c.attrs == {"dim": 1, "n": 3} and c.params == ()


def test_conv1d_shapes_parameters_and_flops(tmp_path):
    got = layers_of(tmp_path, """\
        - {op: conv1d, name: c, filters: 8, kernel_size: 3, stride: 2, padding: same, axis: ch, input: x}
        """, "x: {shape: [batch, d, seq], axes: [batch, embed, seq]}")
    c = got["c"]
    assert c.out.shape == (8, 8) and c.out.axes == ("ch", None)  # (16 + 2 - 3) // 2 + 1 = 8
    assert [(p.name, p.shape, p.axes) for p in c.params] == [
        ("weight", (8, 32, 3), ("ch", "embed", None)), ("bias", (8,), ("ch",))]
    assert c.flops == 2 * 32 * 3 * 8 * 8


# ---------------------------------------------------------------- runs


def jax_program(mesh):
    return jr.build(BRANCHES, mesh)


def torch_program(mesh):
    return tr.build(BRANCHES, mesh)


def init_file() -> Path:
    return jr.run(jax_program("single"), "--steps", "0").cwd / "params.npz"


def jax_from_init():
    return jr.run(jax_program("single"), "--steps", STEPS, "--init-params", str(init_file()))


def torch_from_init():
    return tr.run(torch_program("single"), "--steps", STEPS, "--init-params", str(init_file()))


def jax_reload():
    """The JAX program loads what the torch program exported and exports it again."""
    return jr.run(jax_program("single"), "--steps", "0", "--init-params", str(torch_from_init().cwd / "params.npz"))


def _parallel(calls):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


@pytest.fixture(scope="module")
def runs():
    """Every run of this module, two at a time (memoised)."""
    _parallel([
        lambda: jr.run(jax_program("single"), "--steps", STEPS),
        lambda: jr.run(jax_program("two"), "--steps", STEPS),
        lambda: tr.run(torch_program("single"), "--steps", STEPS),
        lambda: tr.run(torch_program("two"), "--steps", STEPS),
        init_file,
    ])
    _parallel([jax_from_init, torch_from_init])
    jax_reload()


@pytest.mark.slow
def test_jax_data2_equals_one_device(runs):
    one = jr.run(jax_program("single"), "--steps", STEPS)
    two = jr.run(jax_program("two"), "--steps", STEPS)
    assert len(one.losses) == len(two.losses) == int(STEPS) and np.isfinite(one.losses).all()
    dl, dp = jr.max_diff(one.losses, two.losses), jr.max_param_diff(one.params, two.params)
    jr.report("branches (conv1d, split, concat): jax data=2 vs 1 device", max_dloss=dl, max_dparam=dp)
    assert dl < 1e-5, f"losses differ by {dl:.2e}"
    assert dp < 1e-4


@pytest.mark.slow
def test_torch_ddp_two_ranks_equals_one_process(runs):
    one = tr.run(torch_program("single"), "--steps", STEPS)
    two = tr.run(torch_program("two"), "--steps", STEPS)
    assert tr.world_of(torch_program("two")) == 2
    assert len(one.losses) == len(two.losses) == int(STEPS)
    dl, dp = tr.max_diff(one.losses, two.losses), tr.max_param_diff(one.params, two.params)
    tr.report("branches (conv1d, split, concat): torch DDP 2 ranks vs 1 process", max_dloss=dl, max_dparam=dp)
    assert dl < 1e-5, f"losses differ by {dl:.2e}"
    assert dp < 1e-4


@pytest.mark.slow
def test_cross_target_same_losses_from_the_same_parameters(runs):
    t, j = torch_from_init(), jax_from_init()
    assert len(t.losses) == len(j.losses) == int(STEPS)
    dl, dp = tr.max_diff(t.losses, j.losses), tr.max_param_diff(t.params, j.params)
    tr.report("branches (conv1d, split, concat): torch vs jax", max_dloss=dl, max_dparam_after_5_steps=dp)
    assert dl < 1e-4, f"torch and jax losses differ by {dl:.2e}"
    assert dp < 1e-3
    back = jax_reload().params
    assert sorted(back) == sorted(t.params)
    assert max(float(np.abs(back[k] - t.params[k]).max()) for k in back) == 0.0
