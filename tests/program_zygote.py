"""A process that imports a framework once and forks a fresh child for every program run a test asks for.

Starting a generated program costs seconds before its first step (importing torch and its distributed
packages, or jax, optax and orbax), and most test runs are a few steps long: paid per rank and per run,
those imports were half of the suite's time. The zygote pays them once per pytest session:

    python tests/program_zygote.py torch|jax      (started by `zygote(kind, env)`; one request per line)

Each request forks a child that takes the run's working directory, environment, stdout/stderr file (or a
file for each) and argv, and runs train.py as __main__ exactly as `python train.py` would (a fresh process per run: nothing a
program changes leaks into the next one). For several ranks the child forks one process per rank with
the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
and returns the first failing rank's exit code, stopping the others. Options: `coverage` (measure
train.py with coverage.py into DATA_FILE.*; `coverage_ranks`: only those ranks), `count` (count FSDP2's gradient collectives, and the bytes
sent point to point, into PREFIX.<rank>.json). Launchers (torchrun, launch.sh) are tested with real subprocesses elsewhere.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

PRELOAD = {
    "torch": ["numpy", "torch", "torch.distributed.checkpoint.state_dict", "torch.distributed.device_mesh",
              "torch.distributed.fsdp", "torch.distributed.pipelining", "torch.distributed.tensor.parallel",
              "torch.nn.parallel", "torch.utils.checkpoint", "safetensors.numpy", "coverage"],
    "jax": ["numpy", "jax", "jax.numpy", "optax", "orbax.checkpoint", "jax.experimental.multihost_utils",
            "safetensors.numpy", "coverage"],
}


# ------------------------------------------------------------------------------------------------ server

def serve(kind: str) -> None:
    for name in PRELOAD[kind]:
        importlib.import_module(name)
    if kind == "torch":  # the first meta-device op loads torch's meta kernels (a second): once, here
        import torch

        torch.empty(1, device="meta").normal_()
    os.write(1, b'{"ready": true}\n')
    children: dict[int, int] = {}
    buf = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        if readable:
            data = os.read(0, 1 << 16)
            if not data:  # the tests are done
                for pid in children:
                    _kill_group(pid)
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        code = _job(req)
                    finally:
                        os._exit(code)
                children[pid] = req["id"]
                os.write(1, json.dumps({"id": req["id"], "pid": pid}).encode() + b"\n")
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            rc = os.waitstatus_to_exitcode(status)
            os.write(1, json.dumps({"id": children.pop(pid), "rc": rc}).encode() + b"\n")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _job(req: dict) -> int:
    """One run, in its own process group (a timeout kills every rank)."""
    os.setpgid(0, 0)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    out = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    if req.get("err"):  # stderr to a file of its own
        err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(err, 2)
        os.close(err)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    train = req["train"]
    # as `python train.py` starts: the script's directory, then PYTHONPATH, before the rest
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [os.path.dirname(train), *extra]
    world = req["ranks"]
    if not req["rank_env"]:
        return _program(req, None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    ranks = {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
                code = _program(req, rank)
            finally:
                os._exit(code)
        ranks[pid] = rank
    first = 0
    while ranks:
        pid, status = os.wait()
        ranks.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        if code and not first:  # the others would wait for it in a collective: stop them
            first = code if code > 0 else 1
            for other in ranks:
                os.kill(other, signal.SIGTERM)
    return first


def _program(req: dict, rank: int | None) -> int:
    """train.py as __main__ with argv; its exit code (after its atexit functions, as at interpreter exit)."""
    import atexit
    import runpy
    import traceback

    import faulthandler

    faulthandler.enable()  # a crash in native code prints every thread's Python stack into the run's log
    train = req["train"]
    if req.get("count"):
        _count_collectives(req["count"], rank or 0)
    cov = None
    measured = req.get("coverage_ranks")
    if req.get("coverage") and (measured is None or (rank or 0) in measured):
        import coverage

        # (the build's files beside the script, runtime/ aside: generate.py imports the model from them)
        import glob

        measured = sorted(glob.glob(os.path.join(glob.escape(os.path.dirname(train)), "*.py")))
        cov = coverage.Coverage(data_file=req["coverage"], data_suffix=True, include=measured,
                                config_file=False)
        cov.set_option("run:patch", ["_exit"])  # the program's own os._exit saves the data first
        cov.start()
    sys.argv = [train, *req["argv"]]
    code = 0
    try:
        runpy.run_path(train, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 (as the interpreter does: the traceback, exit 1)
        traceback.print_exc()
        code = 1
    finally:
        if cov is not None:
            cov.stop()
            cov.save()
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _count_collectives(prefix: str, rank: int) -> None:
    import torch.distributed as dist

    counts = {"reduce_scatter": 0, "all_reduce": 0}
    for name, key in (("reduce_scatter_single", "reduce_scatter"), ("all_reduce", "all_reduce")):
        orig = getattr(dist, name)

        def counted(*a, _orig=orig, _key=key, **k):
            # on CPU the program's GlooReduceScatter runs FSDP2's reduce-scatter as an all-reduce in place
            caller = sys._getframe(1).f_code.co_qualname
            counts["reduce_scatter" if caller == "GlooReduceScatter.__call__" else _key] += 1
            return _orig(*a, **k)

        setattr(dist, name, counted)
    counts["sent_bytes"] = 0  # point-to-point (ring attention's batch_isend_irecv): the bytes this rank sends
    batch = dist.batch_isend_irecv

    def counted_batch(ops, _orig=batch):
        counts["sent_bytes"] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        return _orig(ops)

    dist.batch_isend_irecv = counted_batch
    destroy = dist.destroy_process_group

    def destroy_and_report(*a, **k):
        with open(f"{prefix}.{rank}.json", "w") as f:
            json.dump(counts, f)
        return destroy(*a, **k)

    dist.destroy_process_group = destroy_and_report


# ------------------------------------------------------------------------------------------------ client

class Zygote:
    """The tests' handle on one server: `run(...)` is thread-safe and blocks until the run's exit code."""

    def __init__(self, kind: str, env: dict):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), kind], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        first = self.proc.stdout.readline()
        if not first.startswith(b'{"ready"'):
            raise RuntimeError(f"the {kind} zygote did not start (exit {self.proc.wait()})")
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._pids: dict[int, int] = {}
        self._done: dict[int, concurrent.futures.Future] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._lock:
                if "pid" in msg:
                    self._pids[msg["id"]] = msg["pid"]
                else:
                    self._done.pop(msg["id"]).set_result(msg["rc"])
        with self._lock:  # the server died: nothing more will finish
            for fut in self._done.values():
                fut.set_exception(RuntimeError("the zygote exited"))

    def run(self, train: str, argv: list[str], *, cwd: str, env: dict, log: str, ranks: int = 1,
            rank_env: bool = False, timeout: float = 600, coverage: str | None = None,
            coverage_ranks: list[int] | None = None, count: str | None = None, err: str | None = None) -> int:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            rid = next(self._ids)
            self._done[rid] = fut
            req = {"id": rid, "train": train, "argv": argv, "cwd": cwd, "env": env, "log": log, "ranks": ranks,
                   "rank_env": rank_env, "coverage": coverage, "coverage_ranks": coverage_ranks, "count": count,
                   "err": err}
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                pid = self._pids.get(rid)
            if pid:
                _kill_group(pid)
            raise subprocess.TimeoutExpired([train, *argv], timeout) from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)


_zygotes: dict[str, Zygote] = {}
_zygotes_lock = threading.Lock()


def zygote(kind: str, env: dict) -> Zygote:
    """The session's zygote for `kind`, started on first use with `env` (what the framework reads when
    imported; each run brings its own environment)."""
    with _zygotes_lock:
        if kind not in _zygotes:
            import atexit

            _zygotes[kind] = Zygote(kind, env)
            atexit.register(_zygotes[kind].close)
        return _zygotes[kind]


if __name__ == "__main__":
    serve(sys.argv[1])
