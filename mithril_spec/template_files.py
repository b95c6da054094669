"""Where the targets' templates are: read by the renderer (render/environment.py) and by the lowering, which
reserves every name a template defines (lowering/common.py `program_names`)."""

from __future__ import annotations

import functools
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def template_dirs() -> list[Path]:
    """Inside an installed wheel templates live in the package; in a checkout at the repository root."""
    return [d for d in (_PKG / "templates", _PKG.parent / "templates") if d.is_dir()]


RUNTIME = "runtime"  # the package every build carries: templates/runtime/*.py, copied as they are


@functools.cache
def runtime_files(target: str | None = None) -> dict[str, str]:
    """{"runtime/NAME.py": text} of the helpers every program carries, the same files byte for byte in every
    build and target of one mithril-spec version (they are no templates: nothing of a spec reaches them);
    with `target`, also that target's own helpers (templates/runtime/<target>/*.py: framework code that no spec
    changes, the same in every build of the target) as "runtime/<target>/NAME.py". Read once per process
    (callers do not change the mapping)."""
    for directory in template_dirs():
        found = sorted((directory / RUNTIME).glob("*.py"))
        if target:
            found += sorted((directory / RUNTIME / target).glob("*.py"))
        if found:
            base = directory / RUNTIME
            return {f"{RUNTIME}/{path.relative_to(base).as_posix()}": path.read_text(encoding="utf-8")
                    for path in found}
    return {}
