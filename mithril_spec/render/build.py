"""Rendering: Plan -> files. Templates are rendered in memory, Python output is formatted with ruff and
parsed; only when every file is ready is anything written (each file atomically), so a failed build never
leaves a partial program behind.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from .. import pyast
from ..atomic import write_atomic
from ..diagnostics import Diagnostic, DiagnosticError
from ..frontend import Compiled
from ..planner.targets import check_target
from .context import make_context
from .environment import environment
from .jax_target import extra_context as jax_context
from .torch_target import extra_context as torch_context

ADAPTERS = {"jax": jax_context, "torch": torch_context}

# target -> [(template, output file)]
TARGET_FILES: dict[str, list[tuple[str, str]]] = {
    "jax": [("jax/train.py.j2", "train.py"), ("jax/launch.sh.j2", "launch.sh"), ("jax/README.md.j2", "README.md")],
    "torch": [
        ("torch/train.py.j2", "train.py"),
        ("torch/launch.sh.j2", "launch.sh"),
        ("torch/launch.sbatch.j2", "launch.sbatch"),
        ("torch/README.md.j2", "README.md"),
    ],
}


class RenderError(Exception):
    pass


def render_files(compiled: Compiled, target: str, spec_path: str) -> dict[str, str]:
    """Returns {relative file name: text} without writing anything."""
    diags: list[Diagnostic] = check_target(compiled.plan, compiled.doc, target)
    if diags:
        raise DiagnosticError(diags)
    ctx = make_context(compiled.plan, target, Path(spec_path).name)
    ctx.update(ADAPTERS[target](compiled.plan, ctx))
    env = environment()
    out: dict[str, str] = {}
    for template, name in TARGET_FILES[target]:
        text = env.get_template(template).render(**ctx)
        if name.endswith(".py"):
            text = format_python(text, name)
        out[name] = text
    out["plan.json"] = json.dumps(_plan_json(compiled), indent=2) + "\n"
    return out


def _plan_json(compiled: Compiled) -> Any:
    from ..planner.plan import plan_to_json

    return plan_to_json(compiled.plan)


def format_python(text: str, name: str) -> str:
    """ruff format (isolated from any project config, so output depends only on the ruff version)."""
    from ruff.__main__ import find_ruff_bin

    try:
        pyast.parse(text, filename=name)
    except SyntaxError as e:
        raise RenderError(f"generated {name} does not parse (line {e.lineno}): {e.msg}") from None
    proc = subprocess.run(
        [find_ruff_bin(), "format", "--isolated", "--line-length", "100", "--stdin-filename", name, "-"],
        input=text.encode(),
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RenderError(f"ruff could not format {name}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode()


def build(compiled: Compiled, target: str, out_dir: Path, spec_path: str) -> list[Path]:
    files = render_files(compiled, target, spec_path)
    written = []
    for name, text in files.items():
        path = out_dir / name
        write_atomic(path, text)
        if name.endswith(".sh") or name.endswith(".sbatch"):
            path.chmod(0o755)
        written.append(path)
    return written
