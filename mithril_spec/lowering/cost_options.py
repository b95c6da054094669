"""The cost model's options for one target's program, from its lowering (`LOWERINGS[target]`): how the program issues the
data-parallel gradient reduction (`Lowering.reduction_calls`) and which layers it dispatches as sharded tensors
(`Lowering.sharded_layers`). Read by `costing.costing`, the one costing that `plan --target` and a build for the
target share (and `lower`, lowering/program.py, for the Program)."""

from __future__ import annotations

from ..planner.costs import CostOptions
from ..planner.plan import Plan
from . import LOWERINGS


def cost_options(plan: Plan, target: str) -> CostOptions:
    t = LOWERINGS[target]
    return CostOptions(reduction_calls=t.reduction_calls(plan), sharded_layers=t.sharded_layers(plan))
