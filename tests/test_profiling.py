"""`train.py --profile DIR [--profile-steps A:B]`: a framework trace in DIR and a summary of the measured
step, collective kinds and peak memory next to the plan's; one tiny data=2 run per target, and a pipelined
torch program (pipe=2, a summary per rank). A bad window is a usage error (exit 2), as is --profile beside no
plan.json or another build's (the plan's predictions live there), and the mlx program says it does not
profile."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import pytest
import torch_runs as tr

MLP = Path(__file__).resolve().parent.parent / "specs" / "mlp-dp.yaml"


def summary(run) -> dict:
    return json.loads((run.cwd / "prof" / "summary.json").read_text())


def check(run, program: Path) -> dict:
    s = summary(run)
    planned = json.loads((program / "plan.json").read_text())["costs"]
    kinds = {c["kind"] for c in planned["collectives"]}
    assert kinds == {"all-reduce"}  # data parallelism: the gradients' and the loss's all-reduce
    assert set(s["planned"]["comm_bytes"]) == kinds
    assert kinds <= set(s["comm_s"]) and all(s["comm_calls"][k] >= 1 for k in kinds)  # measured, each kind
    assert s["steps"] == [2, 3] and s["step_s"] > 0 and len(s["peak_bytes"]) == 2 and min(s["peak_bytes"]) > 0
    assert s["planned"]["peak_bytes"] == planned["peak_bytes"]
    assert "profile of steps 2..3" in run.output and "all-reduce" in run.output
    return s


@pytest.mark.runs
def test_torch_profile_writes_a_trace_per_rank_and_the_summary():
    program = tr.build(MLP, "data=2")
    run = tr.run(program, "--steps", "3", "--profile", "prof")
    assert sorted(p.name for p in (run.cwd / "prof").glob("trace-rank*.json")) == ["trace-rank0.json",
                                                                                 "trace-rank1.json"]
    s = check(run, program)
    tr.report("profile (torch data=2, cpu)", step_s=s["step_s"], comm_s=s["comm_s"], calls=s["comm_calls"],
              planned_calls=s["planned"]["comm_calls"])


@pytest.mark.runs
def test_pipelined_torch_profile_traces_every_stage():
    """A pipelined torch program (1f1b, pipe=2) profiles as the one without a pipeline: a trace per rank, and
    each rank's summary (its stage's step: the activations it sends or receives), rank 0's printed."""
    program = tr.build(tr.SPECS / "gpt-pipe.yaml", "pipe=2")
    run = tr.run(program, "--steps", "3", "--profile", "prof", export=False)
    prof = run.cwd / "prof"
    assert sorted(p.name for p in prof.glob("trace-rank*.json")) == ["trace-rank0.json", "trace-rank1.json"]
    ranks = [json.loads((prof / f"summary-rank{r}.json").read_text()) for r in (0, 1)]
    planned = json.loads((program / "plan.json").read_text())["costs"]
    assert "send/recv" in {c["kind"] for c in planned["collectives"]}
    for r, s in enumerate(ranks):
        assert s["rank"] == r and s["steps"] == [2, 3] and s["step_s"] > 0 and len(s["peak_bytes"]) == 2
        # the stages pass activations (forward) and their gradients (backward) both ways, every micro-batch
        assert s["comm_calls"]["send/recv"] >= 4, s["comm_calls"]
    assert summary(run) == {k: v for k, v in ranks[0].items() if k != "rank"}
    assert "profile of steps 2..3" in run.output and "send/recv" in run.output and "Traceback" not in run.output
    tr.report("profile (torch 1f1b pipe=2, cpu)", step_s=[s["step_s"] for s in ranks],
              comm_s=[s["comm_s"] for s in ranks], calls=[s["comm_calls"] for s in ranks])


@pytest.mark.runs
def test_jax_profile_writes_a_trace_and_the_summary():
    program = jr.build(MLP, "data=2")
    run = jr.run(program, "--steps", "3", "--profile", "prof")
    assert list((run.cwd / "prof").glob("plugins/profile/*/*.xplane.pb"))
    s = check(run, program)
    jr.report("profile (jax data=2, cpu)", step_s=s["step_s"], comm_s=s["comm_s"], calls=s["comm_calls"],
              planned_calls=s["planned"]["comm_calls"])


@pytest.mark.parametrize("flags, message", [
    (("--profile", "p", "--profile-steps", "3:1"), "needs 1 <= A <= B <= 3"),
    (("--profile", "p", "--profile-steps", "2"), "expected A:B"),
    (("--profile", "p", "--profile-steps", "0:2"), "needs 1 <= A <= B <= 3"),
    (("--profile-steps", "1:2"), "--profile-steps needs --profile DIR"),
])
@pytest.mark.runs
def test_bad_profile_windows_are_usage_errors(flags, message):
    torch_run = tr.run(tr.build(MLP, "single"), "--steps", "3", *flags, expect_rc=2, metrics=False, export=False)
    jax_run = jr.run(jr.build(MLP, "single"), "--steps", "3", *flags, expect_rc=2, metrics=False, export=False)
    for run in (torch_run, jax_run):
        assert message in run.output and "Traceback" not in run.output


@pytest.mark.runs
def test_profile_reads_the_predictions_of_the_programs_own_plan_json(tmp_path):
    """The program embeds no prediction: --profile reads plan.json's "predicted" beside train.py, and refuses
    (exit 2, one line) where there is none or it is another build's; without --profile no plan.json is read."""
    for lib in (tr, jr):
        program = lib.build(MLP, "single")
        built = json.loads((program / "plan.json").read_text())
        assert "PREDICTED =" not in (program / "train.py").read_text() and built["predicted"]["profiles"]
        alone, other = tmp_path / f"{lib.__name__}-alone", tmp_path / f"{lib.__name__}-other"
        shutil.copytree(program, alone)
        shutil.copytree(program, other)
        (alone / "plan.json").unlink()
        shutil.copy(lib.build(MLP, "data=2") / "plan.json", other / "plan.json")  # another mesh's figures
        kw = {"ranks": 1} if lib is tr else {}
        missing = lib.run(alone, "--steps", "1", "--profile", "p", expect_rc=2, metrics=False, export=False, **kw)
        assert f"--profile: no {alone / 'plan.json'}: the build writes it beside train.py" in missing.output
        wrong = lib.run(other, "--steps", "1", "--profile", "p", expect_rc=2, metrics=False, export=False, **kw)
        assert f"--profile: {other / 'plan.json'} is not this program's plan" in wrong.output
        assert "it is the plan of spec 'mlp-dp' for target" in wrong.output and "{'data': 2}" in wrong.output
        for run in (missing, wrong):
            assert "Traceback" not in run.output and not (run.cwd / "p").exists()
        lib.run(alone, "--steps", "1", metrics=False, export=False, **kw)  # (no --profile: plan.json not read)


@pytest.mark.runs
def test_mlx_program_says_it_does_not_profile():
    run = mr.run(mr.build(MLP, "single"), "--steps", "1", "--profile", "p", expect_rc=2, metrics=False, export=False)
    assert "--profile: not supported by the mlx program" in run.output and "Traceback" not in run.output
