"""Training-step time of the generated JAX GPT program vs a hand-written jax.jit program of the same run.

    python benchmarks/jax_gpt_vs_handwritten.py [--cases tiny,gpt2] [--pairs N] [--steps N] [--warmup N]

Two cases, each on one device (`--mesh data=1`; the CPU unless JAX_PLATFORMS says otherwise):
  tiny  specs/gpt-tiny.yaml as it is: vocab 256, 4 layers, 4 heads, d 128, ff 512, seq 64, batch 16
  gpt2  the GPT-2 small shape, gpt-tiny with `--set` overrides: vocab 50257, 12 layers, 12 heads, d 768,
        ff 3072, seq 256, batch 4 (the lm_head tied to the embedding, as in gpt-tiny)
The generated side is `mithril-spec build ... --target jax --mesh data=1` and its train.py; the hand-written
side is benchmarks/handwritten_jax_gpt.py with the same sizes: the same model, batch, optimizer (AdamW, clip
1.0) and lr schedule, written as one would by hand (nanoGPT's loop around one jitted, donating step).

What is timed, the same way on both sides: wall-clock time per iteration of the training loop, everything
included (drawing and placing the batch, the step, reading the figures, logging). Both programs print one
line per step, flushed; this script timestamps each line as it arrives and takes the intervals between
consecutive lines. A run is `--warmup` + `--steps` steps: the first `--warmup` ones (compiling) are left
out, and the run's figure is the median of the intervals that end at the other `--steps` lines. (The
generated program's own `step_time_s` measures the same interval, from one step's figures being read to
the next one's; its median is printed alongside, `gen_self_ms`.)

The two programs run alternately, generated then hand-written, `--pairs` times per case; both share a
persistent compilation cache, so only their first runs compile from scratch (compiling is not timed
anyway). Per case: the median ms/step of each side over its runs, the ratio generated / hand-written (the
median of the per-pair ratios) and its spread (the smallest and largest per-pair ratio).

Defaults (about 8 minutes on a 2-core CPU): tiny 4 pairs of 2 + 12 steps, gpt2 2 pairs of 1 + 1 steps (a
GPT-2 step takes about 20 s there; `--cases gpt2 --steps 3` times more of them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
HANDWRITTEN = ROOT / "benchmarks" / "handwritten_jax_gpt.py"

# case -> (gpt-tiny overrides, hand-written flags, default pairs, timed steps, warmup steps)
GPT2 = {"vocab": 50257, "layers": 12, "heads": 12, "d": 768, "ff": 3072, "seq": 256}
CASES = {
    "tiny": ([], [], 4, 12, 2),
    "gpt2": ([f"dims.{k}={v}" for k, v in GPT2.items()] + ["training.batch_size=4"],
             [f"--{k}={v}" for k, v in GPT2.items()] + ["--batch=4"], 2, 1, 1),
}
STEP_LINE = re.compile(r"^(step \d+/\d+ \||iter \d+:)")  # the generated program's / the hand-written one's


def env(cache: Path) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    e.setdefault("JAX_PLATFORMS", "cpu")
    e["JAX_COMPILATION_CACHE_DIR"] = str(cache)  # later runs of a side load its compiled step
    e["PYTHONUNBUFFERED"] = "1"
    return e


def timed_run(cmd: list[str], cwd: Path, cache: Path, warmup: int, steps: int) -> float:
    """Runs `cmd`, timestamping its step lines as they arrive: the median interval (ms) between consecutive
    lines, those ending at the first `warmup` lines left out."""
    stamps, tail = [], []
    with subprocess.Popen(cmd, cwd=cwd, env=env(cache), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as p:
        for line in p.stdout:
            if STEP_LINE.match(line):
                stamps.append(time.perf_counter())
            tail = (tail + [line])[-20:]
    if p.returncode != 0 or len(stamps) != warmup + steps:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}, {len(stamps)} step lines\n{''.join(tail)}")
    intervals = [b - a for a, b in itertools.pairwise(stamps)]  # intervals[j]: the iteration of step j + 2
    return statistics.median(intervals[warmup - 1 :]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="tiny,gpt2", help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--pairs", type=int, help="runs of each side per case (default: tiny 4, gpt2 2)")
    ap.add_argument("--steps", type=int, help="timed steps per run (default: tiny 12, gpt2 1)")
    ap.add_argument("--warmup", type=int, help="untimed steps at the start of each run, >= 1 (default: tiny 2, gpt2 1)")
    args = ap.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown or (args.warmup is not None and args.warmup < 1):
        ap.error(f"unknown case(s) {unknown}" if unknown else "--warmup must be at least 1 (the compiling step)")
    work = Path(tempfile.mkdtemp(prefix="jax-bench-"))
    print(f"work directory {work}; JAX_PLATFORMS={env(work)['JAX_PLATFORMS']}", flush=True)
    results = []
    for case in cases:
        overrides, hand_flags, pairs, steps, warmup = CASES[case]
        pairs, steps, warmup = args.pairs or pairs, args.steps or steps, args.warmup or warmup
        total = warmup + steps
        program = work / f"{case}-jax"
        sets = [a for o in overrides for a in ("--set", o)]
        subprocess.run([PY, "-m", "mithril_spec.cli", "build", str(ROOT / "specs" / "gpt-tiny.yaml"), "--target",
                        "jax", "--mesh", "data=1", *sets, "-o", str(program)], check=True, cwd=ROOT,
                       capture_output=True)
        gen_cmd = [PY, str(program / "train.py"), "--steps", str(total), "--checkpoint-dir", "", "--metrics"]
        hand_cmd = [PY, str(HANDWRITTEN), "--steps", str(total), *hand_flags]
        gen, hand, self_ms = [], [], []
        for i in range(pairs):
            metrics = work / f"{case}-metrics{i}.jsonl"
            gen.append(timed_run(gen_cmd + [str(metrics)], work, work / "cache-generated", warmup, steps))
            rows = [json.loads(line) for line in metrics.read_text().splitlines()]
            self_ms.append(statistics.median(r["step_time_s"] for r in rows[warmup:]) * 1e3)
            hand.append(timed_run(hand_cmd, work, work / "cache-handwritten", warmup, steps))
            print(f"{case} pair {i + 1}/{pairs}: generated {gen[-1]:.1f} ms/step (its step_time_s {self_ms[-1]:.1f}), "
                  f"hand-written {hand[-1]:.1f} ms/step, ratio {gen[-1] / hand[-1]:.3f}", flush=True)
        ratios = [g / h for g, h in zip(gen, hand)]
        results.append({"case": case, "pairs": pairs, "steps": steps, "warmup": warmup,
                        "generated_ms": round(statistics.median(gen), 2),
                        "handwritten_ms": round(statistics.median(hand), 2),
                        "ratio": round(statistics.median(ratios), 3),
                        "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
                        "gen_self_ms": round(statistics.median(self_ms), 2)})
    print(f"\n{'case':6s} {'generated ms/step':>18s} {'hand-written ms/step':>21s} {'ratio':>7s}  spread (min-max)")
    for r in results:
        print(f"{r['case']:6s} {r['generated_ms']:18.1f} {r['handwritten_ms']:21.1f} {r['ratio']:7.3f}  "
              f"{r['ratio_min']:.3f}-{r['ratio_max']:.3f}  ({r['pairs']} pairs x {r['steps']} steps)")
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
