"""The JAX target's central proofs, on 8 simulated CPU devices.

Equivalence: for every example and every parallelism kind (data, fsdp, tensor and their 2-D and 3-D
combinations), the program built for the parallel mesh and the program built for one device
(`--mesh data=1`) give the same loss trajectory (float32, max abs difference below 1e-5).

Planner truth: the per-device bytes of parameters and optimizer state that `mithril-spec plan` predicts
equal the bytes the running program holds on its first device (the sum of its addressable shards of
every parameter and optimizer-state array with ndim > 0; docs/program.md "Memory report").
"""

from __future__ import annotations

import pytest
from jax_runs import SPECS, build, max_diff, max_param_diff, report, run, run_many

from mithril_spec.frontend import compile_file

GPT_STEPS = 10  # shared with the resume test (10 steps == 5 + 5)
STEPS = 6

# (spec, mesh of the parallel build (None: the spec's default), what it covers). Each axis alone on a
# transformer (data, fsdp, tensor, sequence, pipe, expert, zero), with every training feature, is
# tests/test_capability_matrix.py's; here every example on its default mesh and the 2-D and 3-D meshes.
CASES = [
    ("mlp-dp.yaml", None, "data=8"),
    ("mlp-tp.yaml", None, "data=2 x tensor=4"),
    ("cnn-dp.yaml", None, "data=4"),
    ("cnn-dp.yaml", "data=2,fsdp=4", "data x fsdp"),
    ("gpt-tiny.yaml", None, "data=2 x fsdp=2 x tensor=2"),
    ("gpt-tiny.yaml", "fsdp_tp", "fsdp=2 x tensor=2"),
]


def case_id(case):
    return f"{case[0].split('.')[0]}-{case[2].replace(' ', '')}"


def steps(spec: str) -> int:
    return GPT_STEPS if spec.startswith("gpt") else STEPS


def reference(spec: str):
    return run(build(SPECS / spec, "data=1"), "--steps", str(steps(spec)))


def parallel(spec: str, mesh):
    return run(build(SPECS / spec, mesh), "--steps", str(steps(spec)))


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    """Every run of this module, two at a time (each is memoised for the other tests)."""
    jobs = [(build(SPECS / spec, "data=1"), "--steps", str(steps(spec))) for spec in sorted({c[0] for c in CASES})]
    jobs += [(build(SPECS / spec, mesh), "--steps", str(steps(spec))) for spec, mesh, _ in CASES]
    run_many(jobs)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_equivalence(case):
    spec, mesh, what = case
    ref, par = reference(spec), parallel(spec, mesh)
    assert len(par.losses) == len(ref.losses) == steps(spec) >= 5
    dl = max_diff(par.losses, ref.losses)
    dg = max_diff([r["grad_norm"] for r in par.metrics], [r["grad_norm"] for r in ref.metrics])
    dp = max_param_diff(par.params, ref.params)
    report(f"equivalence {spec} {what}", max_dloss=dl, max_dgrad_norm=dg, max_dparam=dp, steps=steps(spec))
    assert dl < 1e-5, f"{spec} on {what}: losses differ from one device by {dl:.2e}"
    assert [r["step"] for r in par.metrics] == list(range(1, steps(spec) + 1))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_planner_truth(case):
    spec, mesh, what = case
    plan = compile_file(SPECS / spec, mesh).plan
    held = parallel(spec, mesh).memory
    report(f"planner truth {spec} {what}", planned_params=plan.memory.params, held_params=held["device0"]["params"],
           planned_optimizer=plan.memory.optimizer, held_optimizer=held["device0"]["optimizer"])
    assert held["device0"]["params"] == plan.memory.params
    assert held["device0"]["optimizer"] == plan.memory.optimizer
    assert held["device0"]["buffers"] == plan.memory.buffers
    assert held["planned"] == {"params": plan.memory.params, "optimizer": plan.memory.optimizer,
                               "buffers": plan.memory.buffers}


@pytest.mark.slow
def test_single_device_truth():
    """The references too: one device holds everything (adamw/adam: 2 slots, sgd with momentum: 1)."""
    for spec in sorted({c[0] for c in CASES}):
        plan = compile_file(SPECS / spec, "data=1").plan
        held = reference(spec).memory["device0"]
        assert held["params"] == plan.memory.params == 4 * plan.param_count
        assert held["optimizer"] == plan.memory.optimizer
