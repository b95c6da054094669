"""A generated program holds only what its spec can execute: in a 2-step run with --metrics and
--checkpoint-dir, at least 87.5% (program_coverage.THRESHOLD) of its train.py's statements run, for every example spec and target (the
rest are the paths of other flags: --resume, --export-params, --init-params, --dry-run, several processes,
errors). Each test prints its figure (pytest -s)."""

from __future__ import annotations

import pytest
from jax_runs import WORKERS, report
from program_coverage import RUNNERS, SPECS, THRESHOLD, coverage_of, prefetch

CASES = [(target, spec) for target in RUNNERS for spec in SPECS]


def case_id(case) -> str:
    return f"{case[0]}-{case[1].name}"


@pytest.fixture(scope="module", autouse=True)
def runs():
    prefetch(CASES, WORKERS)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_short_run_executes_most_of_the_program(case):
    got = coverage_of(*case)
    report("program coverage", target=got.target, spec=got.spec.name, percent=round(got.percent, 1),
           statements=len(got.statements), missing=len(got.missing))
    assert got.percent >= THRESHOLD, f"{got.summary()}; never executed:\n{got.missing_lines()}"
