"""Training-state memory per device: parameters, gradients, fp32 master weights, optimizer moments and
buffers under ZeRO-1/2 and the fsdp axis (ZeRO-3). No graph walk: the planner calls it for every plan."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Protocol

from .sizes import DTYPE_BYTES, OPTIMIZER_SLOTS



class ParamPlan(Protocol):
    """What the state counts of one parameter or buffer (planner.plan.ParamPlan is one: this module sits
    below the plan, which calls it)."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> Any: ...

    @property
    def local_shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> str: ...

    @property
    def local_bytes(self) -> int: ...


class Plan(Protocol):
    """What the state counts of a plan (planner.plan.Plan is one)."""

    spec: Any
    mesh: Any
    pipeline: Any
    params: tuple[ParamPlan, ...]
    buffers: tuple[ParamPlan, ...]
    batch_axes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class StateMemory:
    """Bytes per device of the training state."""

    params: int
    grads: int
    master: int  # fp32 master copy of 16-bit parameters (precision.master_weights)
    moments: int  # optimizer slots (adam: m and v; sgd: momentum)
    buffers: int

    @property
    def optimizer(self) -> int:
        return self.master + self.moments

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.buffers


def precision_setup(spec) -> tuple[int, bool, int, int]:
    """(ZeRO stage, fp32 master weights?, optimizer slots per parameter, bytes per slot element)."""
    tr = spec.training
    pb = DTYPE_BYTES[tr.precision.params]
    master = bool(getattr(tr.precision, "master_weights", False)) and pb < 4
    slots = OPTIMIZER_SLOTS[tr.optimizer.name]
    if tr.optimizer.name == "sgd" and tr.optimizer.momentum == 0:
        slots = 0
    return getattr(tr, "zero", 0), master, slots, (4 if master else pb)


def zero_dim(local_shape: tuple[int, ...], zero_degree: int) -> Optional[int]:
    """ZeRO's split of one parameter's optimizer state (ZeRO-2: its gradient too) over the `zero_degree`
    devices of the batch axes its layout does not use: on the first dimension of its local shard that
    `zero_degree` divides evenly; None (the state stays whole on every device) when none does or there is
    nothing to split over. Every program splits the same way (JAX `zero_layout`, torch `ZERO_DIMS`)."""
    if zero_degree <= 1:
        return None
    return next((i for i, n in enumerate(local_shape) if n % zero_degree == 0), None)


def param_state_bytes(pp: ParamPlan, zero_degree: int, zero: int, master: bool, slots: int, slot_bytes: int
                      ) -> tuple[int, int, int, int, int]:
    """Bytes per device of one parameter's (params, grads, master copy, moments), and its optimizer-state
    elements per device. ZeRO-1 shards the optimizer state (master copy and moments) over the data axes the
    parameter is replicated on (`zero_degree` devices), ZeRO-2 the gradients too, along `zero_dim` (whole when
    no dimension divides); the fsdp axis already shards everything through the layout."""
    n_local = math.prod(pp.local_shape)
    pb = DTYPE_BYTES[pp.dtype]
    split = n_local // zero_degree if zero >= 1 and zero_dim(pp.local_shape, zero_degree) is not None else n_local
    opt_n = split if zero >= 1 else n_local
    grads = (split if zero >= 2 else n_local) * pb
    return n_local * pb, grads, (opt_n * 4 if master else 0), slots * opt_n * slot_bytes, opt_n


def state_memory(plan: Plan, outside_everywhere: bool = False, padded: bool = False) -> StateMemory:
    """Bytes per device of parameters, gradients, optimizer state and buffers, on the fullest pipe rank
    (no graph walk: fast). With `outside_everywhere`, the parameters outside the pipelined repeated blocks are
    on every pipe rank (a target that runs those layers outside the pipeline: Plan.memory_for). With `padded`
    as well, every stage holds as many copies of the pipelined block as the largest stage (a target that pads
    the stages to one shape): each pipe rank virtual_stages x that many, whoever's copies they are."""
    zero, master, slots, slot_bytes = precision_setup(plan.spec)
    batch = set(plan.batch_axes)
    pipe = plan.mesh.pipe
    ranks = [[0, 0, 0, 0, 0] for _ in range(pipe)]
    pl = plan.pipeline if outside_everywhere else None
    split = {r for s in pl.stage_repeats for r, _, _ in s} if pl is not None else set()
    outside = {p.name for p in plan.params + plan.buffers if split and p.name.split(".")[0] not in split}
    # padded stages: the pipelined copies of each block are counted as `rows` copies of its first one on every
    # pipe rank (stages of several blocks hold, per block, as many rows as the stage with the most copies of it)
    block = {n.name: n.block for n in plan.graph.layers if n.is_repeat}
    rows: dict[str, int] = {}  # "<repeat>.<copy>." of each block's first pipelined copy -> rows per pipe rank
    if padded and split:
        for kind in dict.fromkeys(block[r] for s in pl.stage_copies for r, _ in s):
            first = next(c for s in pl.stage_copies for c in s if block[c[0]] == kind)
            rows["{}.{}.".format(*first)] = pl.virtual * max(
                sum(block[r] == kind for r, _ in s) for s in pl.stage_copies)
    tied = getattr(plan.pipeline, "tied_copies", None) or {}

    def holders(name: str, stage: int):
        """(pipe ranks holding `name`, how many times each)."""
        if rows and name.split(".")[0] in split:
            one = next((one for one in rows if name.startswith(one)), None)
            return (ranks, rows[one]) if one else ((), 0)
        if name in outside:
            return ranks, 1
        # a tied table: also on the pipe ranks of the tied layers that hold a copy of it
        copies = tied.get(name, ())
        return tuple(ranks[r] for r in dict.fromkeys([stage % pipe] + [s % pipe for s in copies])), 1

    cache: dict[tuple, tuple] = {}
    for pp in plan.params:
        key = (pp.spec, pp.local_shape, pp.dtype)
        vals = cache.get(key)
        if vals is None:
            layout = {a for d in pp.spec for a in d}
            deg = math.prod(plan.mesh.size(a) for a in batch - layout)
            vals = cache[key] = param_state_bytes(pp, deg, zero, master, slots, slot_bytes)[:4]
        held, times = holders(pp.name, getattr(pp, "stage", 0))
        for acc in held:
            acc[0] += times * vals[0]
            acc[1] += times * vals[1]
            acc[2] += times * vals[2]
            acc[3] += times * vals[3]
    for bp in plan.buffers:
        held, times = holders(bp.name, getattr(bp, "stage", 0))
        for acc in held:
            acc[4] += times * bp.local_bytes
    return StateMemory(*max(ranks, key=sum))
