"""The (spec, target) pairs every render test covers: each example for each target it names, and the
golden files they are compared with (written only by scripts/update_goldens.py, never by a test)."""

from __future__ import annotations

from pathlib import Path

from mithril_spec.frontend import compile_file
from mithril_spec.render.build import render_files
from mithril_spec.targets import TARGETS

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted(p for p in (ROOT / "specs").iterdir() if p.suffix in (".yaml", ".toml") and not p.name.startswith("_"))
GOLDEN = ROOT / "tests" / "golden"


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


def golden_paths(case) -> list[Path]:
    """The golden files of one case, without rendering anything (the plan decides the conditional files), and
    its plan.json: costed as the target's program runs the plan, one per (spec, target)."""
    spec, target = case
    files = TARGETS[target].files_for(compile_file(spec).plan)
    return [GOLDEN / case_id(case) / name for _, name in files] + [GOLDEN / case_id(case) / "plan.json"]


def golden_files(case) -> dict[Path, str]:
    """{golden path: the text the compiler renders now} for one case."""
    spec, target = case
    files = render_files(compile_file(spec), target, str(spec.relative_to(ROOT)))
    out = {GOLDEN / case_id(case) / name: text for name, text in files.items()}
    assert sorted(out) == sorted(golden_paths(case)), f"{case_id(case)}: the target's files and render_files disagree"
    return out
