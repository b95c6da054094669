"""The target registry: `TARGETS[name]` gives a target's declaration (its capabilities, template files and
template files), below the planner. The spec's `targets` values, the CLI's `--target` choices, the JSON
Schema, E049 messages and the capability table in docs/targets.md all come from here. A target's checks and
its lowering to a Program are its `Lowering` (mithril_spec/lowering/, `LOWERINGS[name]`), above the planner."""

from __future__ import annotations

from .base import Capabilities, Target
from .jax import JaxTarget
from .mlx import MlxTarget
from .torch import TorchTarget

TARGETS: dict[str, Target] = {t.name: t for t in (JaxTarget(), TorchTarget(), MlxTarget())}
TARGET_NAMES: tuple[str, ...] = tuple(TARGETS)
# what a spec without `targets:` is built for (and checked against)
DEFAULT_TARGETS: tuple[str, ...] = tuple(n for n, t in TARGETS.items() if t.capabilities.default)


def attention_kernels(targets) -> dict[str, bool]:
    """Per target: does its attention (at dropout 0) run a fused kernel that stores no probabilities (what
    the cost model's `estimate_targets` takes)?"""
    return {t: TARGETS[t].capabilities.fused_attention for t in targets}


__all__ = ["DEFAULT_TARGETS", "TARGETS", "TARGET_NAMES", "Capabilities", "Target", "attention_kernels"]
