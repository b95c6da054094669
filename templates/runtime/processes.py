"""The process itself, on Linux (glibc): a sharded run's host memory kept compact, an unsharded one's kept
mapped from step to step, and a rank that dies with the torchrun that launched it. Elsewhere they do
nothing."""

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


def keep_host_memory_mapped():
    """On a CPU, glibc hands the free top of its heap back to the kernel once it exceeds the trim threshold
    (twice the mmap threshold, which grows to the largest block freed, up to 32 MB), and maps blocks above
    the mmap threshold anew at each allocation: every step, a step's activations page-fault their memory
    back in, a zeroed 4 KiB page at a time (gpt-tiny, one process: ~900 faults a step at 2-4 us each, 2-4%
    of the step; 20 with this; benchmarks/torch_page_faults.py). A fixed mmap threshold of 32 MB (glibc's
    largest; larger blocks are still mapped) and no trimming keep the memory a step freed for the next
    one: the process keeps its peak (which it reached anyway). Not in programs that shard over fsdp
    (keep_host_memory_compact)."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD (glibc); elsewhere nothing to do
        libc.mallopt(-3, 1 << 25)  # M_MMAP_THRESHOLD
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
