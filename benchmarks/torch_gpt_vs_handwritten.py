"""Step time of the generated PyTorch GPT program vs a hand-written nanoGPT-style PyTorch GPT.

Builds specs/gpt-tiny.yaml with `mithril-spec build --target torch` for one process and for 2 ranks
(data=2: DDP; fsdp=2: FSDP2), runs each next to benchmarks/handwritten_torch_gpt.py with the same model,
batch (16), optimizer (AdamW, clip 1.0) and rank count, and prints the median ms/step of both and their
ratio (generated / hand-written; below 1 means the generated program is faster).

    python benchmarks/torch_gpt_vs_handwritten.py [--steps 30] [--rounds 2] [--configs single,ddp,fsdp]

The generated program's time is its `step_time_s` metric, which includes drawing the batch (numpy, by
global sample index); the hand-written one times forward, backward, clipping and the update of a batch
drawn before the timer starts. Runs alternate (generated, hand-written, ...) for `--rounds` rounds and
each side keeps its best median, which damps the noise of a shared machine. Both use gloo on CPU (NCCL
on GPUs for the generated program) and torchrun for 2 ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mithril_spec import cli

HANDWRITTEN = ROOT / "benchmarks" / "handwritten_torch_gpt.py"
SPEC = ROOT / "specs" / "gpt-tiny.yaml"
CONFIGS = {  # name: (mesh for the build, ranks, handwritten --parallel)
    "single": ("data=1", 1, None),
    "ddp": ("data=2", 2, "ddp"),
    "fsdp": ("fsdp=2", 2, "fsdp"),
}
WARMUP = 3  # steps left out: the first steps are one-off warm-up on CPU


def env():
    e = dict(os.environ)
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1))))
    return e


def build(mesh: str, out: Path) -> Path:
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["build", str(SPEC), "--target", "torch", "--mesh", mesh, "-o", str(out)])
    if rc:
        raise SystemExit(f"build for {mesh} failed")
    return out


def launcher(ranks: int) -> list[str]:
    if ranks == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]


def generated_ms(program: Path, ranks: int, steps: int, work: Path) -> float:
    metrics = work / "metrics.jsonl"
    cmd = launcher(ranks) + [str(program / "train.py"), "--steps", str(WARMUP + steps), "--metrics", str(metrics),
                             "--checkpoint-dir", ""]
    subprocess.run(cmd, check=True, cwd=work, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()][WARMUP:]
    return statistics.median(r["step_time_s"] for r in rows) * 1e3


def handwritten_ms(ranks: int, parallel: str | None, steps: int, work: Path) -> float:
    cmd = launcher(ranks) + [str(HANDWRITTEN), "--steps", str(steps), "--warmup", str(WARMUP), "--batch", "16"]
    if parallel:
        cmd += ["--parallel", parallel]
    out = subprocess.run(cmd, check=True, cwd=work, env=env(), capture_output=True, text=True).stdout
    m = re.search(r"([0-9.]+) ms/step median", out)
    if not m:
        raise SystemExit(f"no timing in the hand-written benchmark's output:\n{out}")
    return float(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run")
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs per side; the best median counts")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"some of {', '.join(CONFIGS)}")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="torch-bench-"))
    results = {}
    for name in args.configs.split(","):
        mesh, ranks, parallel = CONFIGS[name]
        program = build(mesh, work / f"gpt-{name}")
        gen, hand = [], []
        for _ in range(args.rounds):
            gen.append(generated_ms(program, ranks, args.steps, work))
            hand.append(handwritten_ms(ranks, parallel, args.steps, work))
        g, h = min(gen), min(hand)
        results[name] = {"mesh": mesh, "ranks": ranks, "generated_ms": round(g, 2), "handwritten_ms": round(h, 2),
                         "ratio": round(g / h, 3), "generated_runs": [round(x, 2) for x in gen],
                         "handwritten_runs": [round(x, 2) for x in hand]}
        print(f"{name:7s} ({mesh}, {ranks} rank(s)): generated {g:7.2f} ms/step, hand-written {h:7.2f} ms/step, "
              f"ratio {g / h:.3f}   (runs: {results[name]['generated_runs']} vs {results[name]['handwritten_runs']})",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
