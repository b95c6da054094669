"""The capability matrix (mithril_spec/targets/matrix.py): every kind of parallelism x every training
feature on one tiny transformer, for every target.

For each cell a target accepts (its `validate` checks pass), the program built for the cell's mesh runs 3
steps and equals the program built for one device from the same model and training settings (float32:
losses within 1e-5; bfloat16 compute: within the rounding of 16-bit activations), and holds the bytes of
parameters, gradients, optimizer state and buffers the plan predicts. For each cell it refuses, the refusal
is an E049 with a reason, and docs/targets.md's matrix (generated from the same registry) shows it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import numpy as np
import pytest
import torch_runs as tr
from gradients import assert_same_gradients
from program_files import program_text

from mithril_spec.frontend import compile_file
from mithril_spec.lowering import matrix as mx
from mithril_spec.targets import TARGETS

STEPS = "3"
CELLS = mx.cells(list(TARGETS))
ACCEPTED = [(c, t) for c in CELLS for t in TARGETS if t not in c.refusals]


def spec_file(spec: dict) -> Path:
    """The spec written once as a file (JSON is YAML), named by its content."""
    text = json.dumps(spec, indent=1)
    path = jr.WORK / "matrix" / f"matrix-{hashlib.sha1(text.encode()).hexdigest()[:12]}.yaml"
    path.parent.mkdir(exist_ok=True)
    if not path.exists():
        path.write_text(text)
    return path


def reference_spec(spec: dict) -> dict:
    """The spec's model and training settings without its parallelism (no rules, zero). A pipeline section
    stays: built for one device it runs the same pipeline micro-batches one after the other, the program a
    pipelined build equals (docs/program.md "Pipeline stages"; batch_norm normalises each pipeline
    micro-batch with its own statistics, where a build without the section takes the whole micro-batch's)."""
    spec = json.loads(json.dumps(spec))
    spec.pop("sharding", None)
    spec["training"].pop("zero", None)
    return spec


# Runs are shared: per (parallelism, target), the cells a target accepts run as two programs, one with every
# accepted feature at once (they add up: grad accumulation, full remat, batch statistics, dropout, experts)
# and one in bfloat16 (which the others' 1e-5 bound would not fit), each against its one-device build; the
# cell without a feature reads the first. A bundle the target refuses as a whole runs cell by cell. (Each cell
# is still a test of its own.) So the matrix costs 2 runs and their references per row and target.
def bundle(cell: mx.Cell, target: str) -> tuple:
    if cell.feature.startswith("bfloat16"):
        return (cell.feature,)  # (the "none" cell runs with the added-up features: the same code with more)
    return tuple(c.feature for c in CELLS if c.parallelism == cell.parallelism and target not in c.refusals
                 and not c.feature.startswith("bfloat16") and c.feature != "none")


def cell_run_spec(cell: mx.Cell, target: str) -> dict:
    return _run_spec(cell.parallelism, cell.feature, target)


@functools.cache
def _run_spec(parallelism: str, feature: str, target: str) -> dict:
    """(Memoised: the fixture and each test ask, and a bundle's refusal check compiles the spec.)"""
    cell = next(c for c in CELLS if (c.parallelism, c.feature) == (parallelism, feature))
    features = bundle(cell, target)
    spec = mx.cell_spec(cell.parallelism, features)
    if len(features) > 1 and mx.refusal(spec, cell.mesh, target) is not None:
        return cell.spec
    return spec


def ranks(mesh: str) -> int:
    return int(np.prod([int(kv.split("=")[1]) for kv in mesh.split(",")]))


def job(target: str, spec: dict, mesh: str) -> tuple:
    """(target, program, ranks, train.py arguments...)"""
    path = spec_file(spec)
    build = {"torch": tr.build, "jax": jr.build, "mlx": mr.build}[target]
    return (target, build(path, mesh), ranks(mesh), "--steps", STEPS)


def execute(j: tuple):
    kind, program, processes, *args = j
    if kind == "torch":
        return tr.run(program, *args)
    if kind == "jax":
        return jr.run(program, *args)
    return mr.run(program, *args, processes=processes)


def sgd_spec(spec: dict) -> dict:
    """The spec trained by plain SGD (no momentum, clipping or weight decay): its update is the gradient times
    the lr, so a wrong gradient scale shows in the losses (AdamW's update hardly sees one)."""
    spec = json.loads(json.dumps(spec))
    spec["training"]["optimizer"] = {"name": "sgd", "lr": 0.5}
    return spec


def jobs_of(cell: mx.Cell, target: str, sgd: bool = False) -> tuple[tuple, tuple]:
    """The cell's reference (one device) and parallel runs: AdamW, or plain SGD writing its first step's
    gradients (grads.npz in the run's directory)."""
    spec = cell_run_spec(cell, target)
    if sgd:
        spec = sgd_spec(spec)
    extra = ("--export-grads", GRADS) if sgd else ()
    return (job(target, reference_spec(spec), "data=1") + extra, job(target, spec, cell.mesh) + extra)


GRADS = "grads.npz"  # (relative: in the run's own directory)


def grads_of(run) -> dict:
    return dict(np.load(run.cwd / GRADS))


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    """Every run, two at a time (memoised: each test then reads its two runs)."""
    import concurrent.futures

    only = os.environ.get("MATRIX_TARGETS")  # (a subset, for debugging)
    todo = list(dict.fromkeys(j for c, t in ACCEPTED if not only or t in only.split(",")
                              for sgd in (False, True) for j in jobs_of(c, t, sgd)))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(execute, todo))


def cell_id(ct):
    c, t = ct
    return f"{t}-{c.parallelism}-{c.feature.replace(' ', '_')}"


@pytest.mark.slow
@pytest.mark.parametrize("ct", ACCEPTED, ids=cell_id)
def test_accepted_cell_runs_equal_and_holds_the_plan(ct):
    cell, target = ct
    ref_job, par_job = jobs_of(cell, target)
    ref, par = execute(ref_job), execute(par_job)
    assert len(par.losses) == len(ref.losses) == int(STEPS)
    dl = float(np.abs(par.losses - ref.losses).max())
    tol = tolerance(cell)
    jr.report(f"matrix {target} {cell.parallelism} x {cell.feature}", max_dloss=dl, mesh=cell.mesh)
    assert dl < tol, f"{target} {cell.parallelism} x {cell.feature} on {cell.mesh}: losses differ by {dl:.2e}"

    plan = compile_file(spec_file(cell_run_spec(cell, target)), cell.mesh).plan.memory_for(target)
    planned = {"params": plan.params, "grads": plan.grads, "optimizer": plan.optimizer, "buffers": plan.buffers}
    held = par.memory
    if target == "torch":
        every = held["ranks"]
        if "pipe=" in cell.mesh:  # the plan's figure is the fullest rank's
            every = [max(every, key=lambda r: sum(r.values()))]
        for rank, h in enumerate(every):
            assert h == planned, f"rank {rank} holds {h}, the plan says {planned}"
    else:  # jax and mlx report device 0 (without gradients, which live inside the step)
        h = held["device0"]
        assert {k: h[k] for k in ("params", "optimizer", "buffers")} == {
            k: planned[k] for k in ("params", "optimizer", "buffers")}, (h, planned)


def tolerance(cell: mx.Cell) -> float:
    return 2e-2 if cell.feature.startswith("bfloat16") else 1e-5  # 16-bit activations: reduction order shows


def assert_same_sgd(ref, par, tol: float, what: str) -> tuple[float, float]:
    """The gradient contract (docs/program.md "Equivalence"): the first step's gradients and the plain-SGD
    losses of the parallel run equal the one-device run's."""
    assert len(par.losses) == len(ref.losses) == int(STEPS)
    worst = assert_same_gradients(grads_of(ref), grads_of(par), tol, what)
    dl = float(np.abs(par.losses - ref.losses).max())
    assert dl < tol, f"{what}: plain-SGD losses differ by {dl:.2e}: {par.losses} vs {ref.losses}"
    return worst, dl


@pytest.mark.slow
@pytest.mark.parametrize("ct", ACCEPTED, ids=cell_id)
def test_accepted_cell_computes_the_one_device_gradient(ct):
    """The contract on the quantity that matters: the first step's gradients, and plain-SGD losses."""
    cell, target = ct
    ref_job, par_job = jobs_of(cell, target, sgd=True)
    what = f"{target} {cell.parallelism} x {cell.feature} on {cell.mesh}"
    dg, dl = assert_same_sgd(execute(ref_job), execute(par_job), tolerance(cell), what)
    jr.report(f"matrix-sgd {target} {cell.parallelism} x {cell.feature}", max_rel_dgrad=dg, max_dloss=dl, mesh=cell.mesh)


# The test of the test: a parallel program whose update steps on one parameter's gradient times 2 (as torch's
# expert layers once did) fails the gradient contract, in every target. (Its AdamW losses would not show it.)
SCALED = "lm_head.weight"  # (in every cell's model)
INJECT = {  # target -> (a line of train.py, the line to put before it)
    "torch": ("        if args.export_grads and step == start:",
              f"        dict(model.named_parameters())[{SCALED!r}].grad.mul_(2)  # INJECTED FAULT"),
    "jax": ("        grad_norm = optax.global_norm(grads)",
            f"        grads = {{**grads, {SCALED!r}: grads[{SCALED!r}] * 2}}  # INJECTED FAULT"),
    "mlx": ("    grad_norm = global_norm(grads)  # before clipping",
            f"    grads = {{**grads, {SCALED!r}: grads[{SCALED!r}] * 2}}  # INJECTED FAULT"),
}
WRONG = {"torch": "data", "jax": "fsdp", "mlx": "tensor"}  # the parallel cell each target's fault goes into


@pytest.mark.slow
@pytest.mark.parametrize("target", list(INJECT))
def test_a_doubled_gradient_fails_the_contract(target):
    import shutil

    cell = next(c for c in CELLS if c.parallelism == WRONG[target] and c.feature == "none")
    ref_job, par_job = jobs_of(cell, target, sgd=True)
    kind, program, processes, *args = par_job
    wrong = program.parent / f"{program.name}-injected"
    if not wrong.exists():
        shutil.copytree(program, wrong)
        code = program_text(wrong)
        line, fault = INJECT[target]
        assert code.count(line) == 1, f"{target}: the injection point moved: {line!r}"
        (wrong / "train.py").write_text(code.replace(line, f"{fault}\n{line}"))
    ref, bad = execute(ref_job), execute((kind, wrong, processes, *args))
    with pytest.raises(AssertionError, match=r"gradient of lm_head\.weight differs.*ratio of norms 2\.0000"):
        assert_same_sgd(ref, bad, tolerance(cell), f"{target} injected")
    # the SGD losses alone see it too (the steps after the first one take the doubled update's parameters)
    dl = float(np.abs(bad.losses - ref.losses).max())
    assert dl > 100 * tolerance(cell), f"{target}: a doubled gradient moved the SGD losses by {dl:.2e} only"


@pytest.mark.runs
def test_every_refusal_is_an_e049_with_a_reason_and_in_the_docs():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "targets.md").read_text()
    refused = [(c, t, why) for c in CELLS for t, why in c.refusals.items()]
    assert refused, "nothing refused: the matrix would not show a refusal"
    for c, t, why in refused:
        assert "(" in why, f"{t} refuses {c.parallelism} x {c.feature} without a reason: {why}"
    assert mx.table(list(TARGETS)) in docs, "docs/targets.md's matrix is stale: python -m mithril_spec.lowering.docs"
