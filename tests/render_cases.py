"""The (spec, target) pairs every render test covers: each example for each target it names, and the
golden files they are compared with (written only by scripts/update_goldens.py, never by a test).

Two kinds of golden file:

- tests/golden/lowering/<spec>-<target>.json, for every case: a snapshot of the case's lowering
  (lowering/program.py `lower`), every field of its Program as sorted, indented JSON, plan.json
  (`plan_json`) among them. Small enough to review: a change to the lowering shows as the fields it changes.
- tests/golden/<spec>-<target>/, for one case per target (WHOLE_PROGRAM): the whole build, as `build`
  writes it (the program, generate.py, launch scripts, README, plan.json). A change to a template shows here.

Both are rendered with fixed placeholders for what a real build records of itself (the build's directory,
its Python: BUILD_DIR_PLACEHOLDER, PYTHON_PLACEHOLDER) and the spec's path relative to the repository, so
they hold no path of the machine that wrote them.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
import subprocess
from pathlib import Path
from typing import Any

from mithril_spec.frontend import compile_file
from mithril_spec.lowering.costing import Costing
from mithril_spec.lowering.program import Program, lower
from mithril_spec.render.build import origin, render_program
from program_files import TRAINING
from mithril_spec.targets import TARGETS

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted(p for p in (ROOT / "specs").iterdir() if p.suffix in (".yaml", ".toml") and not p.name.startswith("_"))
GOLDEN = ROOT / "tests" / "golden"
LOWERING = GOLDEN / "lowering"
# per target: the example whose whole build is kept (the richest: the most files and module-level names)
WHOLE_PROGRAM = {"torch": "gpt-tiny", "jax": "gpt-pipe", "mlx": "cnn-dp"}


def cases() -> list[tuple[Path, str]]:
    out = []
    for spec in SPECS:
        if spec.suffix == ".toml":
            continue  # twins: same program as their YAML (tested in test_twins)
        c = compile_file(spec)
        for target in c.spec.targets:
            if (ROOT / "templates" / target / "train.py.j2").exists() and target in TARGETS:
                out.append((spec, target))
    return out


def case_id(case) -> str:
    return f"{case[0].stem}-{case[1]}"


def whole_program(case) -> bool:
    """Whether the case's whole build is a golden tree (one case per target), besides its snapshot."""
    spec, target = case
    return WHOLE_PROGRAM.get(target) == spec.stem


def snapshot_path(case) -> Path:
    return LOWERING / f"{case_id(case)}.json"


def golden_paths(case) -> list[Path]:
    """The golden files of one case, without rendering anything: its lowering's snapshot and, for a
    whole-program case, the files of its build (the plan decides the conditional files) and its plan.json."""
    spec, target = case
    out = [snapshot_path(case)]
    if whole_program(case):
        files = TARGETS[target].files_for(compile_file(spec).plan)
        names = [n for _, name in files for n in (TRAINING if name == "train.py" else (name,))]  # train.py.j2: the package
        out += [GOLDEN / case_id(case) / name for name in names] + [GOLDEN / case_id(case) / "plan.json"]
    return out


def program(case) -> Program:
    """The case's lowering, as render_files lowers it (placeholder build directory and Python)."""
    spec, target = case
    compiled = compile_file(spec)
    return lower(compiled.plan, compiled.doc, target, origin(str(spec.relative_to(ROOT))))


def jsonable(value: Any, where: str) -> Any:
    """`value` as JSON data, every part of it converted explicitly: a dataclass as {field: value} (all its
    fields), a tuple as a list, an enum as its value. Anything else that JSON cannot hold is a TypeError
    naming where it is (nothing is dropped or turned into its repr silently)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return jsonable(value.value, where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise TypeError(f"{where}: a key that is not a string ({bad[0]!r}) has no JSON form; convert it here")
        return {k: jsonable(v, f"{where}.{k}") for k, v in value.items()}
    raise TypeError(f"{where}: {type(value).__name__} has no JSON form; convert it explicitly in jsonable")


def costing_json(cost: Costing) -> dict[str, Any]:
    """The Program's costing: its target and options; its plan and costs are `plan_json` (plan_to_json of
    the same plan and costs), not repeated."""
    return {"target": cost.target, "options": jsonable(cost.options, "costing.options"),
            "plan, costs": "see plan_json (plan.json: plan_to_json(costing.plan, costing.costs))"}


SNAPSHOT_WIDTH = 120


def dump(value: Any, indent: int = 0, used: int = 0) -> str:
    """JSON with sorted keys: a list or object on one line where it fits in SNAPSHOT_WIDTH (`used`: what the
    line already holds), else one item a line, indented one space a level."""
    one = json.dumps(value, sort_keys=True, allow_nan=False, ensure_ascii=False)
    if used + len(one) <= SNAPSHOT_WIDTH or not isinstance(value, (dict, list)) or not value:
        return one
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        items = []
        for k in sorted(value):
            head = f"{pad}{json.dumps(k, ensure_ascii=False)}: "
            items.append(head + dump(value[k], indent + 1, len(head) + 1))
    else:
        items = [pad + dump(v, indent + 1, len(pad) + 1) for v in value]
    open_, close = "{}" if isinstance(value, dict) else "[]"
    return open_ + "\n" + ",\n".join(items) + "\n" + " " * indent + close


def snapshot(prog: Program) -> str:
    """Every field of the Program (its class and settings included) as sorted JSON (`dump`)."""
    fields = {f.name: (costing_json(prog.costing) if f.name == "costing" else jsonable(getattr(prog, f.name), f.name))
              for f in dataclasses.fields(prog)}
    return dump({"program": type(prog).__name__, **fields}) + "\n"


def golden_files(case) -> dict[Path, str]:
    """{golden path: the text the compiler gives now} for one case: its snapshot, and for a whole-program
    case its build's files."""
    prog = program(case)
    out = {snapshot_path(case): snapshot(prog)}
    if whole_program(case):
        # (runtime/ is no rendering: templates/runtime/ is its only copy, the same in every build)
        out.update({GOLDEN / case_id(case) / name: text for name, text in render_program(prog).items()
                    if not name.startswith("runtime/")})
    assert sorted(out) == sorted(golden_paths(case)), f"{case_id(case)}: the target's files and render_files disagree"
    return out


# What every generated program must pass (besides `ruff format --check`): pyflakes (F: unused or undefined
# names, ...), syntax and statement errors (E4, E7, E9), import order (I), whitespace (W).
RUFF_CHECK = "E4,E7,E9,F,I,W"


def ruff_problems(files: dict[str, str], directory: Path) -> str:
    """What `ruff format --check` and `ruff check` (RUFF_CHECK) find in a build's Python files (each parsed
    first), written under `directory` as the build lays them out; "" when nothing."""
    from ruff.__main__ import find_ruff_bin

    for name, text in files.items():
        if name.endswith(".py"):
            ast.parse(text)
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text)
    assert list(directory.glob("*.py"))
    common = ["--isolated", "--no-cache", "--line-length", "100", "--target-version", "py311", "."]
    found = []
    for cmd in (["format", "--check"],
                ["check", "--select", RUFF_CHECK, "--ignore", "E501", "--output-format", "concise"]):
        proc = subprocess.run([find_ruff_bin(), *cmd, *common], check=False, cwd=directory, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            found.append(f"ruff {cmd[0]}: " + proc.stdout + proc.stderr)
    return "\n".join(found)
