#!/usr/bin/env python3
"""Regenerates tests/golden/ from the current compiler and templates; the tests only compare.

    .venv/bin/python scripts/update_goldens.py          # rewrite, then review `git diff tests/golden`
    .venv/bin/python scripts/update_goldens.py --check  # exit 1 (and list them) if any golden file is stale

Every example spec, for each target it names, gets tests/golden/lowering/<spec>-<target>.json: a snapshot
of its lowering (every field of the Program, plan.json's `plan_json` among them, as sorted JSON). One case
per target (tests/render_cases.py WHOLE_PROGRAM) also gets its whole build in tests/golden/<spec>-<target>/
(the program, generate.py, launch scripts, README and plan.json, costed as that target's program runs the
plan). Both kinds are written and checked together; files no case produces any more are removed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from render_cases import GOLDEN, ROOT, cases, golden_files


def expected() -> dict[Path, str]:
    return {path: text for case in cases() for path, text in golden_files(case).items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a golden file is stale")
    args = ap.parse_args(argv)
    want = expected()
    have = {p for p in GOLDEN.rglob("*") if p.is_file()}
    changed = sorted(p for p, text in want.items() if not p.is_file() or p.read_text(encoding="utf-8") != text)
    stale = sorted(have - set(want))
    for p in changed:
        print(f"{'stale' if p.exists() else 'missing'}: {p.relative_to(ROOT)}")
    for p in stale:
        print(f"not produced by any case: {p.relative_to(ROOT)}")
    if args.check:
        return 1 if changed or stale else 0
    for p in changed:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(want[p], encoding="utf-8", newline="\n")
    for p in stale:
        p.unlink()
    for d in sorted((d for d in GOLDEN.rglob("*") if d.is_dir()), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    print(f"{len(want)} golden files, {len(changed)} written, {len(stale)} removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
