"""Page faults per training step of the generated PyTorch GPT program and the hand-written one, on the CPU.

A step's time on a shared machine is noisy (benchmarks/torch_gpt_vs_handwritten.py takes ratios of
interleaved pairs); its page faults are not. A minor fault costs the kernel a zeroed 4 KiB page (measured
here: a fresh mapping filled, less the same bytes filled again), so faults x that cost is the time a step
spends on memory the allocator handed back to the kernel and asks for again. Each program runs twice, for
`--short` and `--long` steps (same launcher, same arguments as the step-time benchmark); the faults of the
processes (torchrun's ranks included: it waits for them) between the two runs, divided by the steps
between them, are the faults of one step (start-up and imports cancel out).

    python benchmarks/torch_page_faults.py
    python benchmarks/torch_page_faults.py --cases tiny-1 --program /tmp/old-build   # a program built before
"""

from __future__ import annotations

import argparse
import mmap
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_gpt_vs_handwritten as bench


def fault_cost_s(size: int = 64 << 20, repeats: int = 9) -> float:
    """Seconds one 4 KiB page fault costs: filling a fresh anonymous mapping, less filling touched memory."""
    touched = np.ones(size // 4, np.float32)
    fresh, warm = [], []
    for _ in range(repeats):
        m = mmap.mmap(-1, size)
        a = np.frombuffer(m, np.float32)
        t0 = time.perf_counter()
        a.fill(1)
        fresh.append(time.perf_counter() - t0)
        del a
        m.close()
        t0 = time.perf_counter()
        touched.fill(1)
        warm.append(time.perf_counter() - t0)
    return (statistics.median(fresh) - statistics.median(warm)) / (size // 4096)


def faults(cmd: list[str], work: Path) -> int:
    """Minor page faults of `cmd` and the processes it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    bench.run(cmd, work)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before


def generated_cmd(program: Path, ranks: int, steps: int) -> list[str]:
    return [*bench.launcher(ranks), str(program / "train.py"), "--steps", str(steps), "--checkpoint-dir", ""]


def handwritten_cmd(shape: str, ranks: int, data: Path, steps: int) -> list[str]:
    s, t = bench.SHAPES[shape], bench.TRAINING
    return [*bench.launcher(ranks), str(bench.HANDWRITTEN), "--data", str(data), "--steps", str(steps),
            *[a for k, flag in bench.NANOGPT_NAMES.items() for a in (flag, str(s[k]))],
            "--batch", str(s["batch"]), "--lr", str(t["lr"]), "--betas", *map(str, t["betas"]),
            "--weight-decay", str(t["weight_decay"]), "--warmup", str(t["warmup"]),
            "--lr-steps", str(t["lr_steps"]), "--grad-clip", str(t["grad_clip"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="tiny-1,tiny-ddp", help="some of tiny-1, tiny-ddp")
    ap.add_argument("--short", type=int, default=5, help="steps of the first run")
    ap.add_argument("--long", type=int, default=55, help="steps of the second run")
    ap.add_argument("--program", help="a generated program built already (for the first case only), rather "
                    "than the one this checkout builds")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="torch-faults-"))
    cost = fault_cost_s()
    print(f"one page fault: {cost * 1e6:.2f} us\n")
    print("| case | program | faults / step | ~ms / step in faults |\n|---|---|---|---|")
    for i, name in enumerate(args.cases.split(",")):
        shape, ranks = bench.CASES[name]
        program = Path(args.program) if args.program and i == 0 else bench.build(shape, ranks, work / name)
        data = bench.token_file(shape, work / f"{shape}-tokens.bin")
        for who in ("generated", "hand-written"):
            runs = [generated_cmd(program, ranks, n) if who == "generated" else handwritten_cmd(shape, ranks, data, n)
                    for n in (args.short, args.long)]
            per_step = (faults(runs[1], work) - faults(runs[0], work)) / (args.long - args.short)
            print(f"| {name} | {who} | {per_step:.0f} | {per_step * cost * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
