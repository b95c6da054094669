"""Start N ranks of a training program without torchrun, for fast tests.

Sets the environment torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) and runs `module.main(argv)` in processes started by
torch.multiprocessing.spawn, which skips torchrun's agent and rendezvous (measured faster on
this 2-core machine). The program still calls init_process_group itself, exactly as under torchrun.

    python launch.py 4 gpt_train.py --mesh fsdp=4 --steps 5
"""

import importlib.util
import os
import socket
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank, world, port, path, argv):
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    spec = importlib.util.spec_from_file_location("train_program", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(argv)


def run(nprocs, path, argv):
    """Run `path` on `nprocs` ranks; raises if any rank fails (exit code in the exception)."""
    import torch.multiprocessing as mp

    mp.spawn(_child, args=(nprocs, free_port(), os.path.abspath(path), list(argv)), nprocs=nprocs, join=True)


if __name__ == "__main__":
    run(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
