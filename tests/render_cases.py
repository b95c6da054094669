"""The (spec, target) pairs every render test covers: each example for each target it names."""

from __future__ import annotations

from pathlib import Path

from mithril_spec.frontend import compile_file
from mithril_spec.render.build import TARGET_FILES

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted(p for p in (ROOT / "specs").iterdir() if p.suffix in (".yaml", ".toml") and not p.name.startswith("_"))


def cases() -> list[tuple[Path, str]]:
    out = []
    for spec in SPECS:
        if spec.suffix == ".toml":
            continue  # twins: same program as their YAML (tested in test_twins)
        c = compile_file(spec)
        for target in c.spec.targets:
            if (ROOT / "templates" / target / "train.py.j2").exists() and target in TARGET_FILES:
                out.append((spec, target))
    return out


def case_id(case) -> str:
    return f"{case[0].stem}-{case[1]}"
