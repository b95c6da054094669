"""Rendering: Plan -> files. Templates are rendered in memory, Python output is parsed, then fixed
(`ruff check --fix-only`) and formatted (`ruff format`) by the pinned ruff; only when every file is ready
is anything written, and then as a whole directory swapped in atomically (`atomic.replace_directory`), so a
failed or killed build never leaves a partial program, or a mixture of two builds, behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .. import pyast
from ..atomic import OutputError, check_directory, replace_directory
from ..frontend import Compiled
from ..lowering.program import BUILD_DIR_PLACEHOLDER, PYTHON_PLACEHOLDER, Program, lower
from ..targets import TARGETS
from ..template_files import runtime_files
from . import link
from .environment import environment


class RenderError(Exception):
    pass


def render_files(compiled: Compiled, target: str, spec_path: str, overrides: Sequence[str] = (),
                 build_dir: str = BUILD_DIR_PLACEHOLDER, python: str = PYTHON_PLACEHOLDER) -> dict[str, str]:
    """Returns {relative file name: text} without writing anything: `target`'s Program of the plan
    (lowering/program.py `lower`: E049 where the target refuses it, the plan costed once as the program runs
    it), rendered. plan.json (its `predicted` too) and the figures the program embeds (`PLANNED_BYTES`) are
    that one costing's, and `plan --target TARGET` prints the same. `build_dir` (absolute) and `python` are what
    launch.sbatch runs by default (it is copied to a spool directory under SLURM)."""
    program = lower(compiled.plan, compiled.doc, target, origin(spec_path, overrides), build_dir, python)
    return render_program(program)


def render_program(program: Program) -> dict[str, str]:
    """The files of a Program: each template rendered from the Program's fields, a program template cut into
    its files and each file given its imports (render/link.py), Python formatted; the runtime/ package every build carries as it is, with the target's own part (template_files.runtime_files), and plan.json."""
    env = environment()
    ctx = program.context()
    rendered: dict[str, str] = {}
    try:
        for template, name in program.files:
            text = env.get_template(template).render(**ctx)
            rendered.update(link.split(text, name) if name.endswith(".py") else {name: text})
        rendered = link.link(rendered)
    except (link.LinkError, SyntaxError) as e:
        raise RenderError(f"{program.target}: {e}") from None
    out = {name: format_python(text, name) if name.endswith(".py") else text for name, text in rendered.items()}
    out.update(runtime_files(program.target))
    out["plan.json"] = json.dumps(program.plan_json, indent=2) + "\n"
    return out


def origin(spec_path: str, overrides: Sequence[str] = ()) -> str:
    """What the program says it was built from: the spec's file name and the `--set` arguments applied to it,
    as a shell would take them back (`gpt-tiny.yaml --set +dims.extra=3`). (The file name alone: a `/` in
    an override's value is not a directory of the spec.)"""
    return " ".join([Path(spec_path).name, *(f"--set {shlex.quote(a)}" for a in overrides)])


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


# What a build wrote: {"files": {name: sha256}}. The next build into the same directory compares the files
# with it and refuses to replace one edited since (`build --force` replaces it anyway).
MANIFEST = "build-manifest.json"


def build_files() -> set[str]:
    """Every file name a build of any target may write (conditional files too): what a new build replaces in
    its output directory."""
    return ({name for entry in TARGETS.values() for _, name in entry.files} | set(link.PROGRAM_FILES)
            | {name for target in TARGETS for name in runtime_files(target)}
            | {"plan.json", MANIFEST})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_text(files: dict[str, str]) -> str:
    digests = {name: _sha256(text.encode("utf-8")) for name, text in sorted(files.items())}
    return json.dumps({"files": digests}, indent=2) + "\n"


def edited_files(out_dir: Path) -> list[str]:
    """The files of the build in `out_dir` that differ from what its manifest says that build wrote (none
    when there is no build or no manifest: a build of an older mithril-spec)."""
    try:
        recorded = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))["files"]
        if not isinstance(recorded, dict):
            raise TypeError
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError):
        return [MANIFEST]
    edited = []
    for name, digest in sorted(recorded.items()):
        try:
            data = (out_dir / str(name)).read_bytes()
        except OSError:
            continue  # deleted or unreadable: nothing of the user's to lose
        if _sha256(data) != digest:
            edited.append(str(name))
    return edited


def check_output(out_dir: Path) -> None:
    """OutputError (a usage error) when `out_dir` cannot receive a build; checked before rendering."""
    check_directory(out_dir, build_files())


def check_unedited(out_dir: Path) -> None:
    """OutputError when a file of the build in `out_dir` was edited since that build wrote it."""
    edited = edited_files(out_dir)
    if edited:
        shown = ", ".join(edited[:3]) + (", ..." if len(edited) > 3 else "")
        raise OutputError(f"{out_dir}: {shown} changed since the build that wrote {'it' if len(edited) == 1 else 'them'}"
                          ": a new build would overwrite your edits. Keep a copy elsewhere, then build again with "
                          "--force")


def build(compiled: Compiled, target: str, out_dir: Path, spec_path: str, force: bool = False,
          overrides: Sequence[str] = ()) -> list[Path]:
    """Renders the program and swaps it in as the whole of `out_dir` (atomic.replace_directory): the
    directory holds the old build or the new one, never a mixture, and no file of another target or spec.
    A file edited since the previous build is not replaced unless `force` (OutputError naming it)."""
    check_output(out_dir)
    if not force:
        check_unedited(out_dir)
    files = render_files(compiled, target, spec_path, overrides, build_dir=str(out_dir.resolve()),
                         python=sys.executable)
    files[MANIFEST] = manifest_text(files)
    modes = {name: (text, 0o755 if name.endswith((".sh", ".sbatch")) else 0o644) for name, text in files.items()}
    return replace_directory(out_dir, modes, build_files())
