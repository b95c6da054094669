"""float16 compute with loss scaling (training.precision.loss_scale; docs/program.md "Loss scaling"), in the
JAX and PyTorch targets.

tests/specs/gpt-fp16.yaml starts at a loss scale of 2^40 with a backoff of 2^-12 and a growth interval of
3, so that 7 steps show every rule: steps 1 and 2 overflow (2^40, 2^28) and are skipped, step 3 trains at
2^16, and after 3 finite steps in a row the scale doubles (steps 6 and 7 at 2^17). Both targets, on one
device and on two (PyTorch: DDP, FSDP2 with accumulation, a 1f1b pipeline; JAX: a 1f1b pipeline with
accumulation), must skip the same steps, leave the parameters untouched by them, and otherwise train as
their one-device build does (float16 tolerance, below). A resumed run continues the scale and its counters
exactly. Then the spec's settings: what the programs run, and the diagnostics of bad values.
"""

from __future__ import annotations

from pathlib import Path

import jax_runs
import numpy as np
import pytest
import torch_runs

from mithril_spec.diagnostics import DiagnosticError
from mithril_spec.frontend import compile_document
from mithril_spec.source import load_text

SPEC = Path(__file__).resolve().parent / "specs" / "gpt-fp16.yaml"
STEPS = 7
# the scale each step's loss is multiplied by, and the steps skipped so far (docs/program.md "Metrics")
SCALES = [2.0**40, 2.0**28, 2.0**16, 2.0**16, 2.0**16, 2.0**17, 2.0**17]
SKIPPED = [1, 2, 2, 2, 2, 2, 2]
# The parallel builds compute in float16 (rounding at 2^-11 = 4.9e-4 relative) over other splits of the
# batch, in another order (and FSDP2 casts the gathered parameters where the one-process build autocasts):
# the losses (about 4.2, float32 means of float16 logits) differ by 1.2e-5 at most (measured), the
# parameters by 5e-4: Adam moves a parameter by up to about lr (1e-3) per update whatever its gradient's
# size, so a near-zero gradient rounded to another float16 value can move it differently. The bounds leave
# a margin of about 4x; the skip decisions must not differ at all.
LOSS_TOL = 5e-5
PARAM_TOL = 2e-3


ACCUM = (("  batch_size: 8\n", "  batch_size: 8\n  grad_accum: 2\n"),)  # two micro-batches a step
PIPE = (("\nsharding:", "\npipeline: {microbatches: 2, schedule: 1f1b}\n\nsharding:"),)  # on pipe=2
# (target, mesh, spec edits): the parallel builds compared with the one-device build
PARALLEL = [
    ("torch", "data=2", ()),  # DDP
    ("torch", "fsdp=2", ACCUM),  # FSDP2 (DTensor gradients, MixedPrecisionPolicy), accumulation
    ("torch", "pipe=2", PIPE),  # torch.distributed.pipelining: the schedule runs the backward pass
    # one JAX program (each costs a compilation): the 1f1b pipeline's own backward pass, with accumulation
    ("jax", "pipe=2", PIPE + ACCUM),
]


def torch_run(mesh, *args, edits=()):
    return torch_runs.run(torch_runs.build(SPEC, mesh, edits), "--steps", str(STEPS), *args)


def jax_run(mesh, *args, edits=()):
    return jax_runs.run(jax_runs.build(SPEC, mesh, edits), "--steps", str(STEPS), *args)


def ckpt(target):
    return (torch_runs.WORK if target == "torch" else jax_runs.WORK) / "ckpt-fp16"


@pytest.fixture(scope="module")
def all_runs():
    """The program runs of this module, each target's two at a time (memoised for the tests)."""
    torch_runs.run_many([
        (torch_runs.build(SPEC, "data=1"), "--steps", str(STEPS), "--checkpoint-dir", str(ckpt("torch")),
         "--checkpoint-every", "4"),
        *[(torch_runs.build(SPEC, mesh, edits), "--steps", str(STEPS)) for t, mesh, edits in PARALLEL
          if t == "torch"],
        (torch_runs.build(SPEC, "data=1"), "--steps", "2"),
        (torch_runs.build(SPEC, "data=1"), "--steps", "0"),
    ])
    jax_runs.run_many([
        (jax_runs.build(SPEC, "data=1"), "--steps", str(STEPS), "--checkpoint-dir", str(ckpt("jax")),
         "--checkpoint-every", "4"),
        *[(jax_runs.build(SPEC, mesh, edits), "--steps", str(STEPS)) for t, mesh, edits in PARALLEL if t == "jax"],
        (jax_runs.build(SPEC, "data=1"), "--steps", "2"),
    ])


def reference(target):
    run = torch_run if target == "torch" else jax_run
    return run("data=1", "--checkpoint-dir", str(ckpt(target)), "--checkpoint-every", "4")


def scaler_rows(run):
    return [r["loss_scale"] for r in run.metrics], [r["skipped_steps"] for r in run.metrics]


@pytest.mark.runs
@pytest.mark.usefixtures("all_runs")
@pytest.mark.parametrize("target", ["torch", "jax"])
def test_skips_backs_off_and_grows(target):
    """Overflowing steps are skipped and back the scale off; 3 finite ones in a row grow it; the lr
    schedule counts updates (it waits through the skipped steps); the console says which steps it skipped;
    the memory report (after the first update) is the plan's."""
    run = reference(target)
    assert scaler_rows(run) == (SCALES, SKIPPED)
    assert all(np.isfinite(run.losses))  # (random tokens: nothing to learn in 7 steps)
    lrs = [r["lr"] for r in run.metrics]
    # cosine with 4 warmup steps: the first update (step 3) runs at lr / 4, the next at 2 lr / 4, ...
    assert lrs[:5] == pytest.approx([2.5e-4, 2.5e-4, 2.5e-4, 5e-4, 7.5e-4], rel=1e-6)
    lines = [line for line in run.output.splitlines() if line.startswith("step ")]
    assert [("skipped: non-finite gradients" in line) for line in lines] == [True, True] + [False] * 5, lines
    assert "at loss scale 1.09951e+12" in lines[0] and "at loss scale 2.68435e+08" in lines[1]
    memory = run.memory
    for held in memory.get("ranks", [memory["device0"]]):
        assert held == memory["planned"]


@pytest.mark.runs
@pytest.mark.usefixtures("all_runs")
def test_the_targets_agree():
    """The same skips in both targets (above), and the same trajectory up to float16 rounding: the two
    frameworks' float16 kernels sum in other orders (measured: 9e-6 apart at most over the 7 steps)."""
    dl = torch_runs.max_diff(reference("torch").losses, reference("jax").losses)
    torch_runs.report("loss scaling torch vs jax", max_dloss=dl)
    assert dl < 1e-4, dl


@pytest.mark.runs
@pytest.mark.usefixtures("all_runs")
@pytest.mark.parametrize("target", ["torch", "jax"])
def test_skipped_steps_leave_the_parameters(target):
    """After 2 skipped steps the parameters are the initial ones, bit for bit."""
    initial = torch_runs.run(torch_runs.build(SPEC, "data=1"), "--steps", "0").params
    if target == "torch":
        after = torch_runs.run(torch_runs.build(SPEC, "data=1"), "--steps", "2").params
    else:
        after = jax_runs.run(jax_runs.build(SPEC, "data=1"), "--steps", "2").params
    assert sorted(after) == sorted(initial)
    for name in initial:
        np.testing.assert_array_equal(after[name], initial[name], err_msg=name)


@pytest.mark.usefixtures("all_runs")
@pytest.mark.parametrize(("target", "mesh", "edits"), PARALLEL,
                         ids=[f"{t}-{m}{'-accum' if ACCUM[0] in e else ''}" for t, m, e in PARALLEL])
@pytest.mark.runs
def test_parallel_build_equals_one_device(target, mesh, edits):
    """The same skip pattern and scales on two devices, and the trajectory of one within float16 rounding."""
    ref = reference(target)
    par = (torch_run if target == "torch" else jax_run)(mesh, edits=edits)
    assert scaler_rows(par) == scaler_rows(ref) == (SCALES, SKIPPED)
    dl = torch_runs.max_diff(par.losses, ref.losses)
    dp = torch_runs.max_param_diff(par.params, ref.params)
    torch_runs.report(f"loss scaling {target} {mesh} vs one device", max_dloss=dl, max_dparam=dp)
    assert dl < LOSS_TOL and dp < PARAM_TOL, (dl, dp)
    if not mesh.startswith("pipe"):  # (the plan counts a pipeline's fullest rank)
        memory = par.memory  # the scaler adds no tensor: every rank holds what the plan says
        assert all(held == memory["planned"] for held in memory.get("ranks", [memory["device0"]]))


@pytest.mark.runs
@pytest.mark.usefixtures("all_runs")
@pytest.mark.parametrize("target", ["torch", "jax"])
def test_resume_continues_the_scale(target):
    """Resumed from step 4 (2 finite steps counted towards growth), the run grows the scale after step 5 as
    the uninterrupted one does, and ends with the same parameters."""
    ref = reference(target)
    where = ckpt(target) / ("step_00000004" if target == "torch" else "4")
    resumed = (torch_run if target == "torch" else jax_run)("data=1", "--resume", str(where))
    assert scaler_rows(resumed) == (SCALES[4:], SKIPPED[4:])
    assert torch_runs.max_diff(resumed.losses, ref.losses[4:]) == 0
    assert torch_runs.max_param_diff(resumed.params, ref.params) == 0


# ---------------------------------------------------------------------------------------- the spec

BASE = """version: 1
name: s
dims: {d: 8}
model:
  inputs:
    x: {shape: [batch, d]}
    y: {shape: [batch, d]}
  layers:
    - {op: linear, name: fc, dimension: d}
  loss: {op: mse, predictions: fc, targets: y}
training:
  batch_size: 4
  steps: 2
  optimizer: {name: sgd, lr: 0.1}
  precision:
"""


def diagnostics(precision: str):
    try:
        compile_document(load_text(BASE + "".join(f"    {line}\n" for line in precision.splitlines()), "s.yaml"))
    except DiagnosticError as e:
        return [(d.code, d.pos.line, d.pos.col, d.message) for d in e.diagnostics]
    return []


@pytest.mark.parametrize(("precision", "loss_scaling"), [
    ("compute: float16", {"dynamic": True, "init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                          "growth_interval": 2000}),
    ("compute: float16\nloss_scale: 1024", {"dynamic": False, "init_scale": 1024.0, "growth_factor": 2.0,
                                             "backoff_factor": 0.5, "growth_interval": 2000}),
    ("compute: float16\nloss_scale: none", None),
    ("compute: bfloat16", None),
    ("compute: bfloat16\nloss_scale: none", None),
    ("compute: float16\nscaler: {growth_interval: 5, init_scale: 8}",
     {"dynamic": True, "init_scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 5}),
])
def test_what_the_programs_run(precision, loss_scaling):
    doc = load_text(BASE + "".join(f"    {line}\n" for line in precision.splitlines()), "s.yaml")
    assert compile_document(doc).spec.training.precision.loss_scaling() == loss_scaling


@pytest.mark.parametrize(("precision", "col", "says"), [
    ("compute: bfloat16\nloss_scale: dynamic", 17, "loss scaling is for float16 compute"),
    ("loss_scale: 128", 17, "loss scaling is for float16 compute"),
    ("compute: float16\nloss_scale: dynamc", 17, "expected `dynamic`, `none` or a number"),
    ("compute: float16\nloss_scale: 0", 17, "expected `dynamic`, `none` or a number"),
    ("compute: float16\nloss_scale: 1.0e39", 17, "expected `dynamic`, `none` or a number"),
    ("compute: float16\nloss_scale: 64\nscaler: {growth_interval: 10}", 13, "write `loss_scale: dynamic`"),
    ("compute: float32\nscaler: {growth_interval: 10}", 13, "the loss scaler is for float16 compute"),
    ("compute: float16\nscaler: {growth_interval: 0}", 31, "greater than 0"),
    ("compute: float16\nscaler: {growth_factor: 1}", 29, "greater than 1"),
    ("compute: float16\nscaler: {backoff_factor: 1.5}", 30, "less than 1"),
])
def test_bad_settings_are_e013_at_the_value(precision, col, says):
    found = diagnostics(precision)
    assert len(found) == 1, found
    code, line, column, message = found[0]
    assert code == "E013" and says in message, found
    assert (line, column) == (len(BASE.splitlines()) + len(precision.splitlines()), col), found
