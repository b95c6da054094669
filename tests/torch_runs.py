"""Building and running generated PyTorch programs for the tests (test_torch_*.py, test_cross_target.py).

Every run is a fresh process: `python train.py` for one process, or one per rank with the environment
torchrun sets, forked by tests/program_zygote.py (which imported torch once for the session), or the real
`torchrun` / launch.sh where a test asks for it. Builds and runs are memoised for the whole pytest
session, so a reference run is shared by every test that compares against it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from program_zygote import zygote

from mithril_spec import cli

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
TESTS = ROOT / "tests"
LAUNCH = TESTS / "torch_launch.py"  # several ranks of another script (generate.py), spawned
WORK = Path(tempfile.mkdtemp(prefix="mithril-torch-tests-"))
PY = sys.executable
WORKERS = int(os.environ.get("MITHRIL_TEST_WORKERS", "2"))

_builds: dict = {}
_runs: dict = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec_variant(spec: Path, edits: tuple[tuple[str, str], ...] = ()) -> Path:
    """A copy of `spec` with textual edits (each `old` must occur)."""
    if not edits:
        return spec
    text = spec.read_text()
    for old, new in edits:
        assert old in text, f"{spec.name}: {old!r} not found"
        text = text.replace(old, new)
    path = WORK / "specs" / f"{spec.stem}-{hashlib.sha1(text.encode()).hexdigest()[:10]}{spec.suffix}"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def build(spec: Path, mesh: str | None = None, edits: tuple[tuple[str, str], ...] = ()) -> Path:
    """`mithril-spec build SPEC --target torch [--mesh MESH]` into a fresh directory (memoised)."""
    key = (str(spec), mesh, edits)
    if key not in _builds:
        path = spec_variant(spec, edits)
        tag = (mesh or "default").replace(",", "_").replace("=", "")
        out = WORK / f"build{len(_builds)}-{spec.stem}-{tag}"
        argv = ["build", str(path), "--target", "torch", "-o", str(out)] + (["--mesh", mesh] if mesh else [])
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
        assert rc == 0, f"build failed: {' '.join(argv)}\n{err.getvalue()}"
        _builds[key] = out
    return _builds[key]


def world_of(program: Path) -> int:
    """The rank count a program was built for (its plan.json)."""
    plan = json.loads((program / "plan.json").read_text())
    return int(plan["mesh"]["devices"])


@dataclasses.dataclass
class Run:
    rc: int
    output: str  # stdout + stderr
    metrics: list[dict]
    params: dict | None  # --export-params, when written
    cwd: Path
    seconds: float

    @property
    def losses(self) -> np.ndarray:
        return np.array([r["loss"] for r in self.metrics])

    @property
    def grad_norms(self) -> np.ndarray:
        return np.array([r["grad_norm"] for r in self.metrics])

    @property
    def memory(self) -> dict:
        """The `memory {...}` line rank 0 prints after the first step: every rank's bytes, and the plan's."""
        line = next(line for line in self.output.splitlines() if line.startswith("memory "))
        return json.loads(line[len("memory "):])

    def collectives(self) -> list[dict]:
        """Per rank: how often FSDP2's gradient collectives ran (runs with count=True)."""
        files = sorted(self.cwd.glob("collectives.*.json"))
        return [json.loads(f.read_text()) for f in files]


def env_for(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                "PATH": os.path.dirname(PY) + os.pathsep + env.get("PATH", "")})
    env.update(extra or {})
    return env


def run(program: Path, *args: str, ranks: int | None = None, launcher: str = "spawn", expect_rc: int = 0,
        export: bool = True, metrics: bool = True, count: bool = False, env: dict | None = None,
        timeout: int = 600) -> Run:
    """Runs `program/train.py ARGS` on `ranks` ranks (default: what it was built for), memoised.

    launcher: "spawn" (forked ranks with torchrun's environment; `python train.py` for one rank),
    "torchrun" (the real one, --standalone) or "launch.sh" (the generated launcher)."""
    ranks = world_of(program) if ranks is None else ranks
    key = (str(program), args, ranks, launcher, expect_rc, export, metrics, count, tuple(sorted((env or {}).items())))
    if key in _runs:
        return _runs[key]
    cwd = Path(tempfile.mkdtemp(prefix="run-", dir=WORK))
    flags = list(args)
    if metrics:
        flags += ["--metrics", str(cwd / "metrics.jsonl")]
    if export:
        flags += ["--export-params", str(cwd / "params.npz")]
    if "--checkpoint-dir" not in args:
        flags += ["--checkpoint-dir", ""]
    train = str(program / "train.py")
    if launcher == "torchrun":
        cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), train]
    elif launcher == "launch.sh":
        cmd = [str(program / "launch.sh")]
    else:
        cmd = [PY, train]
    extra = dict(env or {})
    if count:
        extra["MITHRIL_COUNT_COLLECTIVES"] = str(cwd / "collectives")
    t0 = time.perf_counter()
    if launcher == "spawn":  # `python train.py` on each rank, forked from a process that imported torch already
        log = cwd / "output.log"
        count_prefix = extra.pop("MITHRIL_COUNT_COLLECTIVES", None)
        rc = zygote("torch", env_for()).run(train, flags, cwd=str(cwd), env=env_for(extra), log=str(log), ranks=ranks, rank_env=ranks > 1,
                      timeout=timeout, count=count_prefix)
        out = log.read_text()
    else:
        p = subprocess.run(cmd + flags, check=False, cwd=cwd, env=env_for(extra), capture_output=True, text=True,
                           timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    seconds = time.perf_counter() - t0
    with open(WORK / "runs.log", "a") as f:
        f.write(f"{seconds:6.1f}s {ranks}r {launcher} {program.name} {' '.join(args)}\n")
    assert rc == expect_rc, f"{' '.join(cmd + flags)}: exit {rc}, expected {expect_rc}\n{out[-6000:]}"
    m = cwd / "metrics.jsonl"
    params = cwd / "params.npz"
    result = Run(rc, out, [json.loads(line) for line in m.read_text().splitlines()] if m.exists() else [],
                 dict(np.load(params)) if params.exists() else None, cwd, seconds)
    _runs[key] = result
    return result


def run_many(jobs: list[tuple]) -> list[Run]:
    """[(program, args..., {keyword arguments})] run WORKERS at a time; results in order."""
    def one(job):
        kw = job[-1] if isinstance(job[-1], dict) else {}
        pos = job[:-1] if kw or isinstance(job[-1], dict) else job
        return run(*pos, **kw)

    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(one, jobs))


def max_diff(a, b) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def max_param_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def report(name: str, **figures) -> None:
    """One line per measured figure, collected in WORK/figures.jsonl (printed with pytest -s)."""
    row = {"check": name, **figures}
    with open(WORK / "figures.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))


# ---------------------------------------------------------------- runs shared by several test modules

GPT = SPECS / "gpt-tiny.yaml"
GPT_STEPS = 6  # the equivalence runs double as the uninterrupted run of the resume tests
HALF = GPT_STEPS // 2  # where they checkpoint and the resume tests resume
STEPS = 5
SP_EDITS = (("    mlp: tensor\n", "    mlp: tensor\n    seq: tensor\n"),)  # sequence parallel


def steps(spec: str) -> int:
    return GPT_STEPS if spec.startswith("gpt") else STEPS


def ckpt_dir(tag: str) -> Path:
    return WORK / f"ckpt-{tag}"


# (spec, mesh of the parallel build (None: the spec's default), spec edits, what it covers)
EQUIVALENCE = [
    ("mlp-dp.yaml", "four", (), "data=4 (DDP)"),
    ("cnn-dp.yaml", None, (), "data=4 (DDP)"),
    ("mlp-tp.yaml", "four", (), "data=2 x tensor=2 (TP + HSDP with fsdp=1)"),
    ("gpt-tiny.yaml", "fsdp_tp", (), "fsdp=2 x tensor=2 (FSDP2 + TP)"),
    ("gpt-tiny.yaml", "fsdp=4", (), "fsdp=4 (FSDP2)"),
    ("gpt-tiny.yaml", "data=2,fsdp=2", (), "data=2 x fsdp=2 (HSDP)"),
    ("gpt-tiny.yaml", None, (), "data=2 x fsdp=2 x tensor=2 (HSDP + TP, 8 ranks)"),
    ("gpt-tiny.yaml", "fsdp_tp", SP_EDITS, "fsdp=2 x tensor=2, sequence parallel"),
]


def reference(spec: str, n: int | None = None) -> tuple:
    """The one-process build of `spec` (--mesh data=1) and its run arguments."""
    return (build(SPECS / spec, "data=1"), "--steps", str(n or steps(spec)))


def parallel(spec: str, mesh, edits=()) -> tuple:
    """A parallel build and its run arguments; gpt-tiny fsdp_tp and fsdp=4 also checkpoint at step HALF
    (for the resume and reshard tests); the HSDP run counts its gradient collectives (accumulation test)."""
    args: tuple = ("--steps", str(steps(spec)))
    kw: dict = {}
    if spec.startswith("gpt") and not edits and mesh in ("fsdp_tp", "fsdp=4"):
        args += ("--checkpoint-dir", str(ckpt_dir(mesh)), "--checkpoint-every", str(HALF))
    if spec.startswith("gpt") and mesh == "data=2,fsdp=2":
        kw["count"] = True
    return (build(SPECS / spec, mesh, tuple(edits)), *args, kw)


def equivalence_jobs() -> list[tuple]:
    jobs = [reference(spec) for spec in sorted({c[0] for c in EQUIVALENCE})]
    return jobs + [parallel(spec, mesh, edits) for spec, mesh, edits, _ in EQUIVALENCE]
