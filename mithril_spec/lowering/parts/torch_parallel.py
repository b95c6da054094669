"""The parts of torch's parallel, pipeline_main and pipeline_stages templates (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    return {}
