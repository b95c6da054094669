"""Across targets: the JAX and the PyTorch programs of one spec compute the same thing.

For the MLP, the CNN, the GPT and the mixture-of-experts examples (and tests/specs/all-ops.yaml, every
operator), both built for one device / process: the JAX program exports its initial parameters
(--steps 0 --export-params), both programs train 5 steps from that file (--init-params) on the same
data, and their losses agree (max abs difference below 1e-4). Then the parameters the PyTorch program exports after training load into the JAX
program (--init-params, --steps 0 --export-params) and come back unchanged: the canonical names and
layouts are the same in both targets (nn.Linear's [out, in] weights are transposed at the boundary).
"""

from __future__ import annotations

import concurrent.futures

import jax_runs as jr
import numpy as np
import pytest
import torch_runs as tr

SPECS = ["mlp-dp.yaml", "cnn-dp.yaml", "gpt-tiny.yaml", "moe-dp.yaml", "all-ops"]
STEPS = 5


def spec_path(spec):
    return tr.TESTS / "specs" / "all-ops.yaml" if spec == "all-ops" else tr.SPECS / spec


def mesh(spec):
    return "single" if spec == "all-ops" else "data=1"


def programs(spec):
    return jr.build(spec_path(spec), mesh(spec)), tr.build(spec_path(spec), mesh(spec))


def init_file(spec):
    return jr.run(programs(spec)[0], "--steps", "0").cwd / "params.npz"


def torch_run(spec):
    return tr.run(programs(spec)[1], "--steps", str(STEPS), "--init-params", str(init_file(spec)))


def jax_run(spec):
    return jr.run(programs(spec)[0], "--steps", str(STEPS), "--init-params", str(init_file(spec)))


def jax_reload(spec):
    """The JAX program loads what the torch program exported and exports it again."""
    return jr.run(programs(spec)[0], "--steps", "0", "--init-params", str(torch_run(spec).cwd / "params.npz"))


def _parallel(calls):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    _parallel([lambda s=s: init_file(s) for s in SPECS])
    _parallel([f for s in SPECS for f in (lambda s=s: torch_run(s), lambda s=s: jax_run(s))])
    _parallel([lambda s=s: jax_reload(s) for s in SPECS])


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS)
def test_same_losses_from_the_same_parameters(spec):
    t, j = torch_run(spec), jax_run(spec)
    assert len(t.losses) == len(j.losses) == STEPS
    dl = tr.max_diff(t.losses, j.losses)
    dp = tr.max_param_diff(t.params, j.params)
    tr.report(f"cross-target {spec}: torch vs jax", max_dloss=dl, max_dparam_after_5_steps=dp)
    assert dl < 1e-4, f"{spec}: torch and jax losses differ by {dl:.2e}"
    assert dp < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS)
def test_torch_export_loads_into_jax(spec):
    exported = torch_run(spec).params
    back = jax_reload(spec).params
    assert sorted(exported) == sorted(back)
    for name in exported:
        assert exported[name].shape == back[name].shape and exported[name].dtype == np.float32
    d = tr.max_param_diff(exported, back)
    tr.report(f"cross-target {spec}: torch export -> jax -> export", max_dparam=d)
    assert d == 0.0
