"""A generated PyTorch program holds only what its spec can execute: in a 2-step run with --metrics,
--checkpoint-dir and --export-params (.safetensors), then a `--steps 0 --init-params` run of that file and a
`--resume` of its checkpoint for one more step (with --export-grads), on the ranks of the spec's default mesh (or a smaller one with the same axes: program_coverage.mesh_of), at least 87.5% (program_coverage.THRESHOLD) of its train.py's statements run
(combined over the first and the last rank), for every example spec. The rest are the paths of other flags (--resume,
.npz parameter files, --dry-run, --compile), of a GPU, and of errors. Each test prints its figure
(pytest -s). The ranks are forked by tests/program_zygote.py, those two measured by coverage.py."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import coverage
import pytest
from program_coverage import SPECS, STEPS, THRESHOLD, Coverage, measured, mesh_of
from program_zygote import zygote
from torch_runs import WORK, WORKERS, build, env_for, report, world_of

_results: dict[Path, Coverage] = {}


def coverage_of(spec: Path) -> Coverage:
    """Builds `spec`'s torch program for its mesh (mesh_of), runs STEPS steps on its ranks with --metrics and
    --checkpoint-dir under coverage, and returns the statements of its training files and those that never ran."""
    if spec not in _results:
        program = build(spec, mesh_of(spec))
        train = program / "train.py"
        cwd, again = WORK / f"coverage-{spec.name}", WORK / f"coverage-{spec.name}-init"
        resumed = WORK / f"coverage-{spec.name}-resume"
        for d in (cwd, again, resumed):
            d.mkdir()
        exported = cwd / "params.safetensors"
        first = ["--steps", STEPS, "--metrics", "metrics.jsonl", "--checkpoint-dir", "ckpt", "--export-params",
                 str(exported), "--tensorboard", "tb", "--async-checkpoint", "--checkpoint-every", "1"]
        first += ["--profile", "prof"]  # the last step traced and summarised (pipelined programs too)
        runs = [(cwd, first), (again, ["--steps", "0", "--init-params", str(exported)]),
                (resumed, ["--steps", str(int(STEPS) + 1), "--resume", "auto", "--checkpoint-dir", str(cwd / "ckpt"),
                           "--export-grads", "grads.npz"])]
        # measured on the first and the last rank: the ranks run the same statements but for the first
        # rank's reports and the last pipeline stage's loss (tracing every rank doubled the runs' time)
        world = world_of(program)
        for where, args in runs:
            log = where / "output.log"
            rc = zygote("torch", env_for()).run(str(train), args, cwd=str(where), env=env_for(), log=str(log),
                                                ranks=world, rank_env=True, coverage=str(where / ".coverage"),
                                                coverage_ranks=[0, world - 1])
            out = log.read_text()
            assert rc == 0, f"{train} {' '.join(args)}: exit {rc}\n{out[-6000:]}"
        rows = [json.loads(line) for line in (cwd / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == int(STEPS) and (cwd / "ckpt" / f"step_{int(STEPS):08d}").is_dir(), out[-3000:]
        cov = coverage.Coverage(data_file=str(cwd / ".coverage"))
        cov.combine([str(cwd), str(again), str(resumed)])  # one data file per rank and run
        _results[spec] = Coverage("torch", spec, train, *measured(cov, train))
    return _results[spec]


@pytest.fixture(scope="module")
def runs():
    """Every spec's run, WORKERS at a time."""
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(coverage_of, SPECS))


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_short_run_executes_most_of_the_torch_program(spec, runs):
    got = coverage_of(spec)
    report("torch program coverage", spec=spec.name, percent=round(got.percent, 1),
           statements=len(got.statements), missing=len(got.missing))
    assert got.percent >= THRESHOLD, f"{got.summary()}; never executed:\n{got.missing_lines()}"
