"""The target registry: `TARGETS[name]` gives a target's capabilities, checks, template files and render
adapter. The spec's `targets` values, the CLI's `--target` choices, the JSON Schema, E049 messages and the
capability table in docs/targets.md all come from here: a new target is one module and one line below."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Capabilities, Target
from .jax import JaxTarget
from .mlx import MlxTarget
from .torch import TorchTarget

if TYPE_CHECKING:
    from ..diagnostics import Diagnostic
    from ..planner.plan import Plan
    from ..source import Document

TARGETS: dict[str, Target] = {t.name: t for t in (JaxTarget(), TorchTarget(), MlxTarget())}
TARGET_NAMES: tuple[str, ...] = tuple(TARGETS)
# what a spec without `targets:` is built for (and checked against)
DEFAULT_TARGETS: tuple[str, ...] = tuple(n for n, t in TARGETS.items() if t.capabilities.default)


def attention_kernels(targets) -> dict[str, bool]:
    """Per target: does its attention (at dropout 0) run a fused kernel that stores no probabilities (what
    the cost model's `estimate_targets` takes)?"""
    return {t: TARGETS[t].capabilities.fused_attention for t in targets}


def check_target(plan: Plan, doc: Document, target: str) -> list[Diagnostic]:
    """E049 for everything in `plan` that `target` cannot run."""
    return TARGETS[target].check(plan, doc)


__all__ = ["DEFAULT_TARGETS", "TARGETS", "TARGET_NAMES", "Capabilities", "Target", "attention_kernels",
           "check_target"]
