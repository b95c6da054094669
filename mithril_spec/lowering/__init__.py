"""The lowerings, one per target, above the planner: `LOWERINGS[name]` checks a plan against the target
(E049, lowering/base.py and the target's module) and gives the cost model's options for its program;
`lower(plan, target)` (program.py) turns a plan into the typed Program its templates render, costed once.
The targets' declarations (capabilities, files) are below the planner, in mithril_spec/targets/."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..targets import TARGETS
from .base import Lowering
from .jax import JaxLowering
from .mlx import MlxLowering
from .torch import TorchLowering

if TYPE_CHECKING:
    from ..diagnostics import Diagnostic
    from ..planner.plan import Plan
    from ..source import Document

LOWERINGS: dict[str, Lowering] = {lw.name: lw for lw in (JaxLowering(), TorchLowering(), MlxLowering())}
assert tuple(LOWERINGS) == tuple(TARGETS), "one lowering per declared target, in the registry's order"


def check_target(plan: Plan, doc: Document, target: str) -> list[Diagnostic]:
    """E049 for everything in `plan` that `target` cannot run."""
    return LOWERINGS[target].check(plan, doc)


__all__ = ["LOWERINGS", "Lowering", "check_target"]
