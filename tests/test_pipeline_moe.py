"""Mixture-of-experts layers on some pipeline stages only, on none and on all (torch and jax): three explicit
stages on pipe=3, 1F1B over 4 micro-batches, plain SGD. Each equals the one-process build of the same spec (which
runs the pipeline's micro-batches one after the other) at the gradient level (docs/program.md
"Equivalence"): the first step's gradients and the losses. (A stage without moe layers once ended every
rank at step 1: its load-balancing loss was the int 0.)

The jax program stacks each block's copies apart (a `dense` stack, a `sparse` stack), each stage holding as
many rows of each as the stage with the most copies of it, and runs its own copies (lax.switch on the stage):
device 0 holds the bytes the plan counts for it (Plan.memory_for). The gpipe schedule (the circular pipeline)
and interleaved (pipe=2 x 2 virtual stages) run it too, so does ZeRO-1 on pipe=3 x data=2 x tensor=2 (AdamW) and a stage
running copies of both blocks (pipe=2), and a checkpoint of the stacks resumes exactly."""

from __future__ import annotations

import concurrent.futures

import jax_runs as jr
import numpy as np
import pytest
import torch_runs as tr
from gradients import assert_same_gradients
from pipeline_edits import GPIPE

from mithril_spec.frontend import compile_file

SPEC = tr.TESTS / "specs" / "moe-stages.yaml"
WHERE = {  # which stages hold moe layers -> edits of the spec's blocks
    "stage 1 only": (),
    "none": (("block: sparse", "block: dense"),),
    "all": (("block: dense", "block: sparse"),),
}
ARGS = ("--steps", "3", "--export-grads", "grads.npz")
BUILD = {"torch": tr.build, "jax": jr.build}
RUN = {"torch": tr.run, "jax": jr.run}
# interleaved: pipe=2 x 2 virtual stages, the same four stages (ranks 0, 1, 0, 1; ln_f and lm_head on stage 3)
INTERLEAVED = (("default: {pipe: 3}", "default: {pipe: 2}"),
               ("schedule: 1f1b}", "schedule: interleaved, virtual_stages: 2}"),
               ("{op: layer_norm, name: ln_f}", "{op: layer_norm, name: ln_f, stage: 3}"))
# ZeRO-1 over data=2 beside the pipe and tensor=2 (adamw: an optimizer state to split; the plan's bytes halve
# it). (Unpinned, the stacked rows' gradients took ZeRO's layout inside the stages' lax.switch: a deadlock.)
ZERO = (("default: {pipe: 3}", "default: {pipe: 3, data: 2, tensor: 2}"),
        ("pipeline: {", "sharding: {rules: {heads: tensor, kv_heads: tensor, mlp: tensor}}\npipeline: {"),
        ("optimizer: {name: sgd, lr: 0.5}, seed: 0}", "optimizer: {name: adamw, lr: 1.0e-3}, seed: 0, zero: 1}"))
# two stages on pipe=2, the second running copies of both blocks: 2 sparse, then `last`'s dense one
MIXED = (("default: {pipe: 3}", "default: {pipe: 2}"), (", stage: 2}", ", stage: 1}"))
CASES = [(t, w, ()) for t in ("torch", "jax") for w in WHERE] + [("jax", "stage 1 only", GPIPE),
                                                                 ("jax", "stage 1 only", INTERLEAVED),
                                                                 ("jax", "stage 1 only", ZERO),
                                                                 ("jax", "stage 1 only", MIXED)]
LABEL = {(): "1f1b", GPIPE: "gpipe", INTERLEAVED: "interleaved", ZERO: "zero1-data2-tensor2", MIXED: "mixed-stage"}
CKPT = ("--steps", "3", "--checkpoint-every", "1")  # (the jax stage-1-only run's checkpoints: resumed below)


def runs(target, where, more=()):
    edits = WHERE[where] + more
    return BUILD[target](SPEC, "data=1", edits), BUILD[target](SPEC, None, edits)


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pool.submit(tr.run_many, [(program, *ARGS) for w in WHERE for program in runs("torch", w)])
        jr.run_many([(program, *ARGS) for t, w, more in CASES if t == "jax" for program in runs(t, w, more)]
                    + [(runs("jax", "stage 1 only")[1], *CKPT, "--checkpoint-dir", str(jr.WORK / "ckpt-moe-stages"))])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[f"{t}-{w.replace(' ', '_')}-{LABEL[m]}" for t, w, m in CASES])
def test_moe_on_some_pipeline_stages_equals_one_process(case):
    target, where, more = case
    one, pipe = (RUN[target](program, *ARGS) for program in runs(target, where, more))
    grads = [dict(np.load(r.cwd / "grads.npz")) for r in (one, pipe)]
    dg = assert_same_gradients(*grads, 1e-5, f"{target}: moe on {where}")
    dl = float(np.abs(pipe.losses - one.losses).max())
    jr.report(f"pipeline moe on {where} ({target}, {LABEL[more]})", max_rel_dgrad=dg, max_dloss=dl)
    assert dl < 1e-5, (pipe.losses, one.losses)
    assert any(k.startswith("middle.") and ".ffn.experts" in k for k in grads[0]) == (where != "none")
    if target == "jax":
        plan = compile_file(jr.spec_variant(SPEC, WHERE[where] + more)).plan.memory_for("jax")
        assert pipe.memory["device0"] == {"params": plan.params, "optimizer": plan.optimizer,
                                          "buffers": plan.buffers}, (pipe.memory, plan)


@pytest.mark.slow
def test_jax_stages_of_several_blocks_resume_exactly():
    """The stacks of each block (STACK_ORDERS, which the checkpoint records) resume at step 2 on the trajectory."""
    program = runs("jax", "stage 1 only")[1]
    ck = jr.WORK / "ckpt-moe-stages"
    first = jr.run(program, *CKPT, "--checkpoint-dir", str(ck))
    resumed = jr.run(program, "--steps", "3", "--resume", str(ck / "2"), export=False)
    assert [r["step"] for r in resumed.metrics] == [3]
    d = abs(resumed.losses[-1] - first.losses[-1])
    jr.report("pipeline moe on stage 1 only (jax): resumed step 3", dloss=d)
    assert d < 1e-6, (resumed.losses, first.losses)
