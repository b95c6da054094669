"""One costing of a plan: the cost model run once, with one target's options, and read by everything that
reports that prediction. `plan --target T` (text, `--format json`, `--report`) and a build for T (its
plan.json with the `predicted` its program's --profile reads, and the figures embedded in the program:
`PLANNED_BYTES`, `PREDICTED_DIGEST`) all take the `Costing` of (plan, T), computed once by the command and
passed down: a second estimate with other options is how a build once wrote one peak into plan.json and
another into train.py. `plan` without `--target` takes the target-neutral costing: the largest over the
spec's targets, what every build must fit.

Step times need a hardware profile but no second walk of the graph (`Costing.on`): the walk decides memory,
communication and FLOPs, a profile only prices them. A build takes its costing from its Program
(lowering/program.py `lower`: `Program.costing`, whose `plan_json` and `predicted` are views of it).
"""

from __future__ import annotations

import dataclasses

from ..planner.costs import CostOptions, Costs, StateMemory, estimate_targets, step_time
from ..planner.hardware import Hardware
from ..planner.plan import Plan
from ..targets import attention_kernels
from .cost_options import cost_options


@dataclasses.dataclass(frozen=True)
class Costing:
    """The costs of `plan` as `target`'s program runs it (None: target-neutral), without a hardware profile,
    and the options they were costed with (so that a profile's step time prices the same program)."""

    plan: Plan
    target: str | None
    options: CostOptions
    costs: Costs

    def on(self, hardware: Hardware) -> Costs:
        """These costs with `hardware`'s step time and fit: what `estimate` gives with the profile, without
        walking the graph again."""
        time = step_time(self.costs, self.plan, hardware, self.options)
        return dataclasses.replace(self.costs, hardware=hardware, time=time)

    @property
    def held(self) -> StateMemory:
        """The training state per device on the fullest pipe rank (the first of equals): what the program
        holds and reports next to its own count (`PLANNED_BYTES`), `costs.stages[].states` in plan.json."""
        return max((s.states for s in self.costs.stages), key=lambda st: st.total)


def costing(plan: Plan, target: str | None = None) -> Costing:
    """The one costing of `plan` for `target`: its attention kernel, how its program issues the data-parallel
    reduction and which layers it dispatches as sharded tensors (cost_options.py), the states it holds. With
    no target: the largest over the spec's targets, one reduction call, no sharded-tensor dispatch."""
    kernels = attention_kernels([target] if target else plan.spec.targets)
    base = cost_options(plan, target) if target else CostOptions()
    costs = estimate_targets(plan, kernels, options=base, target=target)
    # the options estimate_targets costed with (the step time reads them)
    options = dataclasses.replace(base, fused_attention=all(kernels.values()), target=target)
    return Costing(plan, target, options, costs)
