"""The cost model: per-device memory, communication, FLOPs and step time of a plan, before launch.

`estimate(plan, hardware, options)` walks the resolved graph once (a repeated block once per distinct
layout of its copies) and returns `Costs`:

- memory per device, for each pipe rank (the pipeline stages a device holds): parameters, gradients and
  optimizer state (`planner/states.py`), activations saved for the backward pass per operator under remat
  none | selective | full (each operator states its own in `ops/`, through `walk.LayerCosts`), and
  temporaries; their sum is the predicted peak;
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

from ..hardware import Hardware
from ..plan import Plan
from ..states import StateMemory, param_state_bytes, precision_setup, state_memory
from .collectives import Collective, pipeline_bubble, ring_time
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
    "StageCosts", "StateMemory", "StepTime", "Temporaries", "costs_to_json", "estimate", "estimate_remats",
    "param_state_bytes", "pipeline_bubble", "precision_setup", "ring_time", "state_memory", "step_time",
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
