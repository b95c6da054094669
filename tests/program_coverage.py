"""Statement coverage of a generated program in a short run: a rendered program holds only what its spec
can execute (docs/program.md; the templates gate every optional feature on the plan).

`coverage_of(target, spec)` builds the spec's program for `target` (on `mesh_of(spec)`), runs 2 steps measured by coverage.py with
--metrics, --checkpoint-dir (--async-checkpoint, every step), --tensorboard, --profile and --export-params (.safetensors), then `--steps 0 --init-params` of that file
(so both parameter-file paths run as well as the initialisation), then `--resume auto` of its checkpoint directory
for one more step (checkpoint verification and restore; --export-grads of that step), and returns the statements of its
train.py and those that never ran in either run. A target is one entry of RUNNERS: a function (spec) -> (train.py, coverage data file) that builds and
runs the program (memoised, like the other program tests); `prefetch` starts every run at once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

import coverage
from program_files import TRAINING

ROOT = Path(__file__).resolve().parent.parent
# every example (its TOML twin builds the same program: tests/test_twins.py)
SPECS = sorted(p for p in (ROOT / "specs").iterdir() if p.suffix == ".yaml" and not p.name.startswith("_"))
# percent of train.py's statements that the short run executes (90 until the programs learnt to stop on a
# signal, restart and resume a W&B run: those paths, about 3% of a program, run in tests/test_preemption.py)
THRESHOLD = 87.5
STEPS = "2"
# The mesh each spec's program is measured on: its default, or where the spec names a smaller mesh with the same
# axes above 1 (`four`: data=4 for data=8, data=2 x tensor=2 for data=2 x tensor=4, ...) that one: the program
# holds the same statements, and on CI's 2 cores 4 ranks cost half of 8.
SMALLER = {"mlp-dp.yaml": "four", "mlp-tp.yaml": "four", "moe-dp.yaml": "four"}


def mesh_of(spec: Path) -> str | None:
    return SMALLER.get(spec.name)


@dataclasses.dataclass
class Coverage:
    target: str
    spec: Path
    program: Path  # the generated train.py (its build's training files are measured: program_files.TRAINING)
    statements: list[tuple[str, int]]  # (file, line)
    missing: list[tuple[str, int]]  # the statements that never ran

    @property
    def percent(self) -> float:
        return 100.0 * (len(self.statements) - len(self.missing)) / len(self.statements)

    def summary(self) -> str:
        return (f"{self.target} {self.spec.name}: {self.percent:.1f}% of {len(self.statements)} statements "
                f"executed ({len(self.missing)} not)")

    def missing_lines(self) -> str:
        """The statements that never ran, with their source (for an assertion message)."""
        src = {name: (self.program.parent / name).read_text().splitlines() for name, _ in self.missing}
        return "\n".join(f"{name}:{n:<5d} {src[name][n - 1]}" for name, n in self.missing)


def _jax(spec: Path) -> tuple[Path, list[Path]]:
    from jax_runs import build, run

    program = build(spec, mesh_of(spec))
    exported = program.parent / f"{program.name}-params.safetensors"
    got = run(program, "--steps", STEPS, "--checkpoint-dir", "ckpt", "--export-params", str(exported),
              "--tensorboard", "tb", "--profile", "prof", "--async-checkpoint", "--checkpoint-every", "1",
              coverage=True, export=False)
    assert len(got.metrics) == int(STEPS) and (got.cwd / "ckpt").is_dir() and exported.is_file(), got.output[-3000:]
    again = run(program, "--steps", "0", "--init-params", str(exported), coverage=True, export=False)
    resumed = run(program, "--steps", str(int(STEPS) + 1), "--resume", "auto", "--checkpoint-dir",
                  str(got.cwd / "ckpt"), "--export-grads", "grads.npz", coverage=True, export=False)
    runs = [got.cwd, again.cwd, resumed.cwd]
    if (program / "generate.py").is_file():
        # generate.py --check runs train.py's forward pass (a pipeline's forward-only circular pipeline too)
        from jax_runs import env_for
        from program_zygote import zygote

        cwd = got.cwd.parent / f"{got.cwd.name}-generate"
        cwd.mkdir(exist_ok=True)
        rc = zygote("jax", env_for()).run(str(program / "generate.py"), ["--params", str(exported), "--check",
                                          "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--temperature", "0"],
                                          cwd=str(cwd), env=env_for(), log=str(cwd / "output.log"), timeout=600,
                                          coverage=str(cwd / ".coverage"))
        assert rc == 0, (cwd / "output.log").read_text()[-3000:]
        runs.append(cwd)
    return program / "train.py", [f for d in runs for f in d.glob(".coverage.*")]


# target -> runner: builds the spec's program, runs it as the module docstring says under coverage.py,
# returns (train.py, the coverage data files or directories of its runs)
RUNNERS: dict[str, Callable[[Path], tuple[Path, list[Path]]]] = {"jax": _jax}

_results: dict[tuple[str, Path], Coverage] = {}
_locks: dict[tuple[str, Path], threading.Lock] = {}
_locks_lock = threading.Lock()


def coverage_of(target: str, spec: Path) -> Coverage:
    """The statement coverage of `spec`'s `target` program in a STEPS-step run (memoised)."""
    key = (target, spec)
    with _locks_lock:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        if key not in _results:
            program, data = RUNNERS[target](spec)
            cov = coverage.Coverage(data_file=str(program.parent / f".coverage-{program.parent.name}"))
            cov.combine([str(d) for d in data], keep=True)
            statements, missing = measured(cov, program)
            _results[key] = Coverage(target, spec, program, statements, missing)
        return _results[key]


def measured(cov: coverage.Coverage, program: Path) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(statements, missing) of the training files of `program`'s build, as (file, line)."""
    statements, missing = [], []
    for name in TRAINING:
        _, lines, _, never, _ = cov.analysis2(str(program.parent / name))
        assert lines, f"{program.parent / name}: no statements measured"
        statements += [(name, n) for n in lines]
        missing += [(name, n) for n in never]
    return statements, missing


def prefetch(cases: list[tuple[str, Path]], workers: int = 2) -> None:
    """Runs every case's program, `workers` at a time, so that the tests only read the results."""
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda case: coverage_of(*case), cases))
