"""Context the torch templates need beyond the shared context (render/context.py)."""

from __future__ import annotations

from typing import Any

from ..planner.plan import Plan


def extra_context(plan: Plan, ctx: dict[str, Any]) -> dict[str, Any]:
    return {}
