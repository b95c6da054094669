"""Where the targets' templates are: read by the renderer (render/environment.py) and by the lowering, which
reserves every name a template defines (lowering/common.py `program_names`)."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def template_dirs() -> list[Path]:
    """Inside an installed wheel templates live in the package; in a checkout at the repository root."""
    return [d for d in (_PKG / "templates", _PKG.parent / "templates") if d.is_dir()]
