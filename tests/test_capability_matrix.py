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

from mithril_spec.frontend import compile_file
from mithril_spec.targets import TARGETS
from mithril_spec.targets import matrix as mx

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
    path = spec_file(spec)
    if target == "torch":
        return ("torch", tr.build(path, mesh), "--steps", STEPS)
    if target == "jax":
        return ("jax", jr.build(path, mesh), "--steps", STEPS)
    return ("mlx", mr.build(path, mesh), "--steps", STEPS, ranks(mesh))


def execute(j: tuple):
    kind, program, *args = j
    if kind == "torch":
        return tr.run(program, *args)
    if kind == "jax":
        return jr.run(program, *args)
    *args, processes = args
    return mr.run(program, *args, processes=processes)


def jobs_of(cell: mx.Cell, target: str) -> tuple[tuple, tuple]:
    spec = cell_run_spec(cell, target)
    return job(target, reference_spec(spec), "data=1"), job(target, spec, cell.mesh)


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    """Every run, two at a time (memoised: each test then reads its two runs)."""
    import concurrent.futures

    only = os.environ.get("MATRIX_TARGETS")  # (a subset, for debugging)
    todo = list(dict.fromkeys(j for c, t in ACCEPTED if not only or t in only.split(",") for j in jobs_of(c, t)))
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
    tol = 2e-2 if cell.feature.startswith("bfloat16") else 1e-5  # 16-bit activations: reduction order shows
    jr.report(f"matrix {target} {cell.parallelism} x {cell.feature}", max_dloss=dl, mesh=cell.mesh)
    assert dl < tol, f"{target} {cell.parallelism} x {cell.feature} on {cell.mesh}: losses differ by {dl:.2e}"

    plan = compile_file(spec_file(cell_run_spec(cell, target)), cell.mesh).plan.memory_for(target)
    planned = {"params": plan.params, "grads": plan.grads, "optimizer": plan.optimizer, "buffers": plan.buffers}
    held = par.memory
    if target == "torch":
        every = held["ranks"]
        if cell.parallelism == "pipe":  # the plan's figure is the fullest rank's
            every = [max(every, key=lambda r: sum(r.values()))]
        for rank, h in enumerate(every):
            assert h == planned, f"rank {rank} holds {h}, the plan says {planned}"
    else:  # jax and mlx report device 0 (without gradients, which live inside the step)
        h = held["device0"]
        assert {k: h[k] for k in ("params", "optimizer", "buffers")} == {
            k: planned[k] for k in ("params", "optimizer", "buffers")}, (h, planned)


def test_every_refusal_is_an_e049_with_a_reason_and_in_the_docs():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "targets.md").read_text()
    refused = [(c, t, why) for c in CELLS for t, why in c.refusals.items()]
    assert refused, "nothing refused: the matrix would not show a refusal"
    for c, t, why in refused:
        assert "(" in why, f"{t} refuses {c.parallelism} x {c.feature} without a reason: {why}"
    assert mx.table(list(TARGETS)) in docs, "docs/targets.md's matrix is stale: python -m mithril_spec.targets.docs"
