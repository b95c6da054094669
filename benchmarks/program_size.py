"""How large a generated program is: per target and example spec, the lines of each file a build writes,
and the total of the rendered program without runtime/ (the spec-independent helpers every build carries
byte for byte) and without the launchers, README and plan.json.

    .venv/bin/python benchmarks/program_size.py [--specs specs/gpt-tiny.yaml:torch,jax ...]

The issue's bounds (docs/program.md "The program's files"): gpt-tiny in torch and jax, model.py <= 200 lines,
train.py <= 400, the rendered Python <= 900; mlp-dp in MLX, the rendered Python <= 600.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = ("specs/gpt-tiny.yaml:torch,jax", "specs/mlp-dp.yaml:mlx,torch,jax", "specs/gpt-pipe.yaml:torch,jax",
         "specs/moe-dp.yaml:torch,jax")


def files_of(spec: str, target: str) -> dict[str, str]:
    from mithril_spec.frontend import compile_file
    from mithril_spec.render.build import render_files

    return render_files(compile_file(spec), target, spec)


def lines(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def bounds(spec: str, target: str, py: dict[str, int], rendered: int) -> list[tuple[str, int, int]]:
    """(what, lines, bound) of the issue's bounds that apply to this case."""
    if spec == "gpt-tiny.yaml" and target in ("torch", "jax"):
        return [("model.py", py.get("model.py", 0), 200), ("train.py", py.get("train.py", 0), 400),
                ("rendered", rendered, 900)]
    if spec == "mlp-dp.yaml" and target == "mlx":
        return [("rendered", rendered, 600)]
    return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", nargs="*", default=list(CASES), help="SPEC:TARGET[,TARGET...]")
    args = ap.parse_args()
    print(f"{'spec':<22} {'target':<6} {'rendered':>8} {'runtime':>7}  files (lines)")
    for case in args.specs:
        spec, targets = case.split(":")
        for target in targets.split(","):
            files = files_of(str(ROOT / spec), target)
            py = {n: lines(t) for n, t in sorted(files.items()) if n.endswith(".py")}
            runtime = sum(n for name, n in py.items() if name.startswith("runtime/"))
            rendered = sum(n for name, n in py.items() if not name.startswith("runtime/"))
            shown = ", ".join(f"{name} {n}" for name, n in py.items() if not name.startswith("runtime/"))
            print(f"{Path(spec).name:<22} {target:<6} {rendered:>8} {runtime:>7}  {shown}")
            over = [f"{what} {n} > {bound}" for what, n, bound in bounds(Path(spec).name, target, py, rendered)
                    if n > bound]
            if over:
                print(f"{'':<30}over the issue's bounds: {', '.join(over)}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
