"""How fast `mithril-spec validate specs/` answers (what CI runs on every change).

    .venv/bin/python benchmarks/validate_speed.py [--runs N] [PATH ...]

Prints the median (and min/max) over N runs of:
- in-process: `cli.main(["validate", PATH...])` after the package is imported (the work itself);
- first call: importing `mithril_spec.cli` plus the first validate, in a fresh interpreter;
- subprocess: the `mithril-spec validate` command line end to end, interpreter start-up included;
- python -c pass: a bare interpreter start-up, for reference.
The design asks that the CLI answer "in a fraction of a second".
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _stats(times: list[float]) -> str:
    ms = [t * 1000 for t in times]
    return f"median {statistics.median(ms):8.1f} ms   (min {min(ms):.1f}, max {max(ms):.1f}, n={len(ms)})"


def _timed_subprocess(cmd: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - t)
        if r.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", default=["specs/"])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()

    from mithril_spec import cli

    files = cli._spec_files([str(ROOT / p) for p in args.paths])
    rc = None
    times = []
    for _ in range(args.runs + 1):
        err = io.StringIO()
        t = time.perf_counter()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = cli.main(["validate", *[str(ROOT / p) for p in args.paths]])
        times.append(time.perf_counter() - t)
    times = times[1:]  # the first call warms caches (pydantic, regexes)
    print(f"validate {' '.join(args.paths)}: {len(files)} spec(s), exit {rc}")
    print(f"  in-process validate        {_stats(times)}")
    print(f"  in-process, per spec       median {statistics.median(times) * 1000 / max(len(files), 1):8.1f} ms")

    first = (
        "import time; t = time.perf_counter(); import contextlib, io; from mithril_spec import cli; "
        "i = time.perf_counter(); "
        f"contextlib.redirect_stderr(io.StringIO()).__enter__(); cli.main(['validate', *{args.paths!r}]); "
        "e = time.perf_counter(); print(i - t, e - i)"
    )
    imports, calls = [], []
    for _ in range(max(args.runs // 2, 3)):
        out = subprocess.run(
            [sys.executable, "-c", first], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.split()
        imports.append(float(out[0]))
        calls.append(float(out[1]))
    print(f"  import mithril_spec.cli    {_stats(imports)}")
    print(f"  first validate after it    {_stats(calls)}")

    exe = Path(sys.executable).parent / "mithril-spec"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mithril_spec.cli"]
    print(f"  subprocess (end to end)    {_stats(_timed_subprocess(cmd + ['validate', *args.paths], args.runs))}")
    print(f"  python -c pass (baseline)  {_stats(_timed_subprocess([sys.executable, '-c', 'pass'], args.runs))}")


if __name__ == "__main__":
    main()
