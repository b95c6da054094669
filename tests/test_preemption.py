"""Preemption, restarts and resume hygiene (docs/program.md "Checkpoints", "Errors"): SIGTERM sent to a
run's process group, as SLURM sends it, stops every rank after the same step with a checkpoint saved and
exit code 3; `--resume auto` then continues on the uninterrupted run's losses, with one metrics row per
step. Killing a launcher (torch, jax, mlx) leaves no process alive; a process killed under MAX_RESTARTS
restarts from the newest checkpoint (torchrun's restarts; the jax and mlx launchers' loop)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax_runs as jr
import numpy as np
import pytest
import torch_runs as tr

from mithril_spec.frontend import compile_file
from mithril_spec.render import build as render

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "mlp-dp.yaml"
PY = sys.executable
STEPS = 200  # the mlp's steps take milliseconds: enough of them that the signal comes mid-run
WORK = Path(tempfile.mkdtemp(prefix="mithril-preempt-tests-"))
_builds: dict = {}


def build(target: str, mesh: str) -> Path:
    if (target, mesh) not in _builds:
        out = WORK / f"{target}-{mesh.replace('=', '')}"
        render.build(compile_file(SPEC, mesh), target, out, str(SPEC))
        _builds[target, mesh] = out
    return _builds[target, mesh]


def env_for(target: str, extra: dict | None = None) -> dict:
    env = tr.env_for() if target == "torch" else jr.env_for()
    return {**env, "PYTHON": PY, **(extra or {})}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_rows(path: Path, n: int, p: subprocess.Popen, timeout: float = 120) -> None:
    """Until `path` holds `n` metrics rows (the run must still be running)."""
    end = time.monotonic() + timeout
    while not (path.exists() and len(path.read_text().splitlines()) >= n):
        assert p.poll() is None, f"the run ended early (exit {p.returncode}): {p.communicate()[0][-3000:]}"
        assert time.monotonic() < end, "no metrics rows"
        time.sleep(0.02)


def run(program: Path, target: str, cwd: Path, *args: str, rc: int = 0, launcher: bool = False,
        env: dict | None = None) -> str:
    cmd = [str(program / "launch.sh")] if launcher else [PY, str(program / "train.py")]
    p = subprocess.run([*cmd, *args], check=False, cwd=cwd, env=env_for(target, env), capture_output=True, text=True, timeout=300)
    assert p.returncode == rc, f"{' '.join(cmd + list(args))}: exit {p.returncode}, expected {rc}\n{(p.stdout + p.stderr)[-4000:]}"
    return p.stdout + p.stderr


def losses(path: Path) -> np.ndarray:
    got = rows(path)
    assert [r["step"] for r in got] == list(range(1, len(got) + 1)), "duplicate or missing steps"
    return np.array([r["loss"] for r in got])


@pytest.mark.parametrize("target", ["torch", "jax", "mlx"])
def test_sigterm_saves_exits_3_and_resumes(target):
    program = build(target, "single")
    cwd = Path(tempfile.mkdtemp(dir=WORK))
    run(program, target, cwd, "--steps", str(STEPS), "--metrics", "ref.jsonl", "--checkpoint-dir", "")
    reference = losses(cwd / "ref.jsonl")

    # launch.sh in its own process group, which SIGTERM reaches whole (the launcher passes it on too)
    args = ["--steps", str(STEPS), "--metrics", "m.jsonl", "--checkpoint-dir", "ck", "--checkpoint-every", "0"]
    p = subprocess.Popen([str(program / "launch.sh"), *args], cwd=cwd, env=env_for(target), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    wait_rows(cwd / "m.jsonl", 5, p)
    os.killpg(p.pid, signal.SIGTERM)
    out = p.communicate(timeout=240)[0]
    assert p.returncode == 3, out[-3000:]
    stopped = rows(cwd / "m.jsonl")[-1]["step"]
    assert 5 <= stopped < STEPS, out[-3000:]
    assert f"stopped by SIGTERM after step {stopped}: checkpoint saved in " in out, out[-3000:]
    assert f"checkpoint: step {stopped} saved in " in out, out[-3000:]
    assert len(os.listdir(cwd / "ck")) == 1  # the preemption's checkpoint, verified below by --resume

    out = run(program, target, cwd, *args, "--resume", "auto")
    assert f"resumed from ck at step {stopped}" in out, out[-3000:]
    got = losses(cwd / "m.jsonl")
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-6)


def test_resume_drops_metrics_rows_past_the_checkpoint():
    """A run killed after its checkpoint of step 4 wrote rows 5-6: the resumed run replaces them."""
    program = build("mlx", "single")  # (the same code in every target, common/cli.py.j2; mlx starts fastest)
    cwd = Path(tempfile.mkdtemp(dir=WORK))
    run(program, "mlx", cwd, "--steps", "8", "--metrics", "ref.jsonl", "--checkpoint-dir", "")
    run(program, "mlx", cwd, "--steps", "6", "--metrics", "m.jsonl", "--checkpoint-dir", "ck", "--checkpoint-every", "4")
    shutil.rmtree(cwd / "ck" / "step_00000006")  # as if killed before its save
    with open(cwd / "m.jsonl", "a") as f:
        f.write('{"step": 7, "loss"')  # and in the middle of a row
    run(program, "mlx", cwd, "--steps", "8", "--metrics", "m.jsonl", "--checkpoint-dir", "ck", "--resume", "auto")
    np.testing.assert_allclose(losses(cwd / "m.jsonl"), losses(cwd / "ref.jsonl"), rtol=0, atol=1e-6)


def alive(program: Path) -> str:
    return subprocess.run(["pgrep", "-af", str(program / "train.py")], check=False, capture_output=True, text=True).stdout


# (jax: launch.sh's NPROC processes; mlx: mlx.launch's)
LAUNCH_ENV = {"torch": {}, "jax": {"NPROC": "2"}, "mlx": {}}


@pytest.mark.parametrize("target", ["torch", "jax", "mlx"])
def test_killing_the_launcher_stops_every_process(target):
    program = build(target, "data=2")
    cwd = Path(tempfile.mkdtemp(dir=WORK))
    p = subprocess.Popen([str(program / "launch.sh"), "--steps", "100000", "--metrics", "m.jsonl", "--checkpoint-dir", ""],
                         cwd=cwd, env=env_for(target, LAUNCH_ENV[target]), start_new_session=True, text=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_rows(cwd / "m.jsonl", 3, p)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    end = time.monotonic() + 5
    while alive(program) and time.monotonic() < end:
        time.sleep(0.1)
    assert not alive(program), alive(program)


@pytest.mark.parametrize("target", ["jax", "mlx"])
def test_restart_after_a_process_dies(target):
    """The jax and mlx launchers' loop: a process killed mid-run under MAX_RESTARTS=1 stops the others, and
    the run starts again from the newest checkpoint to the uninterrupted losses."""
    program = build(target, "data=2")
    cwd = Path(tempfile.mkdtemp(dir=WORK))
    # long enough that the kill after 5 rows lands mid-run (an mlx step takes milliseconds, a jax save per
    # step most of a second): 60 mlx steps could end before the test, on a loaded machine, saw the processes
    steps = {"jax": "24", "mlx": "150"}[target]
    run(program, target, cwd, "--steps", steps, "--metrics", "ref.jsonl", "--checkpoint-dir", "", launcher=True,
        env=LAUNCH_ENV[target])
    args = ["--steps", steps, "--metrics", "m.jsonl", "--checkpoint-dir", "ck", "--checkpoint-every", "1"]
    p = subprocess.Popen([str(program / "launch.sh"), *args], cwd=cwd,
                         env=env_for(target, {"MAX_RESTARTS": "1", **LAUNCH_ENV[target]}),
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    wait_rows(cwd / "m.jsonl", 5, p)
    pids = [int(line.split()[0]) for line in alive(program).splitlines()]
    assert len(pids) == 2, alive(program)
    os.kill(max(pids), signal.SIGKILL)
    out = p.communicate(timeout=240)[0]
    assert p.returncode == 0, out[-4000:]
    assert "restart 1: continuing as --resume auto" in out, out[-4000:]
    np.testing.assert_allclose(losses(cwd / "m.jsonl"), losses(cwd / "ref.jsonl"), rtol=0, atol=1e-6)


def signal_one_rank(program, cwd, args, after_rows, sig, env=None):
    """Runs the torch program's launch.sh with `args` (2 ranks) and, once `after_rows` metrics rows are
    written, sends `sig` to one rank alone; returns (the launcher's process, its output)."""
    p = subprocess.Popen([str(program / "launch.sh"), *args], cwd=cwd, env=env_for("torch", env or {}), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_rows(cwd / "m.jsonl", after_rows, p)
        # launch.sh execs torchrun, whose children are the ranks
        ranks = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(p.pid)], check=False, capture_output=True, text=True).stdout.split()]
        assert len(ranks) == 2, ranks
        os.kill(max(ranks), sig)
        out = p.communicate(timeout=240)[0]
    finally:
        if p.poll() is None:  # (a hang: torchrun's ranks die with it, PR_SET_PDEATHSIG)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p, out


def test_torch_restart_after_a_rank_dies():
    """torchrun's restart: a rank killed mid-run under MAX_RESTARTS=1 brings the other down, and one restart
    (on a new store: none of the first attempt's keys) continues from the newest checkpoint to the
    uninterrupted losses, one metrics row per step."""
    program = build("torch", "data=2")
    cwd = Path(tempfile.mkdtemp(dir=WORK))
    steps = "40"
    run(program, "torch", cwd, "--steps", steps, "--metrics", "ref.jsonl", "--checkpoint-dir", "", launcher=True)
    args = ["--steps", steps, "--metrics", "m.jsonl", "--checkpoint-dir", "ck", "--checkpoint-every", "1", "--resume", "auto"]
    p, out = signal_one_rank(program, cwd, args, 5, signal.SIGKILL, {"MAX_RESTARTS": "1"})
    (cwd / "out.log").write_text(out)
    assert p.returncode == 0, out[-4000:]
    assert "restart 1: continuing as --resume auto" in out, out[-4000:]
    np.testing.assert_allclose(losses(cwd / "m.jsonl"), losses(cwd / "ref.jsonl"), rtol=0, atol=1e-6)


def test_torch_does_not_restart_a_refusal():
    """Exit 2 (a refusal, which a restart would repeat) ends a torch run under MAX_RESTARTS: said once, no
    restart (torchrun restarts after any failure; the launcher stops it here, as the jax and mlx loops do)."""
    program = build("torch", "data=2")
    cwd = Path(tempfile.mkdtemp(dir=WORK))
    out = run(program, "torch", cwd, "--steps", "4", "--checkpoint-dir", "", "--resume", "auto", rc=2, launcher=True,
              env={"MAX_RESTARTS": "1"})
    assert out.strip() == "error: --resume auto: this spec saves no checkpoints; pass --checkpoint-dir DIR", out[-3000:]


@pytest.mark.parametrize("target", ["torch", "jax", "mlx"])
def test_resume_with_another_lr(target):
    """Only the optimizer's settings changed (lr, weight decay): the resume goes on, with a note, on the
    new settings (the lr column of a fresh run of the new spec); another model is still refused."""
    program = build(target, "single")
    spec = WORK / "mlp-dp-lr.yaml"
    spec.write_text(SPEC.read_text().replace("lr: 1.0e-3, weight_decay: 0.01", "lr: 5.0e-4, weight_decay: 0.02"))
    other = WORK / f"{target}-lr"
    if not other.exists():
        render.build(compile_file(spec, "single"), target, other, str(spec))
    cwd = Path(tempfile.mkdtemp(dir=WORK))
    run(other, target, cwd, "--steps", "8", "--metrics", "ref.jsonl", "--checkpoint-dir", "")
    run(program, target, cwd, "--steps", "4", "--checkpoint-dir", "ck")
    out = run(other, target, cwd, "--steps", "8", "--metrics", "m.jsonl", "--checkpoint-dir", "ck", "--resume", "auto")
    assert "note: lr 0.001 -> 0.0005, weight_decay 0.01 -> 0.02 (the checkpoint's -> this program's)" in out, out[-3000:]
    assert [r["step"] for r in rows(cwd / "m.jsonl")] == [5, 6, 7, 8]
    assert [r["lr"] for r in rows(cwd / "m.jsonl")] == pytest.approx([r["lr"] for r in rows(cwd / "ref.jsonl")][4:], rel=1e-6)
    assert rows(cwd / "m.jsonl")[-1]["loss"] != pytest.approx(rows(cwd / "ref.jsonl")[-1]["loss"], abs=0)

    wider = WORK / "mlp-dp-wide.yaml"
    wider.write_text(SPEC.read_text().replace("hidden: 256", "hidden: 128"))
    refused = WORK / f"{target}-wide"
    if not refused.exists():
        render.build(compile_file(wider, "single"), target, refused, str(wider))
    out = run(refused, target, cwd, "--steps", "8", "--checkpoint-dir", "ck", "--resume", "auto", rc=2)
    assert "it is a checkpoint of another version of the spec 'mlp-dp'" in out, out[-3000:]
    # checkpoints refused alike (steps 2 and 4 of one run): the reason is said once, for both
    run(program, target, cwd, "--steps", "4", "--checkpoint-dir", "two", "--checkpoint-every", "2")
    out = run(refused, target, cwd, "--steps", "8", "--checkpoint-dir", "", "--resume", "two", rc=2)
    assert out.count("it is a checkpoint of another version") == 1, out[-3000:]
    steps = ("two/4, two/2: ") if target == "jax" else "two/step_00000004, two/step_00000002: "
    assert f"error: --resume two: no usable checkpoint: {steps}it is a checkpoint" in out, out[-3000:]


@pytest.mark.parametrize("target", ["torch", "jax"])
def test_async_checkpoints_resume_exactly(target):
    """--async-checkpoint: saves complete in the background (a line says how long training waited), and
    --resume continues on the uninterrupted run's losses."""
    program = build(target, "single")
    cwd = Path(tempfile.mkdtemp(dir=WORK))
    run(program, target, cwd, "--steps", "12", "--metrics", "ref.jsonl", "--checkpoint-dir", "")
    out = run(program, target, cwd, "--steps", "10", "--metrics", "m.jsonl", "--checkpoint-dir", "ck",
              "--checkpoint-every", "4", "--async-checkpoint")
    assert "checkpoint: step 4 saved in " in out and "(asynchronous: training waited " in out, out[-3000:]
    assert "checkpoint: step 10 saved in " in out, out[-3000:]  # the last one: synchronous
    shutil.rmtree(cwd / "ck" / ("step_00000010" if target == "torch" else "10"))  # resume from step 8's
    run(program, target, cwd, "--steps", "12", "--metrics", "m.jsonl", "--checkpoint-dir", "ck", "--resume", "auto")
    np.testing.assert_allclose(losses(cwd / "m.jsonl"), losses(cwd / "ref.jsonl"), rtol=0, atol=1e-6)


# Runs train.py's cli with a SIGTERM already asked when its Preemption is made (as if the signal came right
# after the handler was set): the run stops after its first step.
SIGNALLED = r'''
import signal, sys
sys.path.insert(0, @TESTS@)
from program_import import load_program
m = load_program(sys.argv[1])
class Signalled(m.Preemption):
    def __init__(self):
        super().__init__()
        self.ask(signal.SIGTERM, None)
m.Preemption = Signalled
m.cli(sys.argv[2:])
'''.replace("@TESTS@", repr(str(Path(__file__).resolve().parent)))


@pytest.mark.parametrize("target", ["torch", "jax", "mlx"])
def test_a_signal_in_the_last_step_ends_the_run_as_done(target):
    """A signal during the run's last step: the run is done (exit 0, --export-params written), not
    preempted (exit 3, whose `--resume auto` continuation to the same --steps would be refused: no step
    left); a signal during an earlier step still stops it with exit 3."""
    program = build(target, "single")
    cwd = Path(tempfile.mkdtemp(dir=WORK))

    def signalled(steps: str, where: str) -> subprocess.CompletedProcess:
        argv = [PY, "-c", SIGNALLED, str(program), "--steps", steps, "--checkpoint-dir", where, "--export-params", f"{where}.npz"]
        return subprocess.run(argv, cwd=cwd, env=env_for(target), capture_output=True, text=True, timeout=300, check=False)

    p = signalled("2", "early")
    assert p.returncode == 3 and "stopped by SIGTERM after step 1: checkpoint saved in " in p.stdout + p.stderr, p.stderr[-3000:]
    p = signalled("1", "last")
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "stopped by" not in p.stdout + p.stderr and (cwd / "last.npz").exists(), (p.stdout + p.stderr)[-3000:]
    assert os.listdir(cwd / "last") == ["step_00000001" if target != "jax" else "1"]


def test_torch_sigterm_to_one_rank_stops_every_rank_saved():
    """SIGTERM to one rank alone (not the process group): every rank stops after the same step, saved, and
    launch.sh exits 3 with rank 0's line only (before: plus `launch.sh: rank 0 failed with exit code 3`)."""
    program = build("torch", "data=2")
    cwd = Path(tempfile.mkdtemp(dir=WORK))
    args = ["--steps", str(STEPS), "--metrics", "m.jsonl", "--checkpoint-dir", "ck", "--checkpoint-every", "0"]
    p, out = signal_one_rank(program, cwd, args, 3, signal.SIGTERM)
    stopped = rows(cwd / "m.jsonl")[-1]["step"]
    assert p.returncode == 3, out[-3000:]
    assert f"stopped by a signal on another process after step {stopped}: checkpoint saved in " in out, out[-3000:]
    assert "launch.sh:" not in out, out[-3000:]
    assert os.listdir(cwd / "ck") == [f"step_{stopped:08d}"]
