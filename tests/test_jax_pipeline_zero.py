"""ZeRO in a JAX pipeline (issue 40, item 1; templates/jax/optimizer.py.j2 `zero_layout`).

specs/gpt-pipe.yaml with `training.zero: 1` and `2` on pipe=2 x data=2, 1f1b, ZeRO-2 with gpipe (the circular
pipeline), and ZeRO-1 on the spec's pipe=2 x data=2 x tensor=2 (the copies split over `tensor` too): the pipelined train state's optimizer
state (adamw's moments of the stacked copies, split over `pipe`, and of the layers outside the pipeline) is
split further over `data`, on a dimension of each copy, as the plan counts it (Plan.memory_for). The first
step's gradients equal the one-device build's (docs/program.md "Equivalence"), the losses and gradient norms
of 3 steps too (1e-5), device 0 holds the planned bytes (the optimizer state half of the pipelined build's
without ZeRO), and a resume from the step-2 checkpoint gives the uninterrupted step 3.
"""

from __future__ import annotations

import numpy as np
import pytest
from gradients import assert_same_gradients
from jax_runs import SPECS, WORK, build, max_diff, report, run, run_many, spec_variant
from pipeline_edits import GPIPE

from mithril_spec.frontend import compile_file

GPT_PIPE = SPECS / "gpt-pipe.yaml"
MESH = "pipe=2,data=2"
STEPS = ("--steps", "3")
GRADS = "grads.npz"


def zero(z: int) -> tuple:
    return (("  seed: 0\n", f"  seed: 0\n  zero: {z}\n"),)


# (what, mesh, spec edits); the spec's default mesh splits the copies over `tensor` too
CASES = [("zero 1, 1f1b", MESH, zero(1)), ("zero 2, 1f1b", MESH, zero(2)), ("zero 2, gpipe", MESH, zero(2) + GPIPE),
         ("zero 1, 1f1b, pipe x data x tensor", "default", zero(1))]


def reference():
    return run(build(GPT_PIPE, "single"), *STEPS, "--export-grads", GRADS)


def ckpt(mesh, edits):
    return WORK / f"ckpt-zero-{[c[1:] for c in CASES].index((mesh, edits))}"


def job(mesh, edits) -> tuple:
    """3 steps, the first's gradients exported, a checkpoint after each (orbax: DIR/<step>)."""
    return (build(GPT_PIPE, mesh, edits), *STEPS, "--export-grads", GRADS, "--checkpoint-dir",
            str(ckpt(mesh, edits)), "--checkpoint-every", "1")


def whole(mesh):
    """The pipelined build without ZeRO (one step: its memory line)."""
    return run(build(GPT_PIPE, mesh), "--steps", "1")


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    run_many([(build(GPT_PIPE, "single"), *STEPS, "--export-grads", GRADS),
              *[(build(GPT_PIPE, mesh), "--steps", "1") for mesh in dict.fromkeys(c[1] for c in CASES)],
              *[job(mesh, edits) for _, mesh, edits in CASES]])


def grads_of(r) -> dict:
    return dict(np.load(r.cwd / GRADS))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0].replace(", ", "-").replace(" ", "") for c in CASES])
def test_zero_in_a_jax_pipeline_equals_one_device_and_holds_the_planned_bytes(case):
    what, mesh, edits = case
    ref, got = reference(), run(*job(mesh, edits))
    worst = assert_same_gradients(grads_of(ref), grads_of(got), 1e-5, f"jax pipeline {what}")
    resumed = run(build(GPT_PIPE, mesh, edits), *STEPS, "--resume", str(ckpt(mesh, edits) / "2"), export=False)
    figures = {"loss": max_diff(got.losses, ref.losses),
               "grad_norm": max_diff([r["grad_norm"] for r in got.metrics], [r["grad_norm"] for r in ref.metrics]),
               "resumed step 3": abs(resumed.losses[-1] - got.losses[-1])}
    report(f"jax pipeline {what}", max_rel_dgrad=worst, max_differences=figures, device0=got.memory["device0"])
    assert max(figures.values()) < 1e-5, figures
    assert [r["step"] for r in resumed.metrics] == [3]
    memory = got.memory
    plan = compile_file(spec_variant(GPT_PIPE, edits), mesh).plan.memory_for("jax")
    assert memory["device0"] == {"params": plan.params, "optimizer": plan.optimizer, "buffers": plan.buffers}, (
        memory, plan)
    full = whole(mesh).memory["device0"]
    assert memory["device0"]["optimizer"] * 2 == full["optimizer"], (memory, full)
    assert memory["device0"]["params"] == full["params"], (memory, full)
