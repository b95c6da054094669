"""Step time of the generated PyTorch GPT program vs a hand-written nanoGPT-style PyTorch GPT.

One run compares, case by case, the program `mithril-spec build --target torch` renders with
benchmarks/handwritten_torch_gpt.py (nanoGPT's model.py and train.py, reduced to what the spec trains: the
same model, global batch, AdamW hyperparameters, warmup + cosine schedule and clipping) at two shapes:

    tiny   specs/gpt-tiny.yaml as it is (vocab 256, seq 64, d 128, 4 heads, ff 512, 4 layers, batch 16)
    gpt2   GPT-2 small: gpt-tiny with `--set` dims vocab 50257, seq 256, d 768, 12 heads, ff 3072,
           12 layers, batch 4 (lm_head tied to wte, as in gpt-tiny)

each on one process (`-1`) and with DDP on 2 ranks (`-ddp`: torchrun, gloo on CPU, NCCL on GPUs; the
generated program built with `--mesh data=2`). Each case runs `--pairs` interleaved pairs of processes
(generated, hand-written, generated, hand-written, ...), every process for `warmup + steps` steps.

What is timed, on both sides: the wall-clock time of each training step in steady state (the first `warmup`
steps left out), the whole loop iteration: drawing the batch, forward, backward, clipping, the update and
the program's own per-step bookkeeping (the generated program's metrics row and console line, nanoGPT's
`loss.item()` and log line). The generated program's number is its `step_time_s` metric, which covers
exactly that (the time between the ends of consecutive steps; checkpoints are off); the hand-written one's
is nanoGPT's `dt = t1 - t0` of consecutive iterations. Each side's figure for a pair is its median step;
the table gives, per case, the median over pairs of each side, the median of the per-pair ratios
generated / hand-written (below 1: the generated program is faster) and their spread (min-max).

Threads: neither side is told how many to use; the generated program takes the cores / local ranks, the
hand-written one torch's default (torchrun sets OMP_NUM_THREADS=1 per rank). Both run with
OMP_WAIT_POLICY=PASSIVE (unless it is set): on a machine shared with other work, OpenMP threads that spin
while their partner has lost its core make a step up to 20x slower. Not timed: the generated program at
GPT-2 small reads its initial parameters from a file it exported once (--init-params), rather than drawing
them again in every run.

    python benchmarks/torch_gpt_vs_handwritten.py                          # all four cases, ~10 min on 2 cores
    python benchmarks/torch_gpt_vs_handwritten.py --cases tiny-1,tiny-ddp --pairs 5 --steps 30
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mithril_spec import cli

HANDWRITTEN = ROOT / "benchmarks" / "handwritten_torch_gpt.py"
SPEC = ROOT / "specs" / "gpt-tiny.yaml"
# the spec's training settings, which the hand-written program is given as they are
TRAINING = {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "warmup": 5, "lr_steps": 20, "grad_clip": 1.0}
SHAPES = {
    "tiny": {"vocab": 256, "seq": 64, "d": 128, "heads": 4, "ff": 512, "layers": 4, "batch": 16},
    "gpt2": {"vocab": 50257, "seq": 256, "d": 768, "heads": 12, "ff": 3072, "layers": 12, "batch": 4},
}
NANOGPT_NAMES = {"vocab": "--vocab-size", "seq": "--block-size", "d": "--n-embd", "heads": "--n-head", "ff": "--n-ff",
                 "layers": "--n-layer"}  # the hand-written program's flags for the dims
CASES = {"tiny-1": ("tiny", 1), "tiny-ddp": ("tiny", 2), "gpt2-1": ("gpt2", 1), "gpt2-ddp": ("gpt2", 2)}


def overrides(shape: str) -> list[str]:
    """`--set` arguments that turn gpt-tiny into `shape`."""
    if shape == "tiny":
        return []
    s = SHAPES[shape]
    dims = [f"dims.{k}={s[k]}" for k in ("vocab", "seq", "d", "heads", "ff", "layers")]
    return [a for kv in [*dims, f"training.batch_size={s['batch']}"] for a in ("--set", kv)]


def build(shape: str, ranks: int, out: Path) -> Path:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # (warnings)
        rc = cli.main(["build", str(SPEC), "--target", "torch", "--mesh", f"data={ranks}", *overrides(shape),
                       "-o", str(out)])
    if rc:
        raise SystemExit(f"build of {shape} for data={ranks} failed")
    return out


def token_file(shape: str, path: Path) -> Path:
    """nanoGPT's train.bin for the hand-written side: uint16 token ids below the vocabulary size."""
    rng = np.random.default_rng(0)
    rng.integers(0, SHAPES[shape]["vocab"], size=1 << 20, dtype=np.int64).astype(np.uint16).tofile(path)
    return path


def launcher(ranks: int) -> list[str]:
    if ranks == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    # idle OpenMP threads sleep rather than spin (both sides): on a shared machine a spinning thread whose
    # partner lost its core makes a step up to 20x slower, which no number of pairs averages away
    e.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return e


def run(cmd: list[str], work: Path) -> str:
    proc = subprocess.run(cmd, cwd=work, env=env(), capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def initial_params(program: Path, work: Path) -> Path:
    """The generated program's initial parameters, exported once: its later runs read them (--init-params)
    rather than draw them again, which at GPT-2 small takes longer than the steps timed."""
    path = work / f"{program.name}-init.safetensors"
    if path.exists():
        return path
    run([sys.executable, str(program / "train.py"), "--steps", "0", "--checkpoint-dir", "", "--export-params",
         str(path)], work)
    return path


def generated(program: Path, ranks: int, warmup: int, steps: int, work: Path, init: Path | None = None
              ) -> tuple[list[float], int]:
    """The generated program's step times (ms, steady state) and its parameter count."""
    metrics = work / "metrics.jsonl"
    more = ["--init-params", str(init)] if init else []
    out = run([*launcher(ranks), str(program / "train.py"), "--steps", str(warmup + steps), "--metrics",
               str(metrics), "--checkpoint-dir", "", *more], work)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    memory = json.loads(next(line for line in out.splitlines() if line.startswith("memory "))[7:])
    return [r["step_time_s"] * 1e3 for r in rows[warmup:]], memory["device0"]["params"] // 4


def handwritten(shape: str, ranks: int, data: Path, warmup: int, steps: int, work: Path) -> tuple[list[float], int]:
    """The hand-written program's step times (ms, steady state) and its parameter count."""
    s, t = SHAPES[shape], TRAINING
    cmd = [*launcher(ranks), str(HANDWRITTEN), "--data", str(data), "--steps", str(warmup + steps),
           *[a for k, flag in NANOGPT_NAMES.items() for a in (flag, str(s[k]))],
           "--batch", str(s["batch"]), "--lr", str(t["lr"]), "--betas", *map(str, t["betas"]),
           "--weight-decay", str(t["weight_decay"]), "--warmup", str(t["warmup"]), "--lr-steps", str(t["lr_steps"]),
           "--grad-clip", str(t["grad_clip"])]
    out = run(cmd, work)
    result = json.loads(next(line for line in out.splitlines() if line.startswith('{"step_ms"')))
    return result["step_ms"][warmup:], result["params"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"some of {', '.join(CASES)}")
    ap.add_argument("--pairs", type=int, default=3, help="interleaved (generated, hand-written) pairs per tiny case")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per process at the tiny shape")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out at the start, tiny shape")
    ap.add_argument("--gpt2-pairs", type=int, default=2, help="pairs per GPT-2 small case")
    ap.add_argument("--gpt2-steps", type=int, default=2, help="timed steps per process at the GPT-2 small shape")
    ap.add_argument("--gpt2-warmup", type=int, default=1, help="steps left out at the start, GPT-2 small")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        ap.error(f"unknown case(s) {', '.join(sorted(unknown))}; the cases are {', '.join(CASES)}")
    work = Path(tempfile.mkdtemp(prefix="torch-bench-"))
    results, began = {}, time.perf_counter()
    for name in args.cases.split(","):
        shape, ranks = CASES[name]
        big = shape == "gpt2"
        pairs, steps, warmup = (args.gpt2_pairs, args.gpt2_steps, args.gpt2_warmup) if big else (
            args.pairs, args.steps, args.warmup)
        program = build(shape, ranks, work / f"{name}-program")
        data = token_file(shape, work / f"{shape}-tokens.bin")
        one = work / f"{shape}-one"
        init = initial_params(one if one.exists() else build(shape, 1, one), work) if big else None
        gen, hand = [], []
        for _ in range(pairs):
            g, g_params = generated(program, ranks, warmup, steps, work, init)
            h, h_params = handwritten(shape, ranks, data, warmup, steps, work)
            if g_params != h_params:
                raise SystemExit(f"{name}: the programs differ: {g_params} parameters generated, {h_params} hand-written")
            gen.append(statistics.median(g))
            hand.append(statistics.median(h))
        ratios = [g / h for g, h in zip(gen, hand)]
        results[name] = {
            "ranks": ranks, "params": g_params, "warmup": warmup, "steps": steps, "pairs": pairs,
            "generated_ms": round(statistics.median(gen), 2), "handwritten_ms": round(statistics.median(hand), 2),
            "ratio": round(statistics.median(ratios), 3), "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3),
            "generated_pairs_ms": [round(x, 2) for x in gen], "handwritten_pairs_ms": [round(x, 2) for x in hand],
        }
        r = results[name]
        print(f"{name:9s} generated {r['generated_ms']:9.1f} ms/step | hand-written {r['handwritten_ms']:9.1f} ms/step | "
              f"ratio {r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}, {pairs} pairs)", flush=True)
    print("\n| case | ranks | generated ms/step | hand-written ms/step | ratio (median) | spread (min-max) |\n"
          "|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['ranks']} | {r['generated_ms']:.1f} | {r['handwritten_ms']:.1f} | {r['ratio']:.3f} | "
              f"{r['ratio_min']:.3f}-{r['ratio_max']:.3f} |")
    print(f"\n({time.perf_counter() - began:.0f} s in all)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
