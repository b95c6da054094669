"""benchmarks/gpu.sh in its CPU smoke mode (no GPU here): the same path as on GPUs (token file, the torch and
jax builds of GPT-2's spec at gpt-tiny's shape, their runs and the hand-written GPT's) for a few steps, and
the one table it prints."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_benchmark_runs_on_cpu_and_prints_its_table(tmp_path):
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--smoke", "--steps", "3", "--warmup", "1",
                        "--keep", str(tmp_path)], check=False, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "CPU smoke run, no GPU" in p.stdout
    rows = [line for line in p.stdout.splitlines() if re.match(r"\| (torch|jax|nanoGPT|torch fp8) \|", line)]
    assert [r.split("|")[1].strip() for r in rows] == ["torch", "jax", "torch fp8", "nanoGPT"], p.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == "1" and float(cells[2].replace(",", "")) > 0, row  # one device, tokens/s measured
    # the generated programs' planned peak comes from their plan.json
    assert all(re.fullmatch(r"[0-9.]+", row.strip("|").split("|")[5].strip()) for row in rows[:3]), rows
