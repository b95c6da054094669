"""How the compiler's output grows with depth: the same GPT at several layer counts.

For each depth (default 4, 24, 48 copies of specs/gpt-tiny.yaml's decoder block) it reports:
- the generated train.py's line count for every target (a repeated block is one block in the program,
  so the goal is: within 20 lines across depths);
- the line count of `mithril-spec plan` text;
- the JAX program's time to its first step on one CPU device (process start to the end of step 1, and
  step 1's own time, which holds tracing and compilation): the goal is <= 2x at 48 layers what it is at 4.

    python benchmarks/depth_scale.py [--depths 4,24,48] [--targets jax,torch,mlx] [--no-run]

Figures, not a test: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mithril_spec import cli  # noqa: E402

SPEC = ROOT / "specs" / "gpt-tiny.yaml"


def spec_at(depth: int, work: Path) -> Path:
    text = SPEC.read_text().replace("layers: 4}", f"layers: {depth}}}")
    assert f"layers: {depth}}}" in text
    path = work / f"gpt-{depth}.yaml"
    path.write_text(text)
    return path


def quiet(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = cli.main(args)
    return rc, out.getvalue()


def first_step(program: Path) -> tuple[float, float]:
    """(seconds from process start to the end of step 1, step 1's own seconds) on one CPU device."""
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "1", "JAX_PLATFORMS": "cpu"}
    metrics = program / "m.jsonl"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "train.py", "--steps", "1", "--metrics", str(metrics), "--checkpoint-dir", ""],
                   cwd=program, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    return wall, json.loads(metrics.read_text().splitlines()[0])["step_time_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="4,24,48")
    ap.add_argument("--targets", default="jax,torch,mlx")
    ap.add_argument("--no-run", action="store_true", help="line counts only")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    targets = args.targets.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for depth in depths:
            spec = spec_at(depth, work)
            row: dict = {"layers": depth}
            rc, text = quiet(["plan", str(spec), "--mesh", "data=1"])
            assert rc == 0, text
            row["plan lines"] = len(text.splitlines())
            for target in targets:
                out = work / f"{target}-{depth}"
                rc, text = quiet(["build", str(spec), "--target", target, "--mesh", "data=1", "-o", str(out)])
                assert rc == 0, text
                # the program's files (runtime/ aside: the same in every build)
                row[f"{target} lines"] = sum(len(p.read_text().splitlines()) for p in out.glob("*.py"))
            if "jax" in targets and not args.no_run:
                wall, step1 = first_step(work / f"jax-{depth}")
                row["jax start->step 1 s"] = round(wall, 2)
                row["jax step 1 s"] = round(step1, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    keys = list(rows[0])
    print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")


if __name__ == "__main__":
    main()
