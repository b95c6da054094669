"""Predicted vs measured step time with a calibrated profile (issue 17: within 25% for every example).

For each spec (default: examples/*/*.yaml) and target (torch, jax), on the spec's default mesh:

1. `mithril-spec calibrate --target T --processes N` on this machine, N the mesh's device count, just
   before each run (the profile sees the machine as loaded as the run does);
2. `mithril-spec plan SPEC --hardware PROFILE --target T --format json`: the predicted step time;
3. `mithril-spec build SPEC --target T`, run for `--warmup + --steps` steps (torch: `torch.distributed.run`
   with N ranks; jax: one process with N simulated CPU devices, as the programs start without an
   accelerator), checkpoints off: the measured step time is the median `step_time_s` metric of the steps
   after the warmup (which holds compilation and first-touch allocation), the last step left out (it
   evaluates).

Each (spec, target) runs `--pairs` such (calibration, run) pairs. It prints a table: spec, target,
devices, predicted and measured step time (medians over the pairs), the median ratio predicted / measured
and its spread over the pairs, and the last profile's figures. Contention: on a machine shared with other
work every measurement is inflated, the calibration's figures too; the two are taken back to back to see
the same load, and the pairs show how much the load of the moment moves the ratio.

The examples read token data that `bash scripts/main.sh` prepares (examples/gpt-docs/data); run it first.

    python benchmarks/calibration.py                       # the examples, both targets, ~6 min on 2 cores
    python benchmarks/calibration.py --specs specs/gpt-tiny.yaml --targets torch --steps 10
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mithril_spec import cli


def quiet(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue() + err.getvalue()


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the calibration: idle threads sleep
    return e


def devices(spec: Path, mesh: list[str]) -> int:
    rc, out = quiet(["plan", str(spec), *mesh, "--format", "json"])
    if rc:
        raise SystemExit(f"plan {spec} failed:\n{out}")
    return json.loads(out)["mesh"]["devices"]


def calibrate(target: str, n: int, work: Path, quick: bool, pair: int) -> Path:
    path = work / f"{target}-x{n}-{pair}.yaml"
    rc, out = quiet(["calibrate", "--target", target, "--processes", str(n), "-o", str(path),
                     *(["--quick"] if quick else [])])
    if rc:
        raise SystemExit(f"calibrate --target {target} failed:\n{out}")
    return path


TERMS = ("compute_s", "blocking_comm_s", "exposed_comm_s", "elementwise_s", "overhead_s", "optimizer_s")


def predicted(spec: Path, target: str, profile: Path, mesh: list[str]) -> dict:
    """The plan's step-time object: `step_s` and its terms."""
    rc, out = quiet(["plan", str(spec), *mesh, "--hardware", str(profile), "--target", target, "--format", "json"])
    if rc:
        raise SystemExit(f"plan {spec} --hardware {profile} failed:\n{out}")
    return json.loads(out)["costs"]["time"]


def measured(spec: Path, target: str, n: int, work: Path, warmup: int, steps: int, mesh: list[str]) -> list[float]:
    program = work / f"{spec.stem}-{target}"
    rc, out = quiet(["build", str(spec), *mesh, "--target", target, "-o", str(program), "--force"])
    if rc:
        raise SystemExit(f"build {spec} --target {target} failed:\n{out}")
    metrics = work / f"{spec.stem}-{target}.jsonl"
    metrics.unlink(missing_ok=True)
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]
              if target == "torch" and n > 1 else [sys.executable])
    cmd = [*launch, str(program / "train.py"), "--steps", str(warmup + steps + 1), "--metrics", str(metrics),
           "--checkpoint-dir", ""]
    proc = subprocess.run(cmd, cwd=spec.parent, env=env(), capture_output=True, text=True, check=False)
    if proc.returncode:
        # the program's own diagnostics first (a missing --data file: run scripts/main.sh, which prepares
        # examples/gpt-docs/data), then the tail of the launcher's output
        errors = "\n".join(line for line in proc.stderr.splitlines() if line.startswith("error"))
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{errors}\n{proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r["step_time_s"] for r in rows[warmup:-1]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", nargs="*", default=None, help="spec files (default: examples/*/*.yaml)")
    ap.add_argument("--targets", default="torch,jax")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out at the start")
    ap.add_argument("--steps", type=int, default=20, help="steps measured")
    ap.add_argument("--pairs", type=int, default=2, help="(calibration, run) pairs per spec and target")
    ap.add_argument("--mesh", help="AXIS=SIZE,... instead of each spec's default mesh")
    ap.add_argument("--quick", action="store_true", help="calibrate with --quick")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    specs = [Path(s) for s in args.specs] if args.specs else sorted(ROOT.glob("examples/*/*.yaml"))
    work = Path(tempfile.mkdtemp(prefix="mithril-calibration-"))
    began = time.perf_counter()
    rows, profiles = [], {}
    mesh = ["--mesh", args.mesh] if args.mesh else []
    for target in args.targets.split(","):
        for spec in specs:
            spec = spec.resolve()
            n = devices(spec, mesh)
            preds, meas = [], []
            for pair in range(args.pairs):
                profiles[target, n] = calibrate(target, n, work, args.quick, pair)
                time_ = predicted(spec, target, profiles[target, n], mesh)
                preds.append(time_["step_s"])
                steps = measured(spec, target, n, work, args.warmup, args.steps, mesh)
                meas.append(statistics.median(steps))
                terms = ", ".join(f"{k.removesuffix('_s')} {time_[k] * 1e3:.0f}" for k in TERMS)
                print(f"  {spec.name} {target}: predicted {preds[-1] * 1e3:.1f} ms ({terms}), measured "
                      f"{meas[-1] * 1e3:.1f} ms (steps {min(steps) * 1e3:.0f}-{max(steps) * 1e3:.0f})", flush=True)
            ratios = [p / m for p, m in zip(preds, meas)]
            row = {"spec": spec.relative_to(ROOT).as_posix() if spec.is_relative_to(ROOT) else str(spec),
                   "target": target, "mesh": args.mesh or "default", "devices": n, "predicted_ms": round(statistics.median(preds) * 1e3, 1),
                   "measured_ms": round(statistics.median(meas) * 1e3, 1),
                   "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios]}
            rows.append(row)
    print("\n| spec | target | mesh | predicted ms | measured ms | ratio (median) | ratios of the pairs |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['spec']} | {r['target']} | {r['mesh']} ({r['devices']}) | {r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | "
              f"{r['ratio']:.2f} | {', '.join(f'{x:.2f}' for x in r['ratios'])} |")
    print("\nprofiles:")
    for (target, n), path in profiles.items():
        print(f"--- {target}, {n} device(s): {path}")
        print("\n".join(line for line in path.read_text().splitlines() if not line.startswith("#")))
    print(f"({time.perf_counter() - began:.0f} s in all)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
