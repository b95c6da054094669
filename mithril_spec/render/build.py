"""Rendering: Plan -> files. Templates are rendered in memory, Python output is parsed, then fixed
(`ruff check --fix-only`) and formatted (`ruff format`) by the pinned ruff; only when every file is ready
is anything written, and then as a whole directory swapped in atomically (`atomic.replace_directory`), so a
failed or killed build never leaves a partial program, or a mixture of two builds, behind.
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
from ..atomic import check_directory, replace_directory
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


def build_files() -> set[str]:
    """Every file name a build of any target writes: what a new build replaces in its output directory."""
    return {name for entry in TARGETS.values() for _, name in entry.files} | {"plan.json"}


def check_output(out_dir: Path) -> None:
    """OutputError (a usage error) when `out_dir` cannot receive a build; checked before rendering."""
    check_directory(out_dir, build_files())


def build(compiled: Compiled, target: str, out_dir: Path, spec_path: str) -> list[Path]:
    """Renders the program and swaps it in as the whole of `out_dir` (atomic.replace_directory): the
    directory holds the old build or the new one, never a mixture, and no file of another target or spec."""
    check_output(out_dir)
    files = render_files(compiled, target, spec_path)
    modes = {name: (text, 0o755 if name.endswith((".sh", ".sbatch")) else 0o644) for name, text in files.items()}
    return replace_directory(out_dir, modes, build_files())
