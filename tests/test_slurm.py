"""launch.sbatch under a real SLURM (tests/slurm_cluster.py: one node on localhost, 2 CPUs; skipped, saying
why, where slurm-wlm / munge are missing or we are not root; scripts/setup.sh installs them in CI).

- torch, jax and mlx builds of the MLP for 2 processes, submitted with `sbatch --wait` from `/` (the job
  runs from SLURM's spool directory, in `/`): each job succeeds, and its losses equal the one-process run's
  (float32, within 1e-5 as the equivalence tests).
- A torch and a jax job signalled mid-run (`scancel --signal=TERM`) save a checkpoint and exit 3, the script
  requeues them, and the requeued run resumes to the losses of an uninterrupted run on the same mesh.
- Refusals, each one line and exit 2 before any Python starts: two tasks per node, a PYTHON that cannot
  import the framework, a MITHRIL_BUILD_DIR without train.py.

Jobs ask one CPU each (`--cpus-per-task=1`) so that two run at once on the 2-CPU node.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import pytest
import torch_runs as tr
from slurm_cluster import SlurmCluster, SlurmUnavailable

pytestmark = pytest.mark.slow

MLP = tr.SPECS / "mlp-dp.yaml"
STEPS = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        c = SlurmCluster.start(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as e:
        pytest.skip(f"no SLURM cluster: {e}")
    yield c
    c.stop()


def sbatch(cluster: SlurmCluster, program: Path, where: Path, *args: str, options: tuple[str, ...] = (),
           env: dict | None = None) -> tuple[int, str, list[float]]:
    """`sbatch --wait PROGRAM/launch.sbatch ARGS` from `/`: (exit code, the job's output, its losses)."""
    where.mkdir(parents=True, exist_ok=True)
    out, metrics = where / "job.out", where / "metrics.jsonl"
    cmd = ["sbatch", "--wait", f"--output={out}", "--cpus-per-task=1", *options, str(program / "launch.sbatch"),
           *args, "--metrics", str(metrics), "--checkpoint-dir", str(where / "ckpt")]
    p = subprocess.run(cmd, cwd="/", env={**cluster.env, "OMP_NUM_THREADS": "1", **(env or {})},
                       capture_output=True, text=True, check=False, timeout=180)
    output = out.read_text(errors="replace") if out.exists() else ""
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return p.returncode, p.stderr + output, losses


def test_jobs_from_another_directory_equal_one_process(cluster, tmp_path):
    programs = {"torch": tr.build(MLP, "data=2"), "jax": jr.build(MLP, "data=2"), "mlx": mr.build(MLP, "data=2")}
    # jax: launch.sh's NPROC=2 processes on the one node (sbatch passes the environment on)
    envs = {"jax": {"NPROC": "2"}}
    args = ("--steps", str(STEPS))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = {t: pool.submit(sbatch, cluster, p, tmp_path / t, *args, env=envs.get(t)) for t, p in programs.items()}
        refs = {"torch": tr.run(tr.build(MLP, "data=1"), *args).losses,
                "jax": jr.run(jr.build(MLP, "data=1"), *args).losses,
                "mlx": mr.run(mr.build(MLP, "data=1"), *args).losses}
        done = {t: f.result() for t, f in jobs.items()}
    for target, (rc, output, losses) in done.items():
        assert rc == 0, f"{target}: sbatch --wait exit {rc}\n{output[-4000:]}"
        assert len(losses) == STEPS, f"{target}: {len(losses)} losses\n{output[-4000:]}"
        diff = tr.max_diff(losses, refs[target])
        assert diff < 1e-5, f"{target}: the SLURM job's losses differ from one process by {diff:.2e}"
    jr.report("slurm: 2-process jobs", **{t: f"exit {d[0]}, final loss {d[2][-1]:.6f}" for t, d in done.items()})


def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    return lines[0]


def test_refusals_say_why_in_one_line(cluster, tmp_path):
    torch_prog, jax_prog = tr.build(MLP, "data=2"), jr.build(MLP, "data=2")
    # a Python without the framework: the venv's interpreter without its site-packages
    bare = tmp_path / "python-without-site"
    bare.write_text(f'#!/bin/sh\nexec {tr.PY} -S "$@"\n')
    bare.chmod(0o755)
    cases = {
        "tasks": (torch_prog, {"options": ("--ntasks-per-node=2",)},
                  "launch.sbatch: one task per node (--ntasks-per-node=1), got 2 tasks on 1 node(s)"),
        "python": (jax_prog, {"env": {"PYTHON": str(bare)}},
                   f"launch.sbatch: {bare} cannot import jax: set PYTHON to the Python that has it"),
        "build dir": (torch_prog, {"env": {"MITHRIL_BUILD_DIR": str(tmp_path)}},
                      f"launch.sbatch: no train.py in {tmp_path}: set MITHRIL_BUILD_DIR to the build's directory"),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = {name: pool.submit(sbatch, cluster, prog, tmp_path / name.replace(" ", "-"), "--steps", "1", **kw)
                for name, (prog, kw, _) in cases.items()}
        done = {name: f.result() for name, f in jobs.items()}
    for name, (rc, output, losses) in done.items():
        assert rc == 2 and not losses, f"{name}: exit {rc}\n{output}"
        assert one_line(output).startswith(cases[name][2]), f"{name}: {output}"
    assert os.access(torch_prog / "launch.sbatch", os.X_OK)


def job_state(cluster: SlurmCluster, job: str) -> dict:
    out = subprocess.run(["scontrol", "show", "job", job, "-o"], env=cluster.env, capture_output=True, text=True,
                         check=True).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def test_a_signalled_job_saves_is_requeued_and_ends_on_the_uninterrupted_losses(cluster, tmp_path):
    """`scancel --signal=TERM` mid-run: every rank finishes its step, train.py saves a checkpoint and exits 3,
    launch.sbatch requeues the job, and the requeued run continues from the checkpoint (--resume auto) to the
    losses of an uninterrupted run, one metrics row per step."""
    import time

    steps = 300
    programs = {"torch": tr.build(MLP, "data=2"), "jax": jr.build(MLP, "data=2")}
    # the uninterrupted run on the same mesh (over 300 steps the 2-process run drifts from the one-process
    # run by rounding alone, ~1e-3: the 5-step test above compares those)
    refs = {"torch": tr.run(programs["torch"], "--steps", str(steps)).losses,
            "jax": jr.run(programs["jax"], "--steps", str(steps), launcher=["bash", str(programs["jax"] / "launch.sh")],
                          env={"NPROC": "2", "PYTHON": jr.PY}).losses}
    for target, program in programs.items():
        where = tmp_path / target
        where.mkdir()
        metrics = where / "metrics.jsonl"
        env = {**cluster.env, "OMP_NUM_THREADS": "1", **({"NPROC": "2"} if target == "jax" else {})}
        job = subprocess.run(["sbatch", "--parsable", f"--output={where / 'job.out'}", "--open-mode=append",
                              "--cpus-per-task=2", str(program / "launch.sbatch"), "--steps", str(steps),
                              "--metrics", str(metrics), "--checkpoint-dir", str(where / "ckpt"),
                              "--checkpoint-every", "100"],
                             cwd="/", env=env, capture_output=True, text=True, check=True).stdout.strip()
        deadline = time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):  # mid-run
            assert time.monotonic() < deadline, f"{target}: no steps after 120 s\n{(where / 'job.out').read_text()}"
            time.sleep(0.02)
        subprocess.run(["scancel", "--signal=TERM", job], env=cluster.env, check=True)
        seen, deadline = [], time.monotonic() + 240  # the requeued run: SLURM's requeue, the restart, 300 steps
        while (state := job_state(cluster, job))["JobState"] != "COMPLETED" or state.get("Restarts") == "0":
            # (SLURM holds the requeued job back until the first run's credential has expired: cred_expire in
            # tests/slurm_cluster.py; starting it earlier, `scontrol update StartTime=now`, ends it FAILED)
            assert state["JobState"] not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), f"{target}: {seen}"
            now = (state["JobState"], state.get("Reason"), state.get("Restarts"), state.get("EligibleTime"))
            if not seen or seen[-1][1:] != now:
                seen.append((round(time.monotonic() - deadline + 240, 1), *now))
            assert time.monotonic() < deadline, (
                f"{target}: not done; states (s, state, reason, restarts, eligible): {seen}\n"
                f"{(where / 'job.out').read_text()[-3000:]}\nslurmctld.log:\n"
                f"{(cluster.root / 'slurmctld.log').read_text()[-3000:]}")
            time.sleep(0.5)
        print(f"{target}: states after the signal (s, state, reason, restarts, eligible): {seen}")
        output = (where / "job.out").read_text()
        assert "stopped by SIGTERM after step" in output and "requeueing job" in output, output[-4000:]
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        assert [r["step"] for r in rows] == list(range(1, steps + 1)), f"{target}: steps {[r['step'] for r in rows][:20]}"
        diff = tr.max_diff([r["loss"] for r in rows], refs[target])
        assert diff < 1e-5, f"{target}: the requeued job's losses differ from an uninterrupted run by {diff:.2e}"
        jr.report(f"slurm: {target} signalled and requeued", restarts=state["Restarts"], max_dloss=diff)
