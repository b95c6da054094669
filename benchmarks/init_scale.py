"""Peak host memory per process through initialisation and two training steps: fsdp=4 vs one process.

A ~0.5B-parameter GPT (d 1280, 24 layers, vocab 32000, seq 128, batch 4) is built for one process and for
fsdp=4, for PyTorch (4 gloo ranks) and JAX (4 processes of one CPU device each). Each process's peak RSS
comes from the kernel (os.wait4's ru_maxrss). Every process initialises only its own shard, so the goal
is: per-process peak <= 0.45 x the one-process peak.

    python benchmarks/init_scale.py [--targets torch,jax] [--steps 2] [--layers 24]

Figures, not a test: it needs about 20 GB of memory and several minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="torch,jax")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = work / "gpt.yaml"
        spec.write_text(SPEC.format(layers=args.layers))
        for target in args.targets.split(","):
            t0 = time.perf_counter()
            one = run(build(spec, target, "data=1", work / f"{target}-one"), target, 1, args.steps)[0]
            t1 = time.perf_counter()
            four = run(build(spec, target, "fsdp=4", work / f"{target}-fsdp4"), target, 4, args.steps)
            t2 = time.perf_counter()
            print(json.dumps({"target": target, "one process GB": one, "fsdp=4 per process GB": four,
                              "ratio (max)": round(max(four) / one, 3), "goal": 0.45,
                              "seconds": [round(t1 - t0), round(t2 - t1)]}), flush=True)


if __name__ == "__main__":
    main()
