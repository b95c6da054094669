"""The cost model: per-device memory, communication, FLOPs and step time of a plan, before launch.

`estimate(plan, hardware, options)` walks the resolved graph once (a repeated block once per distinct
layout of its copies) and returns `Costs`:

- memory per device, for each pipe rank (the pipeline stages a device holds): parameters, gradients and
  optimizer state (fp32 master weights and moments modelled explicitly; ZeRO-1/2 over the data axes, the
  fsdp axis as ZeRO-3), activations saved for the backward pass per operator under remat none | selective
  | full, and temporaries; their sum is the predicted peak;
- every collective the plan implies, with its mesh axes, payload bytes per device and calls per step;
- FLOPs per step (forward, backward = 2 x forward, recompute separately), globally and per device;
- with a hardware profile: predicted step time, MFU, and whether the peak fits in device memory.

The formulas and their assumptions are documented in docs/cost-model.md; every figure here is what
`plan --format json` prints under "costs".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from ..graph import Node, RepeatNode
from ..ops import TensorType
from .hardware import Hardware, link
from .plan import DTYPE_BYTES, OPTIMIZER_SLOTS, ParamPlan, Plan

REMAT_MODES = ("none", "selective", "full")
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send/recv")
MASK_BYTES = 1  # a dropout mask element (bool)

# Parameter dimensions an operator computes on sharded (tensor parallelism); a mesh axis that shards any
# other dimension, or a batch axis (fsdp) on any dimension, is gathered before use (ZeRO-3 / FSDP).
HANDLED_DIMS: dict[str, dict[str, tuple[int, ...]]] = {
    "linear": {"weight": (0, 1), "bias": (0,)},
    "conv2d": {"weight": (0, 1), "bias": (0,)},
    "embedding": {"weight": (0, 1)},
    "attention": {"q.weight": (1,), "k.weight": (1,), "v.weight": (1,), "o.weight": (0,),
                  "q.bias": (0,), "k.bias": (0,), "v.bias": (0,)},
    "mlp": {"fc.weight": (1,), "gate.weight": (1,), "up.weight": (1,), "proj.weight": (0,), "down.weight": (0,),
            "fc.bias": (0,), "gate.bias": (0,), "up.bias": (0,)},
    "moe": {"experts.fc.weight": (2,), "experts.fc.bias": (1,), "experts.proj.weight": (1,)},
}  # fmt: skip
# Dimensions whose mesh axes are expert parallelism: the experts stay where they are (tokens travel to them by
# all-to-all) even when the axis also splits the batch.
EXPERT_DIMS: dict[str, dict[str, int]] = {
    "moe": {"experts.fc.weight": 0, "experts.fc.bias": 0, "experts.proj.weight": 0, "experts.proj.bias": 0},
}


# ---------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class CostOptions:
    remat: Optional[str] = None  # override training.remat
    # Parameters gathered (or cast) for the forward pass are freed and produced again for the backward
    # (PyTorch FSDP2's default, the ZeRO-3 paper). False: kept until the backward, as XLA does without remat.
    regather: bool = True
    overlap: bool = True  # data-parallel collectives overlap with compute
    efficiency: Optional[float] = None  # override the hardware profile's


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


@dataclasses.dataclass(frozen=True)
class BlockActivations:
    name: str  # the repeat's name
    count: int
    per_copy: int  # bytes saved per copy with no remat (the largest over copies)
    scores: int  # of which attention scores/probabilities (dropped by selective remat)
    checkpoint: int  # the block input, all that full remat keeps per copy


@dataclasses.dataclass(frozen=True)
class Activations:
    """Bytes per device saved for the backward pass (one micro-batch, times those in flight in a pipeline)."""

    remat: str
    saved: int  # for all micro-batches in flight
    recompute: int  # full remat: one block's activations rebuilt during the backward pass
    by_op: dict[str, int]  # saved bytes by operator kind (before remat)
    blocks: tuple[BlockActivations, ...]

    @property
    def total(self) -> int:
        return self.saved + self.recompute


@dataclasses.dataclass(frozen=True)
class Temporaries:
    """Short-lived buffers at the worst moment of a step (see docs/cost-model.md)."""

    gradient_flow: int  # gradients of the largest layer's output and input, alive together
    loss: int  # fp32 log-softmax and the logits' gradient
    gathered_params: int  # parameters gathered over fsdp (or cast to the compute dtype)
    unsharded_grads: int  # a layer's gradients before their reduce-scatter
    optimizer: int  # update temporaries of the largest parameter shard (fp32)

    @property
    def total(self) -> int:
        return self.gradient_flow + self.loss + self.gathered_params + self.unsharded_grads + self.optimizer


@dataclasses.dataclass(frozen=True)
class StageCosts:
    """One pipe rank: the pipeline stages its devices hold (everything when there is no pipeline)."""

    stage: int  # the pipe rank
    layers: tuple[str, ...]  # top-level layers (and `blocks[a:b]` slices of repeats) on this rank
    devices: int  # devices on this rank
    states: StateMemory
    activations: Activations
    temporaries: Temporaries
    in_flight: float  # micro-batches whose activations are alive at once (pipeline schedules)
    collectives: tuple["Collective", ...]
    flops_per_device: float  # forward + backward + recompute, one step

    @property
    def peak(self) -> int:
        return self.states.total + self.activations.total + self.temporaries.total


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str  # all-reduce | all-gather | reduce-scatter | all-to-all
    axes: tuple[str, ...]  # mesh axes of the group
    group: int  # devices per group
    phase: str  # forward | backward | recompute | step
    what: str
    bytes: int  # payload per call per device: the full (reduced or gathered) buffer
    count: int  # calls per optimizer step
    blocking: bool  # on the critical path (tensor parallel) rather than overlapped (data parallel)

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.count

    @property
    def factor(self) -> float:
        """Bytes each device sends per payload byte (ring algorithms)."""
        n = self.group
        if self.kind == "send/recv":
            return 1.0
        return 2 * (n - 1) / n if self.kind == "all-reduce" else (n - 1) / n

    @property
    def steps(self) -> int:
        if self.kind == "send/recv":
            return 1
        return 2 * (self.group - 1) if self.kind == "all-reduce" else self.group - 1

    @property
    def wire_bytes(self) -> float:
        return self.factor * self.total_bytes


@dataclasses.dataclass(frozen=True)
class Flops:
    forward: float  # whole model, one step (all micro-batches, global batch)
    backward: float  # 2 x forward
    recompute: float  # remat
    per_device_forward: float
    per_device_backward: float
    per_device_recompute: float

    @property
    def model(self) -> float:
        """Forward + backward, without recompute (the MFU numerator)."""
        return self.forward + self.backward

    @property
    def per_device_total(self) -> float:
        return self.per_device_forward + self.per_device_backward + self.per_device_recompute


@dataclasses.dataclass(frozen=True)
class StepTime:
    hardware: str
    peak_flops: float  # per device, for the compute dtype
    efficiency: float
    compute_s: float
    blocking_comm_s: float  # tensor-parallel collectives: on the critical path
    overlapped_comm_s: float  # data-parallel collectives: overlapped with compute
    exposed_comm_s: float  # the part of overlapped_comm_s that compute does not hide
    optimizer_s: float  # memory-bound optimizer update
    bubble: float  # pipeline bubble fraction
    step_s: float
    mfu: float
    hfu: float  # counts recompute too
    samples_per_s: float
    tokens_per_s: Optional[float]
    collective_s: tuple[float, ...]  # per entry of Costs.collectives
    links: tuple[str, ...]  # intra-node | inter-node, per entry of Costs.collectives


@dataclasses.dataclass(frozen=True)
class Costs:
    remat: str
    zero: int
    micro_batches: int
    local_batch: int  # samples per device per micro-batch
    stages: tuple[StageCosts, ...]
    collectives: tuple[Collective, ...]  # of the busiest pipe rank (the only one without a pipeline)
    flops: Flops
    hardware: Optional[Hardware]
    time: Optional[StepTime]
    notes: tuple[str, ...]

    @property
    def worst(self) -> StageCosts:
        return max(self.stages, key=lambda s: s.peak)

    @property
    def peak(self) -> int:
        return self.worst.peak

    @property
    def capacity(self) -> Optional[float]:
        return self.hardware.usable_bytes if self.hardware else None

    @property
    def fits(self) -> Optional[bool]:
        return None if self.hardware is None else self.peak <= self.hardware.usable_bytes

    def comm_bytes(self, kind: Optional[str] = None, axes: Optional[tuple] = None) -> int:
        return sum(c.total_bytes for c in self.collectives
                   if (kind is None or c.kind == kind) and (axes is None or c.axes == tuple(axes)))


# ---------------------------------------------------------------- formulas


def pipeline_bubble(stages: int, micro_batches: int, virtual: int = 1) -> float:
    """Idle fraction of a GPipe / 1F1B schedule: (p - 1) / (m + p - 1); interleaved with v virtual stages
    per rank: (p - 1) / (v m + p - 1)."""
    if stages <= 1:
        return 0.0
    return (stages - 1) / (virtual * micro_batches + stages - 1)


def ring_time(kind: str, payload: float, group: int, bandwidth: float, latency: float) -> float:
    """Seconds for one ring collective of `payload` bytes over `group` devices."""
    if kind == "send/recv":
        return payload / bandwidth + latency
    if group <= 1:
        return 0.0
    if kind == "all-reduce":
        return 2 * (group - 1) / group * payload / bandwidth + 2 * (group - 1) * latency
    return (group - 1) / group * payload / bandwidth + (group - 1) * latency


# ---------------------------------------------------------------- training state


def precision_setup(spec) -> tuple[int, bool, int, int]:
    """(ZeRO stage, fp32 master weights?, optimizer slots per parameter, bytes per slot element)."""
    tr = spec.training
    pb = DTYPE_BYTES[tr.precision.params]
    master = bool(getattr(tr.precision, "master_weights", False)) and pb < 4
    slots = OPTIMIZER_SLOTS[tr.optimizer.name]
    if tr.optimizer.name == "sgd" and tr.optimizer.momentum == 0:
        slots = 0
    return getattr(tr, "zero", 0), master, slots, (4 if master else pb)


def param_state_bytes(pp: ParamPlan, zero_degree: int, zero: int, master: bool, slots: int, slot_bytes: int
                      ) -> tuple[int, int, int, int, int]:
    """Bytes per device of one parameter's (params, grads, master copy, moments), and its optimizer-state
    elements per device. ZeRO-1 shards the optimizer state (master copy and moments) over the data axes the
    parameter is replicated on (`zero_degree` devices), ZeRO-2 the gradients too; the fsdp axis already
    shards everything through the layout."""
    n_local = math.prod(pp.local_shape)
    pb = DTYPE_BYTES[pp.dtype]
    opt_n = math.ceil(n_local / zero_degree) if zero >= 1 else n_local
    grads = (math.ceil(n_local / zero_degree) if zero >= 2 else n_local) * pb
    return n_local * pb, grads, (opt_n * 4 if master else 0), slots * opt_n * slot_bytes, opt_n


def state_memory(plan: Plan) -> StateMemory:
    """Bytes per device of parameters, gradients, optimizer state and buffers, on the fullest pipe rank
    (no graph walk: fast)."""
    zero, master, slots, slot_bytes = precision_setup(plan.spec)
    batch = set(plan.batch_axes)
    pipe = plan.mesh.sizes.get("pipe", 1)
    ranks = [[0, 0, 0, 0, 0] for _ in range(pipe)]
    cache: dict[tuple, tuple] = {}
    for pp in plan.params:
        key = (pp.spec, pp.local_shape, pp.dtype)
        vals = cache.get(key)
        if vals is None:
            layout = {a for d in pp.spec for a in d}
            deg = math.prod(plan.mesh.sizes[a] for a in batch - layout)
            vals = cache[key] = param_state_bytes(pp, deg, zero, master, slots, slot_bytes)[:4]
        acc = ranks[getattr(pp, "stage", 0) % pipe]
        acc[0] += vals[0]
        acc[1] += vals[1]
        acc[2] += vals[2]
        acc[3] += vals[3]
    for bp in plan.buffers:
        ranks[getattr(bp, "stage", 0) % pipe][4] += bp.local_bytes
    return StateMemory(*max(ranks, key=sum))


# ---------------------------------------------------------------- the walk


@dataclasses.dataclass
class _Unit:
    """Costs of one top-level layer or one copy of a repeated block, per device, per micro-batch."""

    saved: dict  # key -> (op, bytes, is attention score); a tensor saved by two operators counts once
    flops: float = 0.0  # forward
    score_flops: float = 0.0  # what selective remat recomputes
    colls: dict = dataclasses.field(default_factory=dict)  # (kind, axes, phase, what, bytes, blocking) -> count
    grad_flow: int = 0
    loss: int = 0
    gathered: int = 0  # bytes gathered (or cast) for compute
    unsharded_grads: int = 0
    params: int = 0
    grads: int = 0
    master: int = 0
    moments: int = 0
    buffers: int = 0
    largest_shard: int = 0  # elements
    sync: dict = dataclasses.field(default_factory=dict)  # (kind, axes, per_micro) -> bytes, gradient sync
    gathers: dict = dataclasses.field(default_factory=dict)  # fsdp axes -> bytes gathered per use
    regather: int = 2  # parameter all-gathers per micro-batch (forward, and again for the backward)

    def flush_gathers(self) -> "_Unit":
        """One all-gather (and reduce-scatter) per layer or block copy and mesh axes, as FSDP wraps them."""
        for axes, nbytes in self.gathers.items():
            self.add_coll("all-gather", axes, "forward", "parameter all-gather (fsdp)", nbytes, False)
            if self.regather > 1:
                self.add_coll("all-gather", axes, "backward", "parameter all-gather (fsdp)", nbytes, False,
                              self.regather - 1)
            self.add_coll("reduce-scatter", axes, "backward", "gradient reduce-scatter (fsdp)", nbytes, False)
        self.gathers = {}
        return self

    def add_coll(self, kind, axes, phase, what, nbytes, blocking, count=1):
        if not axes or nbytes <= 0:
            return
        key = (kind, tuple(axes), phase, what, int(nbytes), blocking)
        self.colls[key] = self.colls.get(key, 0) + count

    @property
    def saved_bytes(self) -> int:
        return sum(v[1] for v in self.saved.values())

    @property
    def score_bytes(self) -> int:
        return sum(v[1] for v in self.saved.values() if v[2])

    def by_op(self, into: dict, k: int = 1) -> None:
        for op, nb, _ in self.saved.values():
            into[op] = into.get(op, 0) + nb * k

    def merge(self, other: "_Unit", k: int = 1, saved: bool = True) -> None:
        """Adds `other` (k times); its saved tensors only when `saved` (same scope)."""
        if saved:
            for key, v in other.saved.items():
                self.saved.setdefault(key, v)
        for key, v in other.colls.items():
            self.colls[key] = self.colls.get(key, 0) + v * k
        for key, v in other.sync.items():
            self.sync[key] = self.sync.get(key, 0) + v * k
        for key, v in other.gathers.items():
            self.gathers[key] = self.gathers.get(key, 0) + v * k
        self.flops += other.flops * k
        self.score_flops += other.score_flops * k
        self.grad_flow = max(self.grad_flow, other.grad_flow)
        self.loss = max(self.loss, other.loss)
        self.gathered += other.gathered * k
        self.unsharded_grads += other.unsharded_grads * k
        self.params += other.params * k
        self.grads += other.grads * k
        self.master += other.master * k
        self.moments += other.moments * k
        self.buffers += other.buffers * k
        self.largest_shard = max(self.largest_shard, other.largest_shard)


class _Walk:
    def __init__(self, plan: Plan, options: CostOptions):
        self.plan = plan
        self.opt = options
        spec = plan.spec
        tr = spec.training
        self.mesh = plan.mesh
        self.batch = frozenset(plan.batch_axes)
        self.rules = _rules(spec)
        pl = plan.pipeline
        self.pipe = plan.mesh.sizes.get("pipe", 1)
        self.n_micro = pl.microbatches if pl is not None else 1  # pipeline micro-batches per grad_accum step
        # samples per device per (pipeline) micro-batch
        self.b = max(plan.micro_batch // max(plan.dp_degree, 1) // self.n_micro, 1)
        self.c = DTYPE_BYTES[tr.precision.compute]
        self.pb = DTYPE_BYTES[tr.precision.params]
        self.gather_bytes = min(self.pb, self.c)  # parameters travel in the compute dtype
        self.zero, self.master_weights, self.slots, self.slot_bytes = precision_setup(spec)
        self.by_name: dict[str, ParamPlan] = {p.name: p for p in plan.params}
        self.buffers: dict[str, ParamPlan] = {p.name: p for p in plan.buffers}
        self._axes_cache: dict[tuple, tuple] = {}
        self._forward: dict[int, float] = {}
        self._sigs: dict[str, list] = {}
        self._blocks: dict[tuple, _Unit] = {}  # (repeat, layouts, in remat) -> one copy's costs

    # -- activation layouts
    def act_axes(self, t: TensorType, dims: Optional[tuple[int, ...]] = None) -> frozenset:
        """Mesh axes (not batch axes) the rules shard activation `t` over (optionally only some dims)."""
        key = (t.axes, dims)
        hit = self._axes_cache.get(key)
        if hit is None:
            out = []
            for i, a in enumerate(t.axes):
                if a is None or (dims is not None and i not in dims):
                    continue
                for m in self.rules.get(a, ()):
                    if self.mesh.sizes.get(m, 1) > 1 and m not in self.batch and m not in out:
                        out.append(m)
            hit = self._axes_cache[key] = frozenset(out)
        return hit

    def deg(self, axes) -> int:
        return math.prod(self.mesh.sizes[a] for a in axes)

    def nbytes(self, t: TensorType, div_axes=frozenset()) -> int:
        """Bytes per device of activation `t` for one micro-batch, sharded over `div_axes` (and the batch)."""
        size = DTYPE_BYTES[t.dtype] if t.is_int else self.c
        return math.ceil(self.b * t.numel / self.deg(div_axes)) * size

    def sorted_axes(self, axes) -> tuple[str, ...]:
        return tuple(a for a in self.mesh.axes if a in axes)

    # -- parameters
    def param_state(self, u: _Unit, pp: ParamPlan, handled: tuple[int, ...], extra_sync=frozenset(),
                    expert_dim: Optional[int] = None) -> frozenset:
        """Adds a parameter's state, gathers and gradient sync to `u`; returns its tensor-parallel axes."""
        n_local = math.prod(pp.local_shape)
        layout = set(a for d in pp.spec for a in d)
        zero_axes = self.sorted_axes(self.batch - layout)
        other_sync = self.sorted_axes(extra_sync - layout - self.batch)  # e.g. norm weights under sequence parallel
        params, grads, master, moments, opt_n = param_state_bytes(
            pp, self.mesh.degree(zero_axes), self.zero, self.master_weights, self.slots, self.slot_bytes)
        pb = DTYPE_BYTES[pp.dtype]
        u.params += params
        u.grads += grads
        u.master += master
        u.moments += moments
        u.largest_shard = max(u.largest_shard, opt_n)
        grad_bytes = n_local * pb
        if zero_axes and self.zero:
            key = ("reduce-scatter", zero_axes, self.zero >= 2)
            u.sync[key] = u.sync.get(key, 0) + grad_bytes
            key = ("all-gather", zero_axes, False)
            u.sync[key] = u.sync.get(key, 0) + n_local * pb
        elif zero_axes or other_sync:
            axes = self.sorted_axes(set(zero_axes) | set(other_sync))
            key = ("all-reduce", axes, False)
            u.sync[key] = u.sync.get(key, 0) + grad_bytes
            other_sync = ()
        if other_sync:
            key = ("all-reduce", other_sync, False)
            u.sync[key] = u.sync.get(key, 0) + grad_bytes
        gather: list[str] = []
        tp: set[str] = set()
        for i, d in enumerate(pp.spec):
            for a in d:
                if i == expert_dim:
                    continue  # expert parallel: the expert stays put
                if a in self.batch or i not in handled:
                    gather.append(a)
                else:
                    tp.add(a)
        gather_axes = self.sorted_axes(gather)
        if gather_axes:
            full = n_local * self.deg(gather_axes)
            u.gathered += full * self.gather_bytes
            u.unsharded_grads += full * self.gather_bytes
            u.gathers[gather_axes] = u.gathers.get(gather_axes, 0) + full * self.gather_bytes
        elif self.pb != self.c:
            u.gathered += n_local * self.c  # the compute-dtype copy
        return frozenset(tp)

    def node_params(self, node: Node, prefix: str, u: _Unit, extra_sync=frozenset(), in_remat=False
                    ) -> dict[str, frozenset]:
        handled = HANDLED_DIMS.get(node.op, {})
        experts = EXPERT_DIMS.get(node.op, {})
        u.regather = 2 if self.opt.regather or in_remat else 1
        out = {}
        for p in node.params:
            pp = self.by_name[f"{prefix}{node.name}.{p.name}"]
            out[p.name] = self.param_state(u, pp, handled.get(p.name, ()), extra_sync, experts.get(p.name))
        for bdef in node.buffers:
            bp = self.buffers.get(f"{prefix}{node.name}.{bdef.name}")
            if bp is not None:
                u.buffers += bp.local_bytes
        return out

    # -- one operator
    def node(self, node: Node, prefix: str, req: dict[str, bool], in_remat: bool) -> _Unit:
        u = _Unit(saved={})
        op = node.op
        ins = node.in_types
        x = ins[0]
        out = node.out
        in_axes = self.act_axes(x)
        out_axes = self.act_axes(out)
        needs_dx = any(req.get(i, False) for i in node.inputs)
        b, c = self.b, self.c
        extra_sync = in_axes if op in ("layer_norm", "rms_norm", "batch_norm") else frozenset()
        tp = self.node_params(node, prefix, u, extra_sync, in_remat)
        div_axes = set(in_axes) | set(out_axes)

        def save(key, nbytes, scores=False):
            u.saved.setdefault(key, (op, nbytes, scores))

        def save_input(i=0):
            t = ins[i]
            save(("t", prefix, node.inputs[i]), self.nbytes(t, self.act_axes(t)))

        if op in ("attention", "mlp"):
            first = "q.weight" if op == "attention" else ("gate.weight" if "gate.weight" in tp else "fc.weight")
            T = tp.get(first, frozenset())
            div_axes |= T
            t = self.deg(T)
            save_input()
            seq = x.shape[0] if len(x.shape) >= 2 else 1
            if op == "attention":
                a = node.attrs
                Tkv = tp.get("k.weight", frozenset())
                q = b * seq * a["heads"] * a["head_dim"] // t
                kv = b * seq * a["kv_heads"] * a["head_dim"] // self.deg(Tkv)
                probs = b * a["heads"] * seq * seq // t
                save((node.name, prefix, "q"), q * c)
                save((node.name, prefix, "k"), kv * c)
                save((node.name, prefix, "v"), kv * c)
                save((node.name, prefix, "probs"), probs * c, scores=True)
                if a.get("dropout", 0):
                    save((node.name, prefix, "dropout_mask"), probs * MASK_BYTES, scores=True)
                    save((node.name, prefix, "dropout_out"), probs * c, scores=True)
                save((node.name, prefix, "o_in"), q * c)
                u.score_flops = 2 * 2 * seq * seq * a["heads"] * a["head_dim"] * b / t
            else:
                h = node.attrs["hidden"]
                hid = b * (x.numel // x.shape[-1]) * h // t
                n_hidden = 3 if node.attrs["activation"] == "swiglu" else 2
                for j in range(n_hidden):
                    save((node.name, prefix, f"hidden{j}"), hid * c)
            if T:
                # separate input projections (q, k, v; fc or gate and up) each reduce their input gradient
                n_in = 3 if op == "attention" else (2 if node.attrs["activation"] == "swiglu" else 1)
                self.tp_pair(u, T, x, out, in_axes, out_axes, needs_dx, in_remat, op, n_in)
        elif op == "moe":
            a = node.attrs
            tokens = b * (x.numel // x.shape[-1])
            pp = self.by_name[f"{prefix}{node.name}.experts.fc.weight"]
            ep = self.sorted_axes(pp.spec[0])
            T = tp.get("experts.fc.weight", frozenset())
            div_axes |= T
            slots = math.ceil(a["capacity_factor"] * tokens * a["top_k"])  # token slots computed per device
            save_input()
            save((node.name, prefix, "router"), tokens * a["experts"] * 4)
            save((node.name, prefix, "dispatched"), slots * a["dim"] * c)
            save((node.name, prefix, "hidden0"), slots * a["hidden"] // self.deg(T) * c)
            save((node.name, prefix, "hidden1"), slots * a["hidden"] // self.deg(T) * c)
            save((node.name, prefix, "combined"), slots * a["dim"] * c)
            if ep:
                payload = slots * a["dim"] * c
                for ph in ["forward"] + (["recompute"] if in_remat else []):
                    u.add_coll("all-to-all", ep, ph, "expert parallel (moe dispatch and combine)", payload, True, 2)
                u.add_coll("all-to-all", ep, "backward", "expert parallel (moe dispatch and combine)", payload, True,
                           2)
            if T:
                self.tp_pair(u, T, x, out, in_axes, out_axes, needs_dx, in_remat, op, 1)
        elif op == "linear" or op == "conv2d":
            if op == "linear" and node.attrs.get("tie"):
                table = self.by_name[node.attrs["tie"]]
                T_out = frozenset(a for a in table.spec[0] if a not in self.batch)
                T_in = frozenset(a for a in table.spec[1] if a not in self.batch)
            else:
                w = tp.get("weight", frozenset())
                pp = self.by_name[f"{prefix}{node.name}.weight"]
                fin, fout = (0, 1) if op == "linear" else (1, 0)
                T_in = frozenset(a for a in pp.spec[fin] if a in w)
                T_out = frozenset(a for a in pp.spec[fout] if a in w)
            div_axes |= T_in | T_out
            feat = len(x.shape) - 1 if op == "linear" else 0
            in_feat = self.act_axes(x, (feat,))
            out_feat = self.act_axes(out, (len(out.shape) - 1 if op == "linear" else 0,))
            save(("t", prefix, node.inputs[0]), self.nbytes(x, in_axes | T_in))
            self.tp_linear(u, T_in, T_out, x, out, in_axes, out_axes, in_feat, out_feat, needs_dx, in_remat, op)
        elif op == "embedding":
            save_input()
            pp = self.by_name[f"{prefix}{node.name}.weight"]
            w = tp.get("weight", frozenset())
            T_v = frozenset(a for a in pp.spec[0] if a in w)
            T_e = frozenset(a for a in pp.spec[1] if a in w)
            if T_v:
                self.reduce_out(u, T_v, out, out_axes, "tensor-parallel all-reduce (embedding output)", in_remat)
            missing = T_e - self.act_axes(out, (len(out.shape) - 1,))
            if missing:
                u.add_coll("all-gather", self.sorted_axes(missing), "forward", "all-gather (embedding output)",
                           self.nbytes(out, out_axes - missing), True)
        elif op in ("layer_norm", "rms_norm", "batch_norm", "gelu", "silu", "tanh", "sigmoid", "relu", "mul",
                    "max_pool2d"):
            for i in range(len(ins)):
                save_input(i)
            if op == "batch_norm" and self.batch:
                stats = 2 * node.attrs["channels"] * 4
                ax = self.sorted_axes(self.batch)
                u.add_coll("all-reduce", ax, "forward", "batch-norm statistics", stats, True)
                u.add_coll("all-reduce", ax, "backward", "batch-norm statistics", stats, True)
        elif op == "softmax":
            save((node.name, prefix, "out"), self.nbytes(out, out_axes))
        elif op == "dropout":
            save((node.name, prefix, "mask"), math.ceil(self.b * out.numel / self.deg(out_axes)) * MASK_BYTES)
        # add, pos_embedding, reshape, flatten, avg_pool2d: nothing saved

        div = self.deg(div_axes)
        u.flops += node.flops * b / div
        u.grad_flow = self.nbytes(out, out_axes) + sum(self.nbytes(t, self.act_axes(t)) for t in ins if not t.is_int)
        return u

    def tp_pair(self, u, T, x, out, in_axes, out_axes, needs_dx, in_remat, op, n_in) -> None:
        """Megatron: a column-parallel projection in, a row-parallel projection out."""
        ax = self.sorted_axes(T)
        what = f"tensor-parallel ({op})"
        p_in = self.nbytes(x, in_axes - T)
        p_out = self.nbytes(out, out_axes - T)
        phases = ["forward"] + (["recompute"] if in_remat else [])
        if in_axes & T:  # sequence parallel: the input arrives sharded over the sequence
            for ph in phases:
                u.add_coll("all-gather", ax, ph, what + " input all-gather", p_in, True)
                u.add_coll("reduce-scatter", ax, ph, what + " output reduce-scatter", p_out, True)
            u.add_coll("all-gather", ax, "backward", what + " output-gradient all-gather", p_out, True)
            if needs_dx:
                u.add_coll("reduce-scatter", ax, "backward", what + " input-gradient reduce-scatter", p_in, True, n_in)
        else:
            for ph in phases:
                u.add_coll("all-reduce", ax, ph, what + " output all-reduce", p_out, True)
            if needs_dx:
                u.add_coll("all-reduce", ax, "backward", what + " input-gradient all-reduce", p_in, True, n_in)

    def reduce_out(self, u, T, out, out_axes, what, in_remat) -> None:
        ax = self.sorted_axes(T)
        phases = ["forward"] + (["recompute"] if in_remat else [])
        for ph in phases:
            if out_axes & T:
                u.add_coll("reduce-scatter", ax, ph, what.replace("all-reduce", "reduce-scatter"),
                           self.nbytes(out, out_axes - T), True)
            else:
                u.add_coll("all-reduce", ax, ph, what, self.nbytes(out, out_axes - T), True)

    def tp_linear(self, u, T_in, T_out, x, out, in_axes, out_axes, in_feat, out_feat, needs_dx, in_remat, op):
        phases = ["forward"] + (["recompute"] if in_remat else [])
        if T_in:  # row parallel: partial sums
            self.reduce_out(u, T_in, out, out_axes, f"tensor-parallel all-reduce ({op} output)", in_remat)
        if T_out:  # column parallel: the input's gradient is a partial sum
            ax = self.sorted_axes(T_out)
            sp = (in_axes - in_feat) & T_out
            if sp:
                for ph in phases:
                    u.add_coll("all-gather", ax, ph, f"tensor-parallel ({op} input all-gather)",
                               self.nbytes(x, in_axes - T_out), True)
            if needs_dx:
                kind = "reduce-scatter" if sp else "all-reduce"
                u.add_coll(kind, ax, "backward", f"tensor-parallel ({op} input-gradient {kind})",
                           self.nbytes(x, in_axes - T_out), True)
            missing = T_out - out_feat
            if missing:
                for ph in phases:
                    u.add_coll("all-gather", self.sorted_axes(missing), ph, f"all-gather ({op} output)",
                               self.nbytes(out, out_axes - missing), True)
        extra = in_feat - T_in
        if extra:
            for ph in phases:
                u.add_coll("all-gather", self.sorted_axes(extra), ph, f"all-gather ({op} input features)",
                           self.nbytes(x, in_axes - extra), True)

    # -- scopes
    def block(self, rep: RepeatNode, prefix: str, in_req: bool, in_remat: bool) -> _Unit:
        u = _Unit(saved={})
        req = {"block_input": in_req}
        for n in rep.layers:
            nu = self.node(n, prefix, req, in_remat)
            req[n.name] = bool(n.params) or any(req.get(i, False) for i in n.inputs) or bool(n.attrs.get("tie"))
            u.merge(nu)
        u.regather = 2 if self.opt.regather or in_remat else 1
        return u.flush_gathers()

    # -- pipeline stages
    def stage_of(self, name: str, copy: Optional[int] = None) -> int:
        pl = self.plan.pipeline
        if pl is None:
            return 0
        if copy is not None:
            spans = pl.repeat_split.get(name)
            if spans and len(spans) > 1:
                for s, (a, b) in enumerate(spans):
                    if a <= copy < b:
                        return s
        return pl.layer_stage.get(name, 0)

    def in_flight(self, rank: int) -> float:
        """Micro-batches whose activations a pipe rank holds at its peak."""
        pl = self.plan.pipeline
        if pl is None or self.pipe <= 1:
            return 1.0
        m, p = pl.microbatches, self.pipe
        if pl.schedule == "gpipe":
            return float(m)
        n = float(min(m, p - rank))
        if pl.schedule == "interleaved" and pl.virtual > 1:
            n *= 1 + (p - 1) / (p * pl.virtual)  # Narayanan et al. 2021, the interleaved 1F1B warm-up
        return n

    def sigs(self, node: RepeatNode, in_req: bool) -> list[tuple]:
        """Per copy of a repeated block: what its costs depend on (its parameters' layouts)."""
        hit = self._sigs.get(node.name)
        if hit is None:
            names = [f"{n.name}.{p.name}" for n in node.layers for p in n.params]
            by_name = self.by_name
            hit = self._sigs[node.name] = [
                (in_req if i == 0 else True,) + tuple(by_name[f"{node.name}.{i}.{k}"].spec for k in names)
                for i in range(node.count)]
        return hit

    def run(self, remat: Optional[str] = None) -> Costs:
        plan, tr = self.plan, self.plan.spec.training
        remat = remat or self.opt.remat or tr.remat
        self._forward = {}
        steps = tr.grad_accum * self.n_micro  # micro-batches per optimizer step, on every device
        graph = plan.graph
        pipe = self.pipe
        req: dict[str, bool] = {i.name: False for i in graph.inputs}
        ranks = [_Rank() for _ in range(pipe)]
        last_stage: dict[int, tuple] = {}  # stage -> (output type) of its last unit, for point-to-point sends
        for node in graph.layers:
            if isinstance(node, RepeatNode):
                in_req = any(req.get(i, False) for i in node.inputs)
                in_remat = remat == "full"
                sigs = self.sigs(node, in_req)
                x = node.in_types[0]
                ckpt = self.nbytes(x, self.act_axes(x))
                per_rank: dict[int, list] = {}
                groups: dict[tuple, int] = {}  # (stage, signature index) -> copies
                first: dict[tuple, int] = {}
                for i in range(node.count):
                    stage = self.stage_of(node.name, i)
                    g = (stage, sigs[i])
                    groups[g] = groups.get(g, 0) + 1
                    first.setdefault(g, i)
                    span = per_rank.setdefault(stage % pipe, [i, i, None])
                    span[1] = i
                    last_stage[stage] = node.out
                for (stage, sig), k in groups.items():
                    rk = ranks[stage % pipe]
                    key = (node.name, sig, in_remat)
                    bu = self._blocks.get(key)
                    if bu is None:
                        prefix = f"{node.name}.{first[(stage, sig)]}."
                        bu = self._blocks[key] = self.block(node, prefix, sig[0], in_remat)
                    rk.total.merge(bu, k, saved=False)
                    rk.unit_gather = max(rk.unit_gather, bu.gathered)
                    bu.by_op(rk.by_op, k)
                    saved_b = bu.saved_bytes
                    rk.block_saved += saved_b * k
                    rk.block_scores += bu.score_bytes * k
                    rk.checkpoints += ckpt * k
                    rk.working = max(rk.working, saved_b)
                    rk.recompute += k * (bu.flops if remat == "full" else bu.score_flops if remat == "selective"
                                         else 0.0)
                    span = per_rank[stage % pipe]
                    if span[2] is None or saved_b > span[2].saved_bytes:
                        span[2] = bu
                for r, (a, b_, biggest) in sorted(per_rank.items()):
                    ranks[r].blocks.append(BlockActivations(
                        node.name, b_ - a + 1, biggest.saved_bytes, biggest.score_bytes, ckpt))
                    ranks[r].layers.append(f"{node.name}[{a}:{b_ + 1}]" if pipe > 1 else node.name)
                req[node.name] = True
            else:
                stage = self.stage_of(node.name)
                rk = ranks[stage % pipe]
                nu = self.node(node, "", req, False).flush_gathers()
                req[node.name] = bool(node.params) or any(req.get(i, False) for i in node.inputs) or bool(
                    node.attrs.get("tie"))
                rk.top.merge(nu)
                rk.total.merge(nu, saved=False)
                rk.unit_gather = max(rk.unit_gather, nu.gathered)
                rk.layers.append(node.name)
                if remat != "none":
                    rk.recompute += nu.score_flops
                last_stage[stage] = node.out
        last = ranks[self.stage_of(graph.layers[-1].name, getattr(graph.layers[-1], "count", 1) - 1) % pipe]
        self.loss(last.top, last.total)
        if pipe > 1:
            self.sends(ranks, last_stage)

        notes: list[str] = []
        if remat != "none" and not any(rk.blocks for rk in ranks):
            notes.append("remat applies to repeated blocks; this model has none" +
                         (" (selective remat still drops attention scores)" if remat == "selective" else ""))
        stages = []
        for r, rk in enumerate(ranks):
            stages.append(self.stage(r, rk, remat, steps))
        busiest = max(stages, key=lambda st: st.flops_per_device)
        return Costs(remat, self.zero, steps, self.b, tuple(stages), busiest.collectives,
                     self.flops(busiest, remat), None, None, tuple(notes))

    def stage(self, r: int, rk: "_Rank", remat: str, steps: int) -> StageCosts:
        top, total = rk.top, rk.total
        rk.top.by_op(rk.by_op)
        top_saved, top_scores = top.saved_bytes, top.score_bytes
        if remat == "none":
            saved, rec = top_saved + rk.block_saved, 0
        elif remat == "selective":
            saved, rec = top_saved - top_scores + rk.block_saved - rk.block_scores, 0
        else:
            saved, rec = top_saved - top_scores + rk.checkpoints, rk.working
        flight = self.in_flight(r)
        by_op = {k: math.ceil(v * flight) for k, v in rk.by_op.items()}
        acts = Activations(remat, math.ceil(saved * flight), rec, by_op, tuple(rk.blocks))
        if self.opt.regather:
            gathered = min(total.gathered, 2 * rk.unit_gather)  # this layer's and the next one's (prefetch)
            unsharded = min(total.unsharded_grads, 2 * rk.unit_gather * self.pb // self.gather_bytes)
        else:
            gathered, unsharded = total.gathered, total.unsharded_grads
        temps = Temporaries(gradient_flow=total.grad_flow, loss=top.loss, gathered_params=gathered,
                            unsharded_grads=unsharded, optimizer=2 * total.largest_shard * 4)
        states = StateMemory(total.params, total.grads, total.master, total.moments, total.buffers)
        colls = self.collectives(total, steps)
        per_fwd = total.flops * steps
        self._forward[r] = per_fwd
        flops = 3 * per_fwd + rk.recompute * steps
        return StageCosts(r, tuple(rk.layers), self.mesh.devices // self.pipe, states, acts, temps, flight, colls,
                          flops)

    def sends(self, ranks: list["_Rank"], last_stage: dict[int, Any]) -> None:
        """Pipeline point-to-point: each stage sends its output forward and receives its gradient back."""
        n_stages = max(last_stage) + 1
        for s in range(n_stages - 1):
            t = last_stage.get(s)
            if t is None:
                continue
            nbytes = self.nbytes(t, self.act_axes(t))
            ranks[s % self.pipe].total.add_coll("send/recv", ("pipe",), "forward",
                                                "pipeline activation to the next stage", nbytes, True)
            ranks[(s + 1) % self.pipe].total.add_coll("send/recv", ("pipe",), "backward",
                                                      "pipeline gradient to the previous stage", nbytes, True)

    def loss(self, top: _Unit, total: _Unit) -> None:
        graph = self.plan.graph
        loss = graph.loss
        env = {i.name: i.type for i in graph.inputs}
        for n in graph.layers:
            env[n.name] = n.out
        pred = env[loss.prediction]
        axes = self.act_axes(pred)
        u = _Unit(saved={})
        if loss.op == "cross_entropy":
            elems = math.ceil(self.b * pred.numel / self.deg(axes))
            u.saved[("loss", "", "softmax")] = ("cross_entropy", elems * 4, False)
            u.loss = elems * (4 + self.c)
            cls = self.act_axes(pred, (len(pred.shape) - 1,))
            if cls:
                tokens = math.ceil(self.b * (pred.numel // pred.shape[-1]) / self.deg(axes - cls))
                u.add_coll("all-reduce", self.sorted_axes(cls), "forward",
                           "vocab-parallel cross-entropy (max, target logit, sum)", tokens * 4, True, 3)
        else:
            nb = self.nbytes(pred, axes)
            u.saved[("loss", "", "diff")] = ("mse", nb, False)
            u.loss = 2 * nb
        if self.batch:
            u.add_coll("all-reduce", self.sorted_axes(self.batch), "forward", "loss mean over the batch", 4, True)
        top.merge(u)
        total.merge(u, saved=False)

    def collectives(self, total: _Unit, steps: int) -> tuple[Collective, ...]:
        out = []
        for (kind, axes, phase, what, nbytes, blocking), count in total.colls.items():
            group = 2 if kind == "send/recv" else self.deg(axes)
            out.append(Collective(kind, axes, group, phase, what, nbytes, count * steps, blocking))
        for (kind, axes, per_micro), nbytes in total.sync.items():
            if kind == "all-gather":
                what, phase = "updated-parameter all-gather (ZeRO)", "step"
            elif kind == "reduce-scatter":
                what, phase = "gradient reduce-scatter (ZeRO)", "backward" if per_micro else "step"
            else:
                what, phase = "gradient all-reduce (data parallel)", "step"
            out.append(Collective(kind, axes, self.deg(axes), phase, what, nbytes, steps if per_micro else 1, False))
        tr = self.plan.spec.training
        if tr.clip_grad_norm:
            shard_axes = self.sorted_axes({a for p in self.plan.params for d in p.spec for a in d} |
                                          ({"pipe"} if self.pipe > 1 else set()))
            if shard_axes:
                out.append(Collective("all-reduce", shard_axes, self.deg(shard_axes), "step",
                                      "gradient norm (clipping)", 4, 1, True))
        order = {"forward": 0, "recompute": 1, "backward": 2, "step": 3}
        out.sort(key=lambda c: (order[c.phase], c.blocking is False, -c.total_bytes, c.what))
        return tuple(out)

    def flops(self, busiest: StageCosts, remat: str) -> Flops:
        graph = self.plan.graph
        batch = self.plan.spec.training.batch_size
        fwd = float(graph.flops_per_sample) * batch
        rec = 0.0  # per sample
        for n in graph.layers:
            if isinstance(n, RepeatNode):
                if remat == "full":
                    rec += n.flops
                elif remat == "selective":
                    rec += n.count * sum(_score_flops(x) for x in n.layers)
            elif remat != "none":
                rec += _score_flops(n)
        # per device: the busiest pipe rank; its forward is a third of forward + backward
        per_rec = busiest.flops_per_device - 3 * self._rank_forward(busiest)
        per_fwd = self._rank_forward(busiest)
        return Flops(fwd, 2 * fwd, rec * batch, per_fwd, 2 * per_fwd, per_rec)

    def _rank_forward(self, st: StageCosts) -> float:
        return self._forward.get(st.stage, 0.0)


@dataclasses.dataclass
class _Rank:
    """Accumulates one pipe rank's costs."""

    top: _Unit = dataclasses.field(default_factory=lambda: _Unit(saved={}))  # top-level layers (saved tensors)
    total: _Unit = dataclasses.field(default_factory=lambda: _Unit(saved={}))  # all, blocks multiplied out
    by_op: dict = dataclasses.field(default_factory=dict)
    blocks: list = dataclasses.field(default_factory=list)
    layers: list = dataclasses.field(default_factory=list)
    recompute: float = 0.0  # forward FLOPs recomputed per device per micro-batch
    working: int = 0
    checkpoints: int = 0
    block_saved: int = 0
    block_scores: int = 0
    unit_gather: int = 0


def _score_flops(n) -> float:
    """Forward FLOPs per sample of attention's q @ k^T and p @ v (what selective remat recomputes)."""
    if not isinstance(n, Node) or n.op != "attention":
        return 0.0
    a = n.attrs
    return 2 * 2 * a["seq"] * a["seq"] * a["heads"] * a["head_dim"]


def _rules(spec) -> dict[str, tuple[str, ...]]:
    raw = spec.sharding.rules
    items = raw.items() if isinstance(raw, dict) else [(k, v) for k, v in raw]
    out: dict[str, tuple[str, ...]] = {}
    for logical, value in items:
        axes = (value,) if isinstance(value, str) else tuple(value or ())
        out.setdefault(logical, axes)
    return out


# ---------------------------------------------------------------- step time


def _comm(colls, plan: Plan, hw: Hardware) -> tuple[list[float], list[str], float, float]:
    times, links = [], []
    blocking = overlapped = 0.0
    for c in colls:
        bw, lat, name = link(plan.mesh, c.axes, hw)
        t = c.count * ring_time(c.kind, c.bytes, c.group, bw, lat)
        times.append(t)
        links.append(name)
        if c.blocking:
            blocking += t
        else:
            overlapped += t
    return times, links, blocking, overlapped


def step_time(costs: Costs, plan: Plan, hw: Hardware, options: CostOptions) -> StepTime:
    """Per pipe rank: compute + blocking communication + the data-parallel communication compute does not
    hide; the slowest rank sets the pace, stretched by the pipeline bubble; then the optimizer update."""
    tr = plan.spec.training
    eff = options.efficiency or hw.efficiency
    peak = hw.peak_flops(tr.precision.compute)
    worst = None
    for st in costs.stages:
        compute = st.flops_per_device / (peak * eff)
        _, _, blocking, overlapped = _comm(st.collectives, plan, hw)
        exposed = max(0.0, overlapped - compute) if options.overlap else overlapped
        busy = compute + blocking + exposed
        if worst is None or busy > worst[0]:
            worst = (busy, compute, blocking, overlapped, exposed)
    assert worst is not None
    busy, compute, blocking, overlapped, exposed = worst
    times, links, _, _ = _comm(costs.collectives, plan, hw)
    st = costs.worst.states
    optimizer = (st.params + st.grads + 2 * st.optimizer + st.params) / hw.hbm_bytes_per_s
    pl = plan.pipeline
    bubble = pipeline_bubble(plan.mesh.sizes.get("pipe", 1), pl.microbatches, pl.virtual) if pl else 0.0
    step = busy / (1 - bubble) + optimizer
    devices = plan.mesh.devices
    mfu = costs.flops.model / (step * devices * peak) if step > 0 else 0.0
    hfu = (costs.flops.model + costs.flops.recompute) / (step * devices * peak) if step > 0 else 0.0
    tokens = None
    for i in plan.graph.inputs:
        if i.type.is_int and len(i.type.shape) == 1:
            tokens = tr.batch_size * i.type.shape[0] / step
            break
    return StepTime(hw.name, peak, eff, compute, blocking, overlapped, exposed, optimizer, bubble, step, mfu, hfu,
                    tr.batch_size / step, tokens, tuple(times), tuple(links))


def estimate(plan: Plan, hardware: Optional[Hardware] = None, options: Optional[CostOptions] = None) -> Costs:
    options = options or CostOptions()
    if options.remat is not None and options.remat not in REMAT_MODES:
        raise ValueError(f"remat must be one of {REMAT_MODES}")
    costs = _Walk(plan, options).run()
    if hardware is not None:
        costs = dataclasses.replace(costs, hardware=hardware, time=step_time(costs, plan, hardware, options))
    return costs


def estimate_remats(plan: Plan, hardware: Optional[Hardware] = None, remats: tuple[str, ...] = REMAT_MODES,
                    options: Optional[CostOptions] = None) -> dict[str, Costs]:
    """`estimate` under several remat settings, sharing the walk (what `plan --auto` needs)."""
    options = options or CostOptions()
    walk = _Walk(plan, options)
    out = {}
    for r in remats:
        costs = walk.run(r)
        if hardware is not None:
            opts = dataclasses.replace(options, remat=r)
            costs = dataclasses.replace(costs, hardware=hardware, time=step_time(costs, plan, hardware, opts))
        out[r] = costs
    return out


# ---------------------------------------------------------------- JSON


def _coll_json(c: Collective) -> dict[str, Any]:
    return {"kind": c.kind, "axes": list(c.axes), "group": c.group, "phase": c.phase, "what": c.what,
            "bytes": c.bytes, "count": c.count, "total_bytes": c.total_bytes, "wire_bytes": round(c.wire_bytes),
            "blocking": c.blocking}


def costs_to_json(costs: Costs) -> dict[str, Any]:
    """The "costs" object of `plan --format json` (every key documented in docs/cost-model.md)."""

    def stage(s: StageCosts) -> dict:
        st, a, t = s.states, s.activations, s.temporaries
        return {
            "stage": s.stage,
            "layers": list(s.layers),
            "devices": s.devices,
            "states": {"params": st.params, "grads": st.grads, "optimizer": st.optimizer, "master": st.master,
                       "moments": st.moments, "buffers": st.buffers, "total": st.total},
            "activations": {
                "remat": a.remat, "saved": a.saved, "recompute": a.recompute, "total": a.total,
                "by_op": dict(sorted(a.by_op.items())),
                "blocks": [{"name": bl.name, "count": bl.count, "per_copy": bl.per_copy, "scores": bl.scores,
                            "checkpoint": bl.checkpoint} for bl in a.blocks],
            },
            "temporaries": {"gradient_flow": t.gradient_flow, "loss": t.loss, "gathered_params": t.gathered_params,
                            "unsharded_grads": t.unsharded_grads, "optimizer": t.optimizer, "total": t.total},
            "in_flight": s.in_flight,
            "flops_per_device": s.flops_per_device,
            "collectives": [_coll_json(c) for c in s.collectives],
            "peak": s.peak,
        }

    out: dict[str, Any] = {
        "remat": costs.remat,
        "zero": costs.zero,
        "micro_batches": costs.micro_batches,
        "local_batch": costs.local_batch,
        "peak_bytes": costs.peak,
        "stages": [stage(s) for s in costs.stages],
        "collectives": [_coll_json(c) for c in costs.collectives],
        "comm_bytes": sum(c.total_bytes for c in costs.collectives),
        "flops": {
            "forward": costs.flops.forward, "backward": costs.flops.backward, "recompute": costs.flops.recompute,
            "model": costs.flops.model, "per_device": {
                "forward": costs.flops.per_device_forward, "backward": costs.flops.per_device_backward,
                "recompute": costs.flops.per_device_recompute, "total": costs.flops.per_device_total},
        },
        "hardware": costs.hardware.to_json() if costs.hardware else None,
        "fits": costs.fits,
        "capacity_bytes": costs.capacity,
        "time": None,
        "notes": list(costs.notes),
    }
    t = costs.time
    if t is not None:
        out["time"] = {
            "peak_flops": t.peak_flops, "efficiency": t.efficiency, "compute_s": t.compute_s,
            "blocking_comm_s": t.blocking_comm_s, "overlapped_comm_s": t.overlapped_comm_s,
            "exposed_comm_s": t.exposed_comm_s, "optimizer_s": t.optimizer_s, "bubble": t.bubble,
            "step_s": t.step_s, "mfu": t.mfu, "hfu": t.hfu, "samples_per_s": t.samples_per_s,
            "tokens_per_s": t.tokens_per_s,
            "collective_s": list(t.collective_s), "links": list(t.links),
        }
    return out
