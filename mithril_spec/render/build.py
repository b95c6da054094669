"""Rendering: Plan -> files. Templates are rendered in memory, Python output is parsed, then fixed
(`ruff check --fix-only`) and formatted (`ruff format`) by the pinned ruff; only when every file is ready
is anything written (each file atomically), so a failed build never leaves a partial program behind.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .. import pyast
from ..atomic import write_atomic
from ..diagnostics import Diagnostic, DiagnosticError
from ..frontend import Compiled
from ..targets import TARGETS
from .context import make_context
from .environment import environment


class RenderError(Exception):
    pass


def render_files(compiled: Compiled, target: str, spec_path: str) -> dict[str, str]:
    """Returns {relative file name: text} without writing anything."""
    entry = TARGETS[target]
    diags: list[Diagnostic] = entry.check(compiled.plan, compiled.doc)
    if diags:
        raise DiagnosticError(diags)
    ctx = make_context(compiled.plan, target, Path(spec_path).name)
    adapter = importlib.import_module(f"{__package__}.{entry.adapter}")
    ctx.update(adapter.extra_context(compiled.plan, ctx))
    env = environment()
    out: dict[str, str] = {}
    for template, name in entry.files:
        text = env.get_template(template).render(**ctx)
        if name.endswith(".py"):
            text = format_python(text, name)
        out[name] = text
    out["plan.json"] = json.dumps(_plan_json(compiled), indent=2) + "\n"
    return out


def _plan_json(compiled: Compiled) -> Any:
    from ..planner.plan_json import plan_to_json

    return plan_to_json(compiled.plan)


# The post-step's fixed configuration. Every setting is on the command line and ruff runs --isolated, from an
# empty directory, with no RUFF_* variables: neither a project's nor the user's ruff configuration (nor the
# directory the build runs from, which isort would scan for first-party packages) can change the output, so
# a program is byte-identical for one ruff version (pyproject.toml pins it). Only fixes that cannot change
# what a program does: unused imports (F401), f-strings without placeholders (F541), import order (I001).
RUFF_SETTINGS = ("--isolated", "--line-length", "100", "--target-version", "py311")
RUFF_FIX_RULES = "F401,F541,I001"


def format_python(text: str, name: str) -> str:
    """`ruff check --fix-only` with RUFF_FIX_RULES, then `ruff format` (see RUFF_SETTINGS)."""
    try:
        pyast.parse(text, filename=name)
    except SyntaxError as e:
        raise RenderError(f"generated {name} does not parse (line {e.lineno}): {e.msg}") from None
    text = _ruff(["check", "--fix-only", "--no-cache", "--select", RUFF_FIX_RULES], text, name)
    return _ruff(["format", "--no-cache"], text, name)


def _ruff(command: list[str], text: str, name: str) -> str:
    from ruff.__main__ import find_ruff_bin

    env = {k: v for k, v in os.environ.items() if not k.startswith("RUFF_")}
    with tempfile.TemporaryDirectory(prefix="mithril-ruff-") as cwd:
        proc = subprocess.run(
            [find_ruff_bin(), *command, *RUFF_SETTINGS, "--stdin-filename", name, "-"],
            input=text.encode(),
            capture_output=True,
            check=False,
            cwd=cwd,
            env=env,
        )
    if proc.returncode != 0:
        raise RenderError(f"ruff {command[0]} failed on {name}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode()


def build(compiled: Compiled, target: str, out_dir: Path, spec_path: str) -> list[Path]:
    files = render_files(compiled, target, spec_path)
    written = []
    for name, text in files.items():
        path = out_dir / name
        write_atomic(path, text)
        if name.endswith((".sh", ".sbatch")):
            path.chmod(0o755)
        written.append(path)
    return written
