"""A one-node SLURM cluster on localhost for the tests: munged, slurmctld and slurmd started as root from a
temporary directory (their configuration, state, spool and logs all there; no systemd, no cgroups), stopped
when the cluster is. scripts/setup.sh installs slurm-wlm and munge where it runs as root.

    with SlurmCluster.start(tmp) as cluster:       # SlurmUnavailable(reason) where it cannot start
        subprocess.run(["sbatch", "--wait", script], env=cluster.env)

`cluster.env` is os.environ with SLURM_CONF pointing at the cluster's slurm.conf (the clients read it, and
its AuthInfo the munge socket)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

COMMANDS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo", "srun", "scontrol")


class SlurmUnavailable(Exception):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(name: str) -> str | None:
    """`name` on PATH, or in /usr/sbin or /sbin (the daemons' place, often not on a user's PATH)."""
    for d in ("/usr/sbin", "/sbin"):
        if os.access(f"{d}/{name}", os.X_OK):
            return shutil.which(name) or f"{d}/{name}"
    return shutil.which(name)


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    @classmethod
    def start(cls, root: Path, timeout: float = 30.0) -> SlurmCluster:
        missing = [d for d in COMMANDS if _which(d) is None]
        if missing:
            raise SlurmUnavailable(f"not installed: {', '.join(missing)} (scripts/setup.sh installs slurm-wlm and munge)")
        if os.geteuid() != 0:
            raise SlurmUnavailable("starting slurmctld/slurmd/munged needs root")
        cluster = cls(root)
        try:
            cluster._start(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start(self, timeout: float) -> None:
        r = self.root
        for d in ("state", "spool", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key, sock = r / "munge" / "munge.key", r / "munge" / "munge.socket"
        subprocess.run([_which("mungekey"), "--create", "--keyfile", str(key)], check=True, capture_output=True)
        self.conf.write_text("\n".join([
            "ClusterName=mithril-test",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            # cred_expire: a job step's credential lifetime, which is also how long SLURM holds a requeued job
            # back (a restart before it has expired is killed: "Job credential revoked"); 120 s by default
            f"AuthInfo=socket={sock},cred_expire=10",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",  # no cgroups in a container
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            # a pending job that became eligible (a requeued one, once its begin time is past) starts within
            # seconds, not at the next of the default 60 s (main) / 30 s (backfill) scheduling passes
            "SchedulerParameters=sched_interval=2,bf_interval=2",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobRequeue=1",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MinJobAge=300",
            "KillWait=5",
            "InactiveLimit=0",
            f"NodeName=localhost CPUs={len(os.sched_getaffinity(0))} State=UNKNOWN",  # (nproc)
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        self._spawn([_which("munged"), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                     f"--pid-file={r / 'munge' / 'munged.pid'}", f"--seed-file={r / 'munge' / 'seed'}",
                     f"--log-file={r / 'munged.log'}"], "munged")
        self._wait(lambda: sock.exists(), timeout, "munged did not create its socket", "munged.log")
        self._spawn([_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._spawn([_which("slurmd"), "-D", "-N", "localhost", "-f", str(self.conf)], "slurmd")  # whatever the hostname

        def idle() -> bool:
            out = subprocess.run([_which("sinfo"), "-h", "-N", "-o", "%t"], env=self.env, capture_output=True,
                                 text=True, check=False)
            return out.returncode == 0 and out.stdout.strip() == "idle"

        self._wait(idle, timeout, "the node did not become idle", "slurmctld.log", "slurmd.log")

    def _spawn(self, cmd: list[str], name: str) -> None:
        with open(self.root / f"{name}.stdout", "wb") as out:
            self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                               cwd=self.root, start_new_session=True))

    def _wait(self, ready, timeout: float, what: str, *logs: str) -> None:
        end = time.monotonic() + timeout
        while not ready():
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > end:
                tails = []
                for log in (*logs, *(f"{Path(p.args[0]).name}.stdout" for p in self.procs)):
                    f = self.root / log
                    if f.exists():
                        tails.append(f"--- {f}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
                raise SlurmUnavailable(f"{what} (logs in {self.root})\n" + "\n".join(tails))
            time.sleep(0.2)

    def stop(self) -> None:
        """Stops the daemons this cluster started (by their process ids), slurmd and slurmctld first."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
