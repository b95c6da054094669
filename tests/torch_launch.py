"""Start N ranks of a generated PyTorch program without torchrun, for fast tests.

    python tests/torch_launch.py N path/to/train.py [train.py arguments...]

Sets the environment torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and runs the program's `main(parse_args(argv))` in processes started by
torch.multiprocessing.spawn, which skips torchrun's agent and rendezvous (about twice as fast to start
on a 2-core machine). The program still calls init_process_group itself, as under torchrun. Exits with
the first failing rank's exit code (2 when the program rejects the launch), 0 when every rank succeeds.

With MITHRIL_COUNT_COLLECTIVES=PREFIX set, each rank counts the calls of the gradient collectives FSDP2
issues (torch.distributed.reduce_scatter_single, on CPU the program's GlooReduceScatter, and all_reduce for
HSDP and the loss) and writes them
to PREFIX.<rank>.json when the program destroys its process group.
"""

import os
import socket
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank, world, port, path, argv):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.argv = [path, *argv]
    if os.environ.get("MITHRIL_COUNT_COLLECTIVES"):
        from program_zygote import _count_collectives  # (this script's directory is on sys.path)

        _count_collectives(os.environ["MITHRIL_COUNT_COLLECTIVES"], rank)
    from program_import import load_program  # (this script's directory is on sys.path)

    load_program(os.path.dirname(path)).cli(argv)


def main():
    import torch.multiprocessing as mp

    n, path, argv = int(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3:]
    try:
        mp.spawn(_child, args=(n, free_port(), path, argv), nprocs=n, join=True)
    except mp.ProcessExitedException as e:
        sys.exit(e.exit_code if e.exit_code and e.exit_code > 0 else 1)
    except mp.ProcessRaisedException as e:
        print(e, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
