"""Building and running generated JAX programs for the tests (test_jax_*.py).

Every run is a fresh process (the number of devices is fixed per process), forked by
tests/program_zygote.py from one that imported jax once for the session, or a launcher's subprocesses. Builds and runs are memoised
for the whole pytest session, so the single-device reference of a spec is run once and shared by every
test that compares against it. Runs share a persistent XLA compilation cache: a second run of the same
program on the same mesh (resume, other data, --init-params) skips compilation.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from program_zygote import zygote

from mithril_spec.frontend import compile_file
from mithril_spec.render import build as render

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
WORK = Path(tempfile.mkdtemp(prefix="mithril-jax-tests-"))
if not os.environ.get("MITHRIL_KEEP_TEST_RUNS"):  # set it to keep the programs, runs and figures.jsonl
    atexit.register(shutil.rmtree, WORK, ignore_errors=True)
PY = sys.executable
# Two programs at a time: XLA compiles mostly on one thread, so two overlap well on two cores.
WORKERS = int(os.environ.get("MITHRIL_TEST_WORKERS", min(4, os.cpu_count() or 2)))
# XLA's cheapest compilation for every run: a few steps of a tiny model spend most of their time compiling.
# The backend's lowest optimisation level compiles a third faster, and XLA:CPU's loop-fusion emitters instead of
# its newer fusion emitters (MLIR) about twice as fast again (gpt-tiny's train step: 2.2-2.4 s -> 0.9-1.2 s):
# the same computation (losses equal to the last digit printed), slower kernels
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"

_builds: dict = {}
_runs: dict = {}
_build_lock = threading.Lock()
_run_locks: dict = {}  # one lock per run key: a run asked for twice at once happens once
_locks_lock = threading.Lock()


def spec_variant(spec: Path, edits: tuple[tuple[str, str], ...] = ()) -> Path:
    """A copy of `spec` with textual edits (each `old` must occur), written next to the other test files."""
    text = spec.read_text()
    for old, new in edits:
        assert old in text, f"{spec.name}: {old!r} not found"
        text = text.replace(old, new)
    if not edits:
        return spec
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    path = WORK / "specs" / f"{spec.stem}-{digest}{spec.suffix}"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def build(spec: Path, mesh: str | None = None, edits: tuple[tuple[str, str], ...] = ()) -> Path:
    """`mithril-spec build SPEC --target jax [--mesh MESH]` into a fresh directory (memoised)."""
    key = (str(spec), mesh, edits)
    with _build_lock:
        return _build(key, spec, mesh, edits)


def _build(key, spec: Path, mesh: str | None, edits: tuple[tuple[str, str], ...]) -> Path:
    if key not in _builds:
        path = spec_variant(spec, edits)
        out = WORK / f"build{len(_builds)}-{spec.stem}-{(mesh or 'default').replace(',', '_').replace('=', '')}"
        # what `mithril-spec build PATH --target jax [--mesh MESH] -o OUT` does, without printing
        render.build(compile_file(path, mesh), "jax", out, str(path))
        _builds[key] = out
    return _builds[key]


@dataclasses.dataclass
class Run:
    rc: int
    output: str  # stdout + stderr
    metrics: list[dict]
    params: dict | None  # --export-params, when written
    cwd: Path

    @property
    def losses(self) -> np.ndarray:
        return np.array([r["loss"] for r in self.metrics])

    @property
    def memory(self) -> dict:
        """The `memory {...}` line the program prints at start."""
        line = next(line for line in self.output.splitlines() if line.startswith("memory "))
        return json.loads(line[len("memory "):])


def env_for(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS")}
    env.update({
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(WORK / "xla-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    if FAST_COMPILE not in env.get("XLA_FLAGS", ""):
        env["XLA_FLAGS"] = f"{FAST_COMPILE} {env.get('XLA_FLAGS', '')}".strip()
    return env


def run(program: Path, *args: str, env: dict | None = None, expect_rc: int = 0, export: bool = True,
        metrics: bool = True, launcher: list[str] | None = None, timeout: int = 600, coverage: bool = False) -> Run:
    """Runs `program/train.py ARGS` (or `launcher + ARGS`) in its own directory (memoised). With `coverage`,
    train.py is measured by coverage.py into the run directory's .coverage.* files."""
    key = (str(program), args, tuple(sorted((env or {}).items())), expect_rc, export, metrics, tuple(launcher or ()),
           coverage)
    with _locks_lock:
        lock = _run_locks.setdefault(key, threading.Lock())
    with lock:
        if key not in _runs:
            _runs[key] = _run(program, args, env, expect_rc, export, metrics, launcher, timeout, coverage)
        return _runs[key]


def _run(program, args, env, expect_rc, export, metrics, launcher, timeout, coverage=False) -> Run:
    cwd = Path(tempfile.mkdtemp(prefix="run-", dir=WORK))
    flags = list(args)
    if metrics:
        flags += ["--metrics", str(cwd / "metrics.jsonl")]
    if export:
        flags += ["--export-params", str(cwd / "params.npz")]
    if "--checkpoint-dir" not in args:
        flags += ["--checkpoint-dir", ""]
    cmd = (launcher or [PY, str(program / "train.py")]) + flags
    t0 = time.perf_counter()
    full_env = env_for(env)
    if launcher is None and _jax_settings(full_env) == _jax_settings(env_for()):
        # `python train.py`, forked from a process that imported jax already (jax reads JAX_* when imported:
        # a run with other JAX_* settings starts its own interpreter)
        log = cwd / "output.log"
        rc = zygote("jax", env_for()).run(cmd[1], flags, cwd=str(cwd), env=full_env, log=str(log), timeout=timeout,
                                          coverage=str(cwd / ".coverage") if coverage else None)
        out = log.read_text()
    else:
        p = subprocess.run(cmd, check=False, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    with open(WORK / "runs.log", "a") as f:
        f.write(f"{time.perf_counter() - t0:6.1f}s {' '.join(cmd[1:2] + list(args))}\n")
    assert rc == expect_rc, f"{' '.join(cmd)}: exit {rc}, expected {expect_rc}\n{out[-6000:]}"
    m = cwd / "metrics.jsonl"
    params = cwd / "params.npz"
    return Run(rc, out, [json.loads(line) for line in m.read_text().splitlines()] if m.exists() else [],
               dict(np.load(params)) if params.exists() else None, cwd)


def _jax_settings(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith("JAX_")}


def run_many(jobs: list[tuple]) -> list[Run]:
    """[(program, args...)] run WORKERS at a time; results in order."""
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(lambda job: run(*job), jobs))


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def max_param_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def report(name: str, **figures) -> None:
    """One line per measured figure, collected in WORK/figures.jsonl (printed with pytest -s)."""
    row = {"check": name, **figures}
    with open(WORK / "figures.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
