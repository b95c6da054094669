"""GPT-2 small (124M) on the GPUs of this machine: the generated torch and jax programs next to the
hand-written nanoGPT-style torch GPT (benchmarks/handwritten_torch_gpt.py), on the same tokens. Run through
benchmarks/gpu.sh; prints one Markdown table.

The model: specs/gpt-tiny.yaml with GPT-2 small's shape (vocab 50304, the multiple of 64 above GPT-2's 50257,
as nanoGPT pads it; seq 1024, d 768, 12 heads, ff 3072, 12 layers, lm_head tied to wte), AdamW, bfloat16
compute with float32 parameters, `--batch` sequences per GPU. The tokens: random ids drawn once with a fixed
seed into a nanoGPT train.bin (nothing is downloaded; the step time does not depend on the ids).

Rows, on 1 GPU and, when there are two or more, on 2 (data parallel):
  torch    the generated program, `--compile` (every block compiled), DDP on 2
  torch fp8  the same with `precision.float8` (its linear layers in FP8 through torchao.float8; on a CPU,
           and on a GPU below compute capability 8.9, emulated: the row then says nothing of FP8's speed)
  jax      the generated program (jit), data=2 on 2
  nanoGPT  the hand-written GPT: torch.compile, SDPA (flash attention), fused AdamW, autocast bfloat16

Columns: tokens/s (the median step of the steps after `--warmup`, whole loop iteration), MFU (the plan's
FLOPs per step, the same for every row, over the step time and the GPUs' bfloat16 peak from the built-in
hardware profile of the device's name), peak memory per GPU as measured (torch: max_memory_allocated; jax:
the device's peak_bytes_in_use) and as `mithril-spec plan` predicts it for that program.

Without a GPU it runs the same path on CPU (`--smoke`, or when torch sees no GPU): gpt-tiny's shape, a few
steps, no compilation, and it says so in the table's title. tests/test_gpu_bench.py runs that.
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
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mithril_spec import cli
from mithril_spec.planner import hardware
from mithril_spec.lowering.predicted import DEVICE_PROFILES

SPEC = ROOT / "specs" / "gpt-tiny.yaml"
HANDWRITTEN = ROOT / "benchmarks" / "handwritten_torch_gpt.py"
GPT2 = {"vocab": 50304, "seq": 1024, "d": 768, "heads": 12, "ff": 3072, "layers": 12}
GPUS = 0  # CUDA devices on this machine (main)
TINY = {"vocab": 256, "seq": 64, "d": 128, "heads": 4, "ff": 512, "layers": 4}


def gpus() -> tuple[int, str]:
    """(number of CUDA devices, the first one's name), asked of torch in a child process (this one never
    imports a framework)."""
    code = "import torch; n = torch.cuda.device_count(); print(n, torch.cuda.get_device_name(0) if n else '')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    return int(out[0]), out[1].strip()


def write_tokens(path: Path, vocab: int, n: int) -> None:
    ids = np.random.default_rng(0).integers(0, vocab, size=n, dtype=np.uint16)
    ids.tofile(path)


def build(target: str, shape: dict, batch: int, devices: int, data: Path, out: Path, steps: int,
          float8: bool = False) -> Path:
    sets = [f"dims.{k}={v}" for k, v in shape.items()] + [
        f"training.batch_size={batch * devices}", f"training.steps={steps}",
        f"training.precision={{params: float32, compute: bfloat16{', float8: true' if float8 else ''}}}",
        f"data={{kind: tokens, path: {data}, dtype: uint16}}"]
    argv = ["build", str(SPEC), "--target", target, "--mesh", f"data={devices}", "-o", str(out), "--force"]
    for s in sets:
        argv += ["--set", s]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    if rc != 0:
        raise SystemExit(f"gpu_bench: build failed ({' '.join(argv)}):\n{err.getvalue()}")
    return out


def flops_per_step(program: Path) -> float:
    text = "\n".join(p.read_text() for p in sorted(program.glob("*.py")))  # the program's files (train.py's top)
    m = re.search(r"^FLOPS_PER_STEP = \(?\s*([0-9_]+)", text, re.MULTILINE)
    assert m, "FLOPS_PER_STEP not in the program"
    return float(m.group(1).replace("_", ""))


def planned_peak(program: Path) -> int:
    return int(json.loads((program / "plan.json").read_text())["costs"]["peak_bytes"])


def run(cmd: list[str], cwd: Path, env: dict, timeout: int) -> str:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"gpu_bench: {' '.join(cmd)} failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    print(f"  ran {' '.join(Path(c).name if c.startswith('/') else c for c in cmd[:6])} ... in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return p.stdout + p.stderr


def visible(devices: int) -> dict:
    """The GPUs a run may use: the first `devices` (a one-device jax program refuses a machine with more)."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(devices)))} if GPUS else {}


def launcher(devices: int) -> list[str]:
    if devices == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(devices)]


def generated_row(target: str, program: Path, devices: int, args, env: dict, smoke: bool) -> dict:
    metrics = program / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    flags = ["--steps", str(args.steps), "--metrics", str(metrics), "--checkpoint-dir", ""]
    if target == "torch":
        cmd = launcher(devices) + [str(program / "train.py")] + flags + ([] if smoke else ["--compile"])
    else:  # one process drives every local GPU (on CPU: the devices it simulates)
        cmd = [sys.executable, str(program / "train.py")] + flags
    out = run(cmd, program, {**env, **visible(devices)}, args.timeout)
    steps = [json.loads(line)["step_time_s"] for line in metrics.read_text().splitlines()][args.warmup:]
    peak = re.findall(r"peak mem ([0-9.]+) GB", out)
    return {"step_s": statistics.median(steps), "peak": float(peak[-1]) * 1e9 if peak else None,
            "planned": planned_peak(program)}


def handwritten_row(shape: dict, batch: int, devices: int, data: Path, args, env: dict, smoke: bool) -> dict:
    cmd = launcher(devices) + [str(HANDWRITTEN), "--data", str(data), "--steps", str(args.steps),
                               "--batch", str(batch * devices), "--vocab-size", str(shape["vocab"]),
                               "--block-size", str(shape["seq"]), "--n-embd", str(shape["d"]),
                               "--n-head", str(shape["heads"]), "--n-ff", str(shape["ff"]),
                               "--n-layer", str(shape["layers"]), "--dtype", "bfloat16",
                               "--lr-steps", str(args.steps), "--warmup", "2"] + ([] if smoke else ["--compile"])
    out = run(cmd, ROOT, {**env, **visible(devices)}, args.timeout)
    last = json.loads(out.strip().splitlines()[-1])
    return {"step_s": statistics.median(last["step_ms"][args.warmup:]) / 1e3, "peak": last["peak_bytes"],
            "planned": None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: 40 on GPUs, 4 on CPU)")
    ap.add_argument("--warmup", type=int, default=None, help="steps left out of the median (default: 10 / 1)")
    ap.add_argument("--batch", type=int, default=None, help="sequences per GPU (default: 16; CPU: 8)")
    ap.add_argument("--smoke", action="store_true", help="the CPU path even where there are GPUs")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run")
    ap.add_argument("--keep", metavar="DIR", help="build and run in DIR (default: a temporary directory)")
    args = ap.parse_args()
    global GPUS
    n, name = gpus()
    GPUS = n
    smoke = args.smoke or n == 0
    args.steps = args.steps or (4 if smoke else 40)
    args.warmup = args.warmup if args.warmup is not None else (1 if smoke else 10)
    if args.steps <= args.warmup:
        raise SystemExit("gpu_bench: --steps must be above --warmup")
    shape, batch = (TINY, args.batch or 8) if smoke else (GPT2, args.batch or 16)
    profile = next((p for key, p in DEVICE_PROFILES if key in name), None) if not smoke else None
    peak = hardware.lookup(profile).peak_flops("bfloat16") if profile else None
    work = Path(args.keep or tempfile.mkdtemp(prefix="gpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "train.bin"
    write_tokens(data, shape["vocab"], max(2_000_000 if not smoke else 20_000, 4 * batch * shape["seq"] * args.steps))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    counts = [1] + ([2] if n >= 2 and not smoke else [])
    where = "CPU smoke run (no GPU: gpt-tiny's shape, no compilation)" if smoke else f"{name}"
    print(f"gpu_bench: {where}; {args.steps} steps per run, median after {args.warmup}", file=sys.stderr)
    rows = []
    for devices in counts:
        programs = {t: build(t, shape, batch, devices, data, work / f"{t}-{devices}", args.steps) for t in ("torch", "jax")}
        fp8 = build("torch", shape, batch, devices, data, work / f"torch-fp8-{devices}", args.steps, float8=True)
        flops = flops_per_step(programs["torch"])
        results = {t: generated_row(t, p, devices, args, env, smoke) for t, p in programs.items()}
        results["torch fp8"] = generated_row("torch", fp8, devices, args, env, smoke)
        results["nanoGPT"] = handwritten_row(shape, batch, devices, data, args, env, smoke)
        for what, r in results.items():
            tokens = batch * devices * shape["seq"] / r["step_s"]
            mfu = f"{100 * flops / r['step_s'] / (devices * peak):.1f}%" if peak else "-"
            gb = (lambda b: f"{b / 1e9:.2f}" if b else "-")
            rows.append(f"| {what} | {devices} | {tokens:,.0f} | {mfu} | {gb(r['peak'])} | {gb(r['planned'])} |")
    title = f"GPT-2 small (124M), bfloat16, batch {batch} x {shape['seq']} per GPU, {where}" if not smoke else (
        f"CPU smoke run, no GPU: gpt-tiny's shape, batch {batch} x {shape['seq']}, no compilation")
    print(f"\n{title}\n")
    print("(MFU: over the bfloat16 peak for every row, torch fp8's too)\n")
    print("| program | GPUs | tokens/s | MFU | peak GB per GPU | planned peak GB |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
