"""Evaluation (`eval`) through a pipeline (docs/program.md "Evaluation"; issue 40, item 1).

specs/gpt-pipe.yaml with `eval: {every: 2, batches: 2}` (synthetic samples from seed + 2, accuracy too)
trains 3 steps on one device and through pipelines of 2 stages: JAX (the evaluation forward only through
the circular pipeline's loop) and PyTorch on 2 ranks (torch.distributed.pipelining's schedule.eval), each
with 1f1b and interleaved schedules, and with a dropout layer in the block or batch_norm before, in and
after it (the evaluation without dropout, batch_norm with its running statistics). The val_loss /
val_accuracy after steps 2 and 3 equal the one-device build's of the same model (1e-5, the tolerance of
tests/test_eval.py), and `--eval-only --init-params` of the one-device run's parameters gives its last
val_loss through the pipeline.
"""

from __future__ import annotations

import concurrent.futures

import jax_runs as jr
import pytest
import torch_runs as tr
from pipeline_edits import BATCH_NORM

from mithril_spec.frontend import compile_file
from mithril_spec.lowering import check_target

GPT_PIPE = jr.SPECS / "gpt-pipe.yaml"
EVAL = (("data: {kind: synthetic}", "data: {kind: synthetic}\neval: {every: 2, batches: 2}"),)
INTERLEAVED = (("schedule: 1f1b}", "schedule: interleaved, virtual_stages: 2}"),)
DROP = (("- {op: add, name: res2, inputs: [res1, mlp]}",
         "- {op: add, name: res2, inputs: [res1, mlp]}\n      - {op: dropout, name: drop, rate: 0.1}"),)
STEPS = ("--steps", "3")


def val_rows(run) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["val_loss"], r["val_accuracy"]) for r in run.metrics if "val_loss" in r}


def e049(target: str, edits: tuple, mesh: str | None = None) -> list[str]:
    c = compile_file(jr.spec_variant(GPT_PIPE, EVAL + edits), mesh)
    return [d.message for d in check_target(c.plan, c.doc, target) if d.code == "E049"]


def test_pipelined_evaluation_is_accepted():
    for target in ("jax", "torch"):
        for edits in ((), INTERLEAVED, DROP, BATCH_NORM):
            assert e049(target, edits) == [], (target, edits)


CASES = {  # name: (mesh, spec edits); each compared with the one-device build of its model
    "1f1b pipe=2": ("pipe=2", ()),
    "interleaved pipe=2": ("pipe=2", INTERLEAVED),
    "dropout, 1f1b pipe=2": ("pipe=2", DROP),
    "batch_norm, 1f1b pipe=2": ("pipe=2", BATCH_NORM),
}


@pytest.mark.slow
@pytest.mark.parametrize("target", ["jax", "torch"])
def test_evaluation_through_the_pipeline_equals_one_device(target):
    runs = jr if target == "jax" else tr
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        refs = {edits: pool.submit(runs.run, runs.build(GPT_PIPE, "single", EVAL + edits), *STEPS)
                for edits in {e for _, e in CASES.values()} - {INTERLEAVED}}
        refs = {edits: f.result() for edits, f in refs.items()}
        refs[INTERLEAVED] = refs[()]
        jobs = {name: pool.submit(runs.run, runs.build(GPT_PIPE, mesh, EVAL + edits), *STEPS)
                for name, (mesh, edits) in CASES.items()}
        params = str(refs[()].cwd / "params.npz")
        jobs["eval-only 1f1b pipe=2"] = pool.submit(runs.run, runs.build(GPT_PIPE, "pipe=2", EVAL), "--eval-only",
                                                    "--init-params", params, export=False)
        done = {name: job.result() for name, job in jobs.items()}
    figures = {}
    for name, run in done.items():
        if name.startswith("eval-only"):
            want = val_rows(refs[()])
            (row,) = run.metrics
            assert row["step"] == 0 and set(row) == {"step", "val_loss", "val_accuracy"}, run.metrics
            figures[name] = abs(row["val_loss"] - want[3][0])
            assert figures[name] < 1e-5 and row["val_accuracy"] == want[3][1], (name, row, want)
            continue
        ref = refs[CASES[name][1]]
        want = val_rows(ref)
        assert sorted(want) == [2, 3], ref.metrics
        got = val_rows(run)
        assert sorted(got) == [2, 3], (name, run.metrics)
        figures[name] = {"loss": jr.max_diff(run.losses, ref.losses),
                         "val_loss": max(abs(got[s][0] - want[s][0]) for s in want),
                         "val_accuracy": max(abs(got[s][1] - want[s][1]) for s in want)}
        assert max(figures[name].values()) < 1e-5, (name, figures[name])
        assert " | val_loss " in run.output
    # (the model with dropout trains otherwise: its own reference)
    assert val_rows(refs[DROP]) != val_rows(refs[()])
    jr.report(f"pipelined eval {target}", val=val_rows(refs[()]), max_differences=figures)
