"""How fast `mithril-spec plan` answers: a 1000-layer GPT (`plan`, text and JSON, with the cost model) and
`plan --auto` over 512 and 1,024 devices for a GPT-3-sized model (96 layers, d=12288) and over 512 for the
1000-layer one.

    .venv/bin/python benchmarks/plan_speed.py [--repeat N]

Each figure is the best of N runs of the command line in a fresh process (Python start-up and imports
included), plus the in-process time of the planning itself. Targets: plan < 1 s, plan --auto < 5 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPT = """\
version: 1
name: {name}
dims: {{vocab: {vocab}, seq: {seq}, d: {d}, heads: {heads}, ff: {ff}, layers: {layers}}}
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
mesh: {mesh}
sharding:
  rules:
    batch: [data, fsdp]
    embed: fsdp
    heads: tensor
    kv_heads: tensor
    mlp: tensor
    vocab: tensor
training:
  batch_size: {batch}
  steps: 1
  optimizer: {{name: adamw, lr: 1.0e-4}}
  precision: {{params: bfloat16, compute: bfloat16, master_weights: true}}
  remat: selective
"""

SPECS = {
    "gpt-1000-layers": dict(name="gpt-1000-layers", vocab=50304, seq=2048, d=2048, heads=16, ff=8192, layers=1000,
                            mesh="{data: 8, fsdp: 8, tensor: 8}", batch=512),
    "gpt3-175b": dict(name="gpt3-175b", vocab=50304, seq=2048, d=12288, heads=96, ff=49152, layers=96,
                      mesh="{data: 8, fsdp: 8, tensor: 8}", batch=1536),
}

CASES = [  # (label, spec, extra arguments, target seconds)
    ("plan, 1000 layers (text)", "gpt-1000-layers", [], 1.0),
    ("plan, 1000 layers (--format json)", "gpt-1000-layers", ["--format", "json"], 1.0),
    ("plan, 1000 layers (--hardware h100)", "gpt-1000-layers", ["--hardware", "h100"], 1.0),
    ("plan --auto, GPT-3 175B, 512 x h100", "gpt3-175b", ["--auto", "--devices", "512", "--hardware", "h100"], 5.0),
    ("plan --auto, GPT-3 175B, 1024 x a100", "gpt3-175b", ["--auto", "--devices", "1024", "--hardware", "a100"], 5.0),
    ("plan --auto, 1000 layers, 512 x h100", "gpt-1000-layers", ["--auto", "--devices", "512", "--hardware", "h100"],
     5.0),
]


def write_specs(folder: Path) -> dict[str, Path]:
    out = {}
    for key, values in SPECS.items():
        path = folder / f"{key}.yaml"
        path.write_text(GPT.format(**values))
        out[key] = path
    return out


def cli_seconds(spec: Path, extra: list[str], repeat: int) -> float:
    best = float("inf")
    exe = str(ROOT / ".venv" / "bin" / "mithril-spec")
    cmd = [exe] if Path(exe).exists() else [sys.executable, "-m", "mithril_spec.cli"]
    for _ in range(repeat):
        t = time.perf_counter()
        r = subprocess.run(cmd + ["plan", str(spec), *extra], capture_output=True, text=True)
        best = min(best, time.perf_counter() - t)
        if r.returncode not in (0, 1):
            raise SystemExit(f"plan failed ({r.returncode}): {r.stderr}")
    return best


def in_process_seconds(spec: Path, extra: list[str], repeat: int) -> float:
    import contextlib
    import io

    from mithril_spec import cli

    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli.main(["plan", str(spec), *extra])
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        specs = write_specs(Path(tmp))
        print(f"{'case':44} {'command line':>12} {'in process':>11} {'target':>7}")
        for label, key, extra, target in CASES:
            cli_s = cli_seconds(specs[key], extra, args.repeat)
            inproc = in_process_seconds(specs[key], extra, args.repeat)
            flag = "ok" if cli_s < target else "SLOW"
            ok &= cli_s < target
            print(f"{label:44} {cli_s:11.3f}s {inproc:10.3f}s {target:6.1f}s {flag}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
