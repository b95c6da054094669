"""The process itself, on Linux (glibc): a sharded run's host memory kept compact, and a rank that dies
with the torchrun that launched it. Elsewhere both do nothing."""

import ctypes
import os
import signal
import sys


def keep_host_memory_compact():
    """glibc serves allocations below its mmap threshold from its heap, and raises the threshold (up to
    32 MB) whenever a larger block is freed; from then on the tensors a step frees (activations, gathered
    shards, gradients) stay in the heap, fragmented, and a sharded run's host peak grows by about the size
    of its shards. A fixed threshold of 256 KiB hands every tensor of 256 KiB or more (a sharded rank's
    activations included) back when it is freed (benchmarks/init_scale.py: 0.59 -> 0.45 of the one-process
    peak per rank on fsdp=4 with 1 MiB; 256 KiB: 100 MB less again on 200M parameters). Only programs that
    shard over fsdp: it costs every step the mapping (and zeroing) of its large tensors anew."""
    try:
        ctypes.CDLL(None).mallopt(-3, 1 << 18)  # M_MMAP_THRESHOLD (glibc); elsewhere nothing to do
    except (OSError, AttributeError):
        pass


def die_with_launcher():
    """torchrun starts each rank in a session of its own: killing the launcher's process group (kill -9 of
    launch.sh, a closed terminal) would leave the ranks training, and writing checkpoints. On Linux each
    rank has the kernel send it SIGKILL when its parent, torchrun, dies (prctl PR_SET_PDEATHSIG)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # torchrun died before the call: nothing would tell this rank
        os._exit(1)
