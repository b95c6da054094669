"""The cost model: per-device memory, communication, FLOPs and step time of a plan, before launch.

`estimate(plan, hardware, options)` walks the resolved graph once (a repeated block once per distinct
layout of its copies) and returns `Costs`:

- memory per device, for each pipe rank (the pipeline stages a device holds): parameters, gradients and
  optimizer state (`planner/states.py`), activations saved for the backward pass per operator under remat
  none | selective | full (each operator states its own in `ops/`, through `walk.LayerCosts`), and
  temporaries; their sum is the predicted peak; with activation offload (`training.offload`), the saved
  tensors at or above the threshold are counted in host memory instead (`offload.py`);
- every collective the plan implies, with its mesh axes, payload bytes per device and calls per step
  (`collectives.py`);
- FLOPs per step (forward, backward = 2 x forward, recompute separately), globally and per device;
- with a hardware profile: predicted step time and MFU (`time.py`).

The formulas and their assumptions are documented in docs/cost-model.md; `serialise.py` gives what
`plan --format json` prints under "costs".
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ...graph import RepeatNode
from ...ops import OPS
from ..hardware import Hardware
from ..plan import Plan
from ..states import StateMemory, param_state_bytes, precision_setup, state_memory
from .collectives import Collective, collective_time, pipeline_bubble, ring_time, tree_time
from .results import (
    KINDS,
    REMAT_MODES,
    Activations,
    BlockActivations,
    CostOptions,
    Costs,
    Flops,
    StageCosts,
    StepTime,
    Temporaries,
)
from .serialise import costs_to_json
from .time import step_time
from .walk import Walk

__all__ = [
    "KINDS", "REMAT_MODES", "Activations", "BlockActivations", "Collective", "CostOptions", "Costs", "Flops",
    "collective_time", "tree_time",
    "StageCosts", "StateMemory", "StepTime", "Temporaries", "costs_to_json", "estimate", "estimate_remats",
    "estimate_targets", "param_state_bytes", "pipeline_bubble", "precision_setup", "ring_time", "state_memory",
    "step_time",
]  # fmt: skip


def estimate(plan: Plan, hardware: Optional[Hardware] = None, options: Optional[CostOptions] = None) -> Costs:
    options = options or CostOptions()
    if options.remat is not None and options.remat not in REMAT_MODES:
        raise ValueError(f"remat must be one of {REMAT_MODES}")
    costs = Walk(plan, options).run()
    if hardware is not None:
        costs = dataclasses.replace(costs, hardware=hardware, time=step_time(costs, plan, hardware, options))
    return costs


def estimate_remats(plan: Plan, hardware: Optional[Hardware] = None, remats: tuple[str, ...] = REMAT_MODES,
                    options: Optional[CostOptions] = None) -> dict[str, Costs]:
    """`estimate` under several remat settings, sharing the walk (what `plan --auto` needs)."""
    options = options or CostOptions()
    walk = Walk(plan, options)
    out = {}
    for r in remats:
        costs = walk.run(r)
        if hardware is not None:
            opts = dataclasses.replace(options, remat=r)
            costs = dataclasses.replace(costs, hardware=hardware, time=step_time(costs, plan, hardware, opts))
        out[r] = costs
    return out


def estimate_targets(plan: Plan, fused: dict[str, bool], hardware: Optional[Hardware] = None,
                     options: Optional[CostOptions] = None, target: Optional[str] = None) -> Costs:
    """`estimate` for the programs `plan` is built into, whose kernels may store different activations: `fused`
    maps each target to its `fused_attention` capability (mithril_spec/targets; attention at dropout 0 stores
    no probabilities). With `target`, that target's figures (`Costs.target`); otherwise the largest over the
    targets (what every build must fit), with a note on each target that stores less."""
    options = options or CostOptions()
    if target is not None:
        costs = estimate(plan, hardware, dataclasses.replace(options, fused_attention=fused[target], target=target))
        return dataclasses.replace(costs, target=target)
    costs = estimate(plan, hardware, dataclasses.replace(options, fused_attention=all(fused.values())))
    lighter = [t for t, f in fused.items() if f]
    if not lighter or len(lighter) == len(fused):
        return costs
    nodes = [n for top in plan.graph.layers for n in (top.layers if isinstance(top, RepeatNode) else (top,))]
    if not any(OPS[n.op].fused_kernel(n.attrs) for n in nodes):
        return costs  # nothing a fused kernel would store less of
    less = costs.peak - estimate(plan, hardware, dataclasses.replace(options, fused_attention=True)).peak
    if less <= 0:
        return costs
    heavy = [t for t, f in fused.items() if not f]
    which = f"{', '.join(heavy)} target" + (" stores" if len(heavy) == 1 else "s store")
    note = (f"activations as the {which} them, with the attention probabilities [b, heads, s, s]; the fused "
            f"attention of {', '.join(lighter)} keeps none: a peak {less:,} bytes lower per device "
            f"(`plan --target {lighter[0]}`)")
    return dataclasses.replace(costs, notes=costs.notes + (note,))
