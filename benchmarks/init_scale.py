"""Peak host memory per process through initialisation and two training steps: fsdp=4 vs one process.

GPTs of 200M to 500M parameters (d 1280, vocab 32000, seq 128, batch 4; 8, 16 or 24 layers: --layers) are
built for one process and for fsdp=4, for PyTorch (4 gloo ranks) and JAX (4 processes of one CPU device
each). Each process's peak RSS comes from the kernel (os.wait4's ru_maxrss, GB = 10^6 kB). Every process
initialises only its own shard; the goal (issue 41): the largest fsdp=4 per-process peak <= 0.40 x the
one-process peak. Memory is not noisy: --repeats > 1 prints the median of each.

    python benchmarks/init_scale.py [--targets torch,jax] [--steps 2] [--layers 8,16,24] [--repeats 1]

Figures, not a test: 24 layers needs about 20 GB of memory; several minutes per size on 2 cores.
Torch, 2 steps, 2026-11-27, on the 2-core machine (one run each: memory is not noisy; the one-process
peaks of two runs of 199M differed by 0.7%); ratio = the largest fsdp=4 rank / one process; "before": the
fsdp=4 program before issue 41 (gloo's staging buffers, backward prefetch, F.linear's tied head, a 1 MiB mmap
threshold), against the same one-process program (unchanged):

    params   one process GB   fsdp=4 per process GB   ratio   before: GB   ratio
    199M     4.20             1.63                    0.388   1.89         0.447 (one process 4.23)
    356M     6.87             2.25                    0.328   2.59         0.377
    513M     10.44            2.86                    0.274   3.29         0.315
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mithril_spec import cli  # noqa: E402

SPEC = """\
version: 1
name: gpt-half-billion
dims: {{vocab: 32000, seq: 128, d: 1280, heads: 20, ff: 5120, layers: {layers}}}
model:
  inputs:
    tokens: {{shape: [batch, seq], dtype: int32}}
    targets: {{shape: [batch, seq], dtype: int32}}
  blocks:
    decoder:
      - {{op: layer_norm, name: ln1}}
      - {{op: attention, name: attn, heads: heads, causal: true}}
      - {{op: add, name: res1, inputs: [block_input, attn]}}
      - {{op: layer_norm, name: ln2}}
      - {{op: mlp, name: mlp, hidden: ff, activation: gelu}}
      - {{op: add, name: res2, inputs: [res1, mlp]}}
  layers:
    - {{op: embedding, name: wte, vocab: vocab, dim: d, input: tokens}}
    - {{op: pos_embedding, name: wpe, max_len: seq}}
    - {{repeat: layers, block: decoder, name: blocks}}
    - {{op: layer_norm, name: ln_f}}
    - {{op: linear, name: lm_head, dimension: vocab, bias: false, tie: wte}}
  loss: {{op: cross_entropy, logits: lm_head, targets: targets}}
meshes:
  one: {{data: 1}}
  sharded: {{fsdp: 4}}
sharding:
  rules: {{batch: [data, fsdp], embed: fsdp}}
training:
  batch_size: 4
  steps: 10
  optimizer: {{name: adamw, lr: 1.0e-4}}
data: {{kind: synthetic}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(spec: Path, target: str, mesh: str, out: Path) -> Path:
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["build", str(spec), "--target", target, "--mesh", mesh, "-o", str(out)])
    if rc:
        raise SystemExit(f"build {target} {mesh} failed")
    return out


def run(program: Path, target: str, processes: int, steps: int) -> list[float]:
    """Starts the processes, waits for all of them, returns each one's peak RSS in GB."""
    port = free_port()
    procs = []
    for i in range(processes):
        env = {**os.environ, "OMP_NUM_THREADS": "1" if processes > 1 else str(os.cpu_count() or 1)}
        if target == "torch":
            env.update(RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE=str(processes), LOCAL_WORLD_SIZE=str(processes),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        else:
            env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
            if processes > 1:
                env.update(MITHRIL_COORDINATOR=f"127.0.0.1:{port}", MITHRIL_NUM_PROCESSES=str(processes),
                           MITHRIL_PROCESS_ID=str(i))
        log = open(program / f"rank{i}.log", "w")
        procs.append(subprocess.Popen([sys.executable, "train.py", "--steps", str(steps), "--checkpoint-dir", ""],
                                      cwd=program, env=env, stdout=log, stderr=subprocess.STDOUT))
    peaks = {}
    for p in procs:
        _, status, usage = os.wait4(p.pid, 0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"{program} failed: see {program}/rank*.log")
        peaks[p.pid] = usage.ru_maxrss / 1e6  # kB -> GB
    return [round(peaks[p.pid], 2) for p in procs]


def params_of(program: Path) -> int:
    """The model's parameter count, from the build's plan.json."""
    return json.loads((program / "plan.json").read_text())["totals"]["param_count"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="torch,jax")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--layers", default="8,16,24", help="one model per layer count (8: 199M, 24: 513M)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each; the median is printed")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for layers in map(int, args.layers.split(",")):
            spec = work / f"gpt{layers}.yaml"
            spec.write_text(SPEC.format(layers=layers))
            for target in args.targets.split(","):
                one_dir = build(spec, target, "data=1", work / f"{target}-{layers}-one")
                four_dir = build(spec, target, "fsdp=4", work / f"{target}-{layers}-fsdp4")
                ones, fours, seconds = [], [], []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    ones.append(run(one_dir, target, 1, args.steps)[0])
                    t1 = time.perf_counter()
                    fours.append(max(run(four_dir, target, 4, args.steps)))
                    seconds.append([round(t1 - t0), round(time.perf_counter() - t1)])
                one, four = statistics.median(ones), statistics.median(fours)
                row = {"target": target, "layers": layers, "params": params_of(one_dir), "one process GB": one,
                       "fsdp=4 per process GB (max rank)": four, "ratio": round(four / one, 3), "goal": 0.40,
                       "runs": args.repeats, "seconds": seconds}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'target':7s} {'params':>7s} {'one process GB':>15s} {'fsdp=4 per process GB':>22s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['target']:7s} {r['params'] / 1e6:6.0f}M {r['one process GB']:15.2f} "
              f"{r['fsdp=4 per process GB (max rank)']:22.2f} {r['ratio']:6.3f}")


if __name__ == "__main__":
    main()
