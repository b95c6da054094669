"""The target registry: `TARGETS[name]` gives a target's capabilities, checks, template files and render
adapter. The spec's `targets` values, the CLI's `--target` choices, the JSON Schema, E049 messages and the
capability table in docs/targets.md all come from here: a new target is one module and one line below."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Capabilities, Target
from .jax import JaxTarget
from .torch import TorchTarget

if TYPE_CHECKING:
    from ..diagnostics import Diagnostic
    from ..planner.plan import Plan
    from ..source import Document

TARGETS: dict[str, Target] = {t.name: t for t in (JaxTarget(), TorchTarget())}
TARGET_NAMES: tuple[str, ...] = tuple(TARGETS)


def check_target(plan: Plan, doc: Document, target: str) -> list[Diagnostic]:
    """E049 for everything in `plan` that `target` cannot run."""
    return TARGETS[target].check(plan, doc)


__all__ = ["TARGETS", "TARGET_NAMES", "Capabilities", "Target", "check_target"]
