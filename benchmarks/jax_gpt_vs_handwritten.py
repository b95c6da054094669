"""Step time of the generated JAX GPT program vs a hand-written jax.jit step of the same model.

    python benchmarks/jax_gpt_vs_handwritten.py [--steps 30] [--repeats 2] [--mesh data=2,fsdp=2,tensor=2]

Builds specs/gpt-tiny.yaml for the mesh with `mithril-spec build --target jax`, runs the generated
train.py (its `step_time_s` metric: one optimizer step including the host reading the next batch,
which overlaps the step) and benchmarks/handwritten_jax_gpt.py (the same model, optimizer and batch,
one batch placed on the devices once) on the same simulated CPU mesh. Reports the median ms/step of
each, leaving out the first (compiling) steps, and the ratio generated / hand-written. The two programs
run alternately `--repeats` times; the median of each program's medians is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    e["JAX_PLATFORMS"] = "cpu"
    return e


def generated(program: Path, steps: int, work: Path, i: int) -> float:
    metrics = work / f"metrics{i}.jsonl"
    subprocess.run([PY, str(program / "train.py"), "--steps", str(steps + 3), "--metrics", str(metrics),
                    "--checkpoint-dir", ""], check=True, cwd=work, env=env(), capture_output=True)
    times = [json.loads(line)["step_time_s"] for line in metrics.read_text().splitlines()][3:]
    return statistics.median(times) * 1e3


def handwritten(mesh: str, steps: int) -> float:
    out = subprocess.run([PY, str(ROOT / "benchmarks" / "handwritten_jax_gpt.py"), "--mesh", mesh, "--steps",
                          str(steps), "--warmup", "3"], check=True, env=env(), capture_output=True, text=True).stdout
    return float(re.search(r"median_ms/step=([\d.]+)", out).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run (after 3 untimed ones)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mesh", default="data=2,fsdp=2,tensor=2")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jax-bench-"))
    program = work / "gpt-tiny-jax"
    subprocess.run([PY, "-m", "mithril_spec.cli", "build", str(ROOT / "specs" / "gpt-tiny.yaml"), "--target", "jax",
                    "--mesh", args.mesh, "-o", str(program)], check=True, cwd=ROOT, capture_output=True)
    gen, hand = [], []
    for i in range(args.repeats):
        gen.append(generated(program, args.steps, work, i))
        hand.append(handwritten(args.mesh, args.steps))
        print(f"run {i + 1}: generated {gen[-1]:.2f} ms/step, hand-written {hand[-1]:.2f} ms/step", flush=True)
    g, h = statistics.median(gen), statistics.median(hand)
    print(json.dumps({"mesh": args.mesh, "steps": args.steps, "repeats": args.repeats,
                      "generated_ms_per_step": round(g, 2), "handwritten_ms_per_step": round(h, 2),
                      "ratio": round(g / h, 3)}))


if __name__ == "__main__":
    main()
