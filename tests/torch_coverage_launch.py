"""Start N ranks of a generated PyTorch program under coverage.py, for tests/test_program_coverage_torch.py.

    python tests/torch_coverage_launch.py N path/to/train.py DATA_FILE [train.py arguments...]

Like tests/torch_launch.py it sets the environment torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), but it forks the ranks from this process once it has imported
torch, so that no rank imports it again (about three times faster on two cores than `torchrun ... coverage
run`), and each rank runs train.py as __main__ measured by coverage.py into its own DATA_FILE.* (the
program's os._exit saves the data first: coverage's `_exit` patch). Exits with the first failing rank's
exit code, 0 when every rank succeeds.
"""

import os
import sys


def launch(world: int, train: str, data_file: str, argv: list[str]) -> int:
    """Forks `world` ranks of `train` with torchrun's environment, each measured by coverage.py into its own
    `data_file.*`; returns the first failing rank's exit code (0 when every rank succeeds)."""
    import socket

    # imported once, here: every rank inherits them
    import numpy  # noqa: F401
    import torch.distributed.checkpoint.state_dict
    import torch.distributed.device_mesh
    import torch.distributed.fsdp
    import torch.distributed.pipelining
    import torch.distributed.tensor.parallel
    import torch.nn.parallel
    import torch.utils.checkpoint  # noqa: F401

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            _rank(rank, world, port, train, data_file, argv)  # never returns
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    return next((c for c in codes if c), 0)


def _rank(rank: int, world: int, port: int, train: str, data_file: str, argv: list[str]) -> None:
    import runpy
    import traceback

    import coverage

    exit_ = os._exit  # the program's own os._exit (shutdown) saves the data first: coverage patches it
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    code = 1
    cov = coverage.Coverage(data_file=data_file, data_suffix=True, include=[train], config_file=False)
    cov.set_option("run:patch", ["_exit"])
    try:
        cov.start()
        sys.argv = [train, *argv]
        runpy.run_path(train, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        if sys.exc_info()[0] not in (None, SystemExit):  # a failing rank: its traceback, exit code 1
            traceback.print_exc()
        cov.stop()
        cov.save()
        sys.stdout.flush()
        sys.stderr.flush()
        exit_(code)


if __name__ == "__main__":
    sys.exit(launch(int(sys.argv[1]), os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3]), sys.argv[4:]))
