"""The model walk: one pass over the resolved graph (a repeated block once per distinct layout of its
copies) that adds up, per pipe rank, the training state, what each operator saves for the backward pass,
the collectives, and the FLOPs. Operators describe their own costs (`Op.costs`) through `LayerCosts`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from ...graph import Node, RepeatNode
from ...ops import LOSSES, OPS, TensorType
from ..plan import ParamPlan, Plan
from ..sizes import DTYPE_BYTES
from ..states import param_state_bytes, precision_setup
from ...axes import CONTEXT
from .collectives import Collective
from .compression import gradient_bytes, label
from .offload import offloadable
from .results import Activations, BlockActivations, CostOptions, Costs, Flops, StageCosts, StateMemory, Temporaries

MASK_BYTES = 1  # a dropout mask element (bool)


@dataclasses.dataclass
class _Unit:
    """Costs of one top-level layer or one copy of a repeated block, per device, per micro-batch."""

    saved: dict  # key -> (op, bytes, is attention score); a tensor saved by two operators counts once
    elems: dict = dataclasses.field(default_factory=dict)  # key of `saved` -> elements (the offload threshold)
    flops: float = 0.0  # forward
    score_flops: float = 0.0  # what selective remat recomputes
    float8_flops: float = 0.0  # forward, of the linear layers that run in FP8 (precision.float8)
    float8_casts: int = 0  # bytes: the FP8 copies of the largest FP8 layer's operands (precision.float8)
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
    scatters: dict = dataclasses.field(default_factory=dict)  # fsdp axes -> compressed gradient bytes per use
    regather: int = 2  # parameter all-gathers per micro-batch (forward, and again for the backward)

    def flush_gathers(self, compression: str = "") -> "_Unit":
        """One all-gather (and reduce-scatter) per layer or block copy and mesh axes, as FSDP wraps them; the
        reduce-scatters of compressed gradients (`scatters`) send their compressed bytes."""
        for axes, nbytes in self.gathers.items():
            self.add_coll("all-gather", axes, "forward", "parameter all-gather (fsdp)", nbytes, False)
            if self.regather > 1:
                self.add_coll("all-gather", axes, "backward", "parameter all-gather (fsdp)", nbytes, False,
                              self.regather - 1)
            what = "gradient reduce-scatter (fsdp)" + (f", {compression}" if axes in self.scatters else "")
            self.add_coll("reduce-scatter", axes, "backward", what, self.scatters.get(axes, nbytes), False)
        self.gathers, self.scatters = {}, {}
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
            for key, v in other.elems.items():
                self.elems.setdefault(key, v)
        for key, v in other.colls.items():
            self.colls[key] = self.colls.get(key, 0) + v * k
        for key, v in other.sync.items():
            self.sync[key] = self.sync.get(key, 0) + v * k
        for key, v in other.gathers.items():
            self.gathers[key] = self.gathers.get(key, 0) + v * k
        for key, v in other.scatters.items():
            self.scatters[key] = self.scatters.get(key, 0) + v * k
        self.flops += other.flops * k
        self.score_flops += other.score_flops * k
        self.float8_flops += other.float8_flops * k
        self.float8_casts = max(self.float8_casts, other.float8_casts)
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


class Walk:
    def __init__(self, plan: Plan, options: CostOptions):
        self.plan = plan
        self.opt = options
        spec = plan.spec
        tr = spec.training
        self.mesh = plan.mesh
        self.batch = frozenset(plan.batch_axes)
        # context parallelism: parameters whole over `context`, their gradients reduced over it like a batch's
        self.context = frozenset({CONTEXT}) if plan.mesh.size(CONTEXT) > 1 else frozenset()
        pl = plan.pipeline
        self.pipe = plan.mesh.pipe
        self.n_micro = pl.microbatches if pl is not None else 1  # pipeline micro-batches per grad_accum step
        # samples per device per (pipeline) micro-batch
        self.b = max(plan.micro_batch // max(plan.dp_degree, 1) // self.n_micro, 1)
        self.c = DTYPE_BYTES[tr.precision.compute]
        self.pb = DTYPE_BYTES[tr.precision.params]
        self.gather_bytes = min(self.pb, self.c)  # parameters travel in the compute dtype
        self.float8 = tr.precision.float8  # the linear layers' matmuls in FP8 (torchao.float8)
        self.zero, self.master_weights, self.slots, self.slot_bytes = precision_setup(spec)
        self.comm = spec.communication  # gradient compression: the batch axes' gradient reductions send less
        self.compression = "" if self.comm.compression_name == "none" else label(self.comm)
        self.by_name: dict[str, ParamPlan] = {p.name: p for p in plan.params}
        self.buffers: dict[str, ParamPlan] = {p.name: p for p in plan.buffers}
        self._axes_cache: dict[tuple, tuple] = {}
        self._forward: dict[int, float] = {}
        self._sigs: dict[str, list] = {}
        self._blocks: dict[tuple, _Unit] = {}  # (repeat, layouts, in remat) -> one copy's costs
        self.held = self._held_states()

    def _held_states(self) -> Optional[StateMemory]:
        """The training state per device of the target program that holds more than the planner's stage split
        (Plan.states_for), the largest over the targets costed (`CostOptions.target`, or the spec's); None when
        none does."""
        targets = (self.opt.target,) if self.opt.target else tuple(self.plan.spec.targets)
        held = [st for st in map(self.plan.states_for, targets) if st is not None]
        return max(held, key=lambda st: st.total, default=None)

    # -- activation layouts
    def act_axes(self, t: TensorType, dims: Optional[tuple[int, ...]] = None) -> frozenset:
        """Mesh axes (not batch axes) activation `t` is split over (optionally only some dims): the plan's
        activation layout."""
        key = (t.shape, t.axes, dims)
        hit = self._axes_cache.get(key)
        if hit is None:
            layout = self.plan.activation_layout(t)
            hit = self._axes_cache[key] = frozenset(
                a for i, d in enumerate(layout) if dims is None or i in dims for a in d)
        return hit

    def deg(self, axes) -> int:
        return math.prod(self.mesh.size(a) for a in axes)

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
        # e.g. norm weights under sequence parallel; every parameter's gradient over `context`
        other_sync = self.sorted_axes((extra_sync | self.context) - layout - self.batch)
        params, grads, master, moments, opt_n = param_state_bytes(
            pp, self.mesh.degree(zero_axes), self.zero, self.master_weights, self.slots, self.slot_bytes)
        pb = DTYPE_BYTES[pp.dtype]
        u.params += params
        u.grads += grads
        u.master += master
        u.moments += moments
        u.largest_shard = max(u.largest_shard, opt_n)
        grad_bytes = n_local * pb
        sent = gradient_bytes(self.comm, tuple(pp.local_shape), pb)  # (compressed) over the batch axes alone
        if zero_axes and self.zero and opt_n < n_local:  # (a state no dimension splits stays whole: all-reduce)
            key = ("reduce-scatter", zero_axes, self.zero >= 2)
            u.sync[key] = u.sync.get(key, 0) + sent
            key = ("all-gather", zero_axes, False)
            u.sync[key] = u.sync.get(key, 0) + n_local * pb
        elif zero_axes or other_sync:
            axes = self.sorted_axes(set(zero_axes) | set(other_sync))
            key = ("all-reduce", axes, False)
            u.sync[key] = u.sync.get(key, 0) + (grad_bytes if other_sync else sent)
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
            if self.compression and set(gather_axes) <= self.batch:  # FSDP2 reduces in the compression dtype
                full_shape = (full // max(math.prod(pp.local_shape[1:]), 1),) + tuple(pp.local_shape[1:])
                u.scatters[gather_axes] = u.scatters.get(gather_axes, 0) + gradient_bytes(
                    self.comm, full_shape, self.gather_bytes)
        elif self.pb != self.c:
            u.gathered += n_local * self.c  # the compute-dtype copy
        return frozenset(tp)

    def node_params(self, node: Node, prefix: str, u: _Unit, extra_sync=frozenset(), in_remat=False
                    ) -> dict[str, frozenset]:
        op = OPS[node.op]
        handled, experts = op.handled_dims, op.expert_dims
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
        """One layer's costs: its parameters' state and gathers here, the rest from its operator."""
        u = _Unit(saved={})
        op = OPS[node.op]
        extra_sync = self.act_axes(node.in_types[0]) if op.normalizes else frozenset()
        tp = self.node_params(node, prefix, u, extra_sync, in_remat)
        needs_dx = any(req.get(i, False) for i in node.inputs)
        c = LayerCosts(self, node, prefix, u, tp, needs_dx, in_remat)
        op.costs(c)
        u.flops += c.flops * self.b / self.deg(c.div_axes)
        if self.float8:
            self.float8_layer(node, u, self.deg(c.div_axes))
        u.grad_flow = self.nbytes(node.out, c.out_axes) + sum(
            self.nbytes(t, self.act_axes(t)) for t in node.in_types if not t.is_int)
        return u

    def float8_layer(self, node: Node, u: _Unit, deg: int) -> None:
        """precision.float8: the layer's weights that the torch program holds in nn.Linear modules, both
        dimensions multiples of 16 (what it converts to torchao's Float8Linear), run their three matmuls in
        FP8 (forward, input and weight gradients): their FLOPs, and the FP8 copies of their operands alive at
        once in the backward pass, 1 byte an element: the input and the weight, the output gradient twice
        (cast for each of the two matmuls), and a float32 scale each. The inputs and weights the backward pass
        needs stay saved in the compute dtype (torchao's tensorwise recipe saves those, not their FP8 copies)."""
        x = node.in_types[0]
        if x.is_int or not x.shape:
            return
        tokens = self.b * (x.numel // x.shape[-1]) / deg  # rows of the matmuls on one device
        for p in node.params:
            if p.name in OPS[node.op].float8_weights and len(p.shape) == 2 and not (p.shape[0] % 16 or p.shape[1] % 16):
                d_in, d_out = p.shape  # canonical [in, out]
                u.float8_flops += 2 * tokens * d_in * d_out
                u.float8_casts = max(u.float8_casts, math.ceil(tokens * (d_in + 2 * d_out)) + d_in * d_out + 4 * 4)

    # -- scopes
    def block(self, rep: RepeatNode, prefix: str, in_req: bool, in_remat: bool) -> _Unit:
        u = _Unit(saved={})
        req = {"block_input": in_req}
        for n in rep.layers:
            nu = self.node(n, prefix, req, in_remat)
            req[n.name] = bool(n.params) or any(req.get(i, False) for i in n.inputs) or bool(n.attrs.get("tie"))
            u.merge(nu)
        u.regather = 2 if self.opt.regather or in_remat else 1
        return u.flush_gathers(self.compression)

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

    def tied_copy(self, ranks: list, table: str, rk: "_Rank") -> None:
        """A tied layer on another pipe rank than its table (`PipelinePlan.tied_copies`): that rank holds a
        copy of the table (its state, gathered and reduced as the table is), and after the backward pass both
        ranks all-reduce the table's gradient over `pipe` (the pair of them, within each replica)."""
        pp = self.by_name[table]
        cu = _Unit(saved={})
        self.param_state(cu, pp, OPS["embedding"].handled_dims.get("weight", ()))
        rk.total.merge(cu.flush_gathers(self.compression), saved=False)
        owner = ranks[self.plan.pipeline.param_stage[table] % self.pipe]
        for r in {id(owner): owner, id(rk): rk}.values():
            key = ("all-reduce", ("pipe",), False)
            r.total.sync[key] = r.total.sync.get(key, 0) + math.prod(pp.local_shape) * DTYPE_BYTES[pp.dtype]

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
        threshold = self.threshold = tr.offload_threshold()  # None: no activation offload
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
                x_size = DTYPE_BYTES[x.dtype] if x.is_int else self.c  # (the checkpoint's elements: ckpt // x_size)
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
                    if in_remat:  # full remat keeps the block input only: it moves when it reaches the threshold
                        rk.block_offload += k * ckpt if threshold is not None and ckpt // x_size >= threshold else 0
                    else:
                        rk.block_offload += k * offloadable(bu.saved, bu.elems, threshold, remat == "selective")
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
                nu = self.node(node, "", req, False).flush_gathers(self.compression)
                req[node.name] = bool(node.params) or any(req.get(i, False) for i in node.inputs) or bool(
                    node.attrs.get("tie"))
                rk.top.merge(nu)
                rk.total.merge(nu, saved=False)
                rk.unit_gather = max(rk.unit_gather, nu.gathered)
                rk.layers.append(node.name)
                table = node.attrs.get("tie")
                if pipe > 1 and stage in self.plan.pipeline.tied_copies.get(table, ()):
                    self.tied_copy(ranks, table, rk)
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
                     self.flops(busiest, remat), None, None, tuple(notes), offload_threshold=threshold)

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
        # activation offload: per micro-batch, the saved tensors at or above the threshold (remat's survivors)
        moved = offloadable(top.saved, top.elems, self.threshold, remat != "none") + rk.block_offload
        acts = Activations(remat, math.ceil(saved * flight), rec, by_op, tuple(rk.blocks),
                           offloaded=math.ceil(moved * flight), offload_per_step=moved * steps)
        if self.opt.regather:
            # this layer's and the next `communication.prefetch` ones' (all-gathered ahead; FSDP2's default 1)
            gathered = min(total.gathered, (1 + (self.comm.prefetch or 1)) * rk.unit_gather)
            unsharded = min(total.unsharded_grads, 2 * rk.unit_gather * self.pb // self.gather_bytes)
        else:
            gathered, unsharded = total.gathered, total.unsharded_grads
        temps = Temporaries(gradient_flow=total.grad_flow, loss=top.loss, gathered_params=gathered,
                            unsharded_grads=unsharded, optimizer=2 * total.largest_shard * 4,
                            float8_casts=total.float8_casts)
        states = StateMemory(total.params, total.grads, total.master, total.moments, total.buffers)
        if self.held is not None and self.held.total > states.total:
            states = self.held  # what the target's program holds on this pipe rank
        colls = self.collectives(total, steps)
        per_fwd = total.flops * steps
        self._forward[r] = per_fwd
        flops = 3 * per_fwd + rk.recompute * steps
        return StageCosts(r, tuple(rk.layers), self.mesh.devices // self.pipe, states, acts, temps, flight, colls,
                          flops, 3 * total.float8_flops * steps)

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
        u = _Unit(saved={})
        LOSSES[loss.op].costs(LossCosts(self, u, env[loss.prediction]))
        if self.batch | self.context:
            u.add_coll("all-reduce", self.sorted_axes(self.batch | self.context), "forward", "loss mean over the batch",
                       4, True)
        top.merge(u)
        total.merge(u, saved=False)

    def collectives(self, total: _Unit, steps: int) -> tuple[Collective, ...]:
        out = []
        for (kind, axes, phase, what, nbytes, blocking), count in total.colls.items():
            group = 2 if kind == "send/recv" else self.deg(axes)
            packed = bool(self.compression) and what.endswith(", " + self.compression)
            out.append(Collective(kind, axes, group, phase, what, nbytes, count * steps, blocking,
                                  self.comm.compression_name if packed else "none"))
        for (kind, axes, per_micro), nbytes in total.sync.items():
            if kind == "all-gather":
                what, phase = "updated-parameter all-gather (ZeRO)", "step"
            elif kind == "reduce-scatter":
                what, phase = "gradient reduce-scatter (ZeRO)", "backward" if per_micro else "step"
            elif axes == ("pipe",):
                what, phase = "tied table gradient all-reduce (pipeline)", "step"
            else:
                what, phase = "gradient all-reduce (data parallel)", "step"
            packed = self.compression if self.compression and kind != "all-gather" and set(axes) <= self.batch else ""
            calls = 1
            if kind != "all-gather" and axes != ("pipe",) and self.opt.reduction_calls and self.opt.reduction_calls > 1:
                # the program's gradient reduction as it issues it: several calls, each a share of the gradients
                calls = self.opt.reduction_calls
                nbytes = -(-nbytes // calls)
                what += f" in {calls} calls"
            out.append(Collective(kind, axes, self.deg(axes), phase, what + (f", {packed}" if packed else ""), nbytes,
                                  (steps if per_micro else 1) * calls, False,
                                  self.comm.compression_name if packed else "none"))
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
    block_offload: int = 0  # bytes of the blocks' saved tensors that go to host memory (activation offload)
    unit_gather: int = 0


def _score_flops(n) -> float:
    """Forward FLOPs per sample that selective remat recomputes (attention scores)."""
    return OPS[n.op].score_flops(n.attrs) if isinstance(n, Node) else 0.0


class LayerCosts:
    """What an operator's `costs(c)` sees of one layer (`node`, in the scope `prefix`): the activation
    layouts, the mesh axes its parameters are split over for tensor parallelism (`tp`), and ways to record
    the tensors it saves for the backward pass and the collectives it implies (per device, per micro-batch)."""

    def __init__(self, walk: Walk, node: Node, prefix: str, u: _Unit, tp: dict[str, frozenset], needs_dx: bool,
                 in_remat: bool):
        self.walk, self.node, self.prefix, self.u, self.tp = walk, node, prefix, u, tp
        self.attrs = node.attrs
        self.ins = node.in_types
        self.x, self.out = node.in_types[0], node.out
        self.in_axes, self.out_axes = walk.act_axes(self.x), walk.act_axes(self.out)
        self.div_axes = set(self.in_axes) | set(self.out_axes)  # axes that divide the layer's FLOPs
        self.needs_dx, self.in_remat = needs_dx, in_remat
        self.b, self.compute_bytes, self.batch = walk.b, walk.c, walk.batch
        self.fused_attention = walk.opt.fused_attention  # the target's attention kernel stores no probabilities
        self.context = walk.deg(walk.context)  # context-parallel degree (the sequence split over `context`)
        self.phases = ["forward"] + (["recompute"] if in_remat else [])
        # the forward flops per sample the program computes: the operator's (node.flops), or more where this
        # layout makes the program compute more (a dropless moe layer's every slot under expert parallelism)
        self.flops = node.flops

    # -- layouts and sizes
    def act_axes(self, t: TensorType, dims: Optional[tuple[int, ...]] = None) -> frozenset:
        return self.walk.act_axes(t, dims)

    def deg(self, axes) -> int:
        return self.walk.deg(axes)

    def nbytes(self, t: TensorType, div_axes=frozenset()) -> int:
        return self.walk.nbytes(t, div_axes)

    def sorted_axes(self, axes) -> tuple[str, ...]:
        return self.walk.sorted_axes(axes)

    def param(self, local: str) -> ParamPlan:
        """The plan of this layer's parameter `local` (e.g. "weight") in this scope."""
        return self.walk.by_name[f"{self.prefix}{self.node.name}.{local}"]

    def global_param(self, name: str) -> ParamPlan:
        return self.walk.by_name[name]

    # -- saved tensors
    def save(self, what: str, nbytes: int, scores: bool = False) -> None:
        """A tensor of this layer's own, saved for the backward pass (`scores`: dropped by selective remat);
        its elements for the offload threshold: bytes / the compute dtype's size."""
        key = (self.node.name, self.prefix, what)
        self.u.saved.setdefault(key, (self.node.op, nbytes, scores))
        self.u.elems.setdefault(key, nbytes // self.compute_bytes)

    def save_input(self, i: int = 0, div_axes=None) -> None:
        """Input `i`, saved once however many layers keep it."""
        t = self.ins[i]
        axes = self.act_axes(t) if div_axes is None else div_axes
        key = ("t", self.prefix, self.node.inputs[i])
        self.u.saved.setdefault(key, (self.node.op, self.nbytes(t, axes), False))
        self.u.elems.setdefault(key, math.ceil(self.b * t.numel / self.deg(axes)))

    def save_inputs(self) -> None:
        for i in range(len(self.ins)):
            self.save_input(i)

    def add_score_flops(self, flops: float) -> None:
        self.u.score_flops += flops

    # -- collectives
    def add_coll(self, kind, axes, phase, what, nbytes, blocking, count=1) -> None:
        self.u.add_coll(kind, axes, phase, what, nbytes, blocking, count)

    def ring(self, nbytes: int, what: str) -> None:
        """Ring attention over `context` (degree n): n - 1 point-to-point steps that pass each rank's `what`
        (`nbytes` per device) on to the next rank, in the forward pass (and its recomputation), and n - 1 that
        pass their gradients back in the backward pass."""
        n = self.context
        for ph in self.phases:
            self.add_coll("send/recv", (CONTEXT,), ph, f"ring attention {what} blocks (context)", nbytes, True, n - 1)
        self.add_coll("send/recv", (CONTEXT,), "backward", f"ring attention {what} gradients (context)", nbytes,
                      True, n - 1)

    def gather_sequence(self) -> None:
        """A layer that needs the whole sequence in its order under context parallelism (Op.context_parallel
        "gather"): every context rank all-gathers its input over `context` (in the forward pass and its
        recomputation) and runs the layer on all of it, so its FLOPs are not divided over `context` and it
        keeps the gathered input for the backward pass; the input's gradient, each rank's share over the whole
        sequence, is reduce-scattered back onto the places."""
        whole = self.in_axes - {CONTEXT}
        self.div_axes -= {CONTEXT}
        nbytes = self.nbytes(self.x, whole)
        self.save("gathered input", nbytes)
        what = f"context parallel ({self.node.op} sequence"
        for ph in self.phases:
            self.add_coll("all-gather", (CONTEXT,), ph, what + " all-gather)", nbytes, True)
        if self.needs_dx:
            self.add_coll("reduce-scatter", (CONTEXT,), "backward", what + " input-gradient reduce-scatter)", nbytes,
                          True)

    def input_gradients(self, projections: tuple[str, ...]) -> int:
        """Input-gradient reductions of a layer's input projections: one when their output features are split
        alike (the programs compute them as one matmul, Op.input_projections), else one each."""
        return 1 if len({self.tp.get(w, frozenset()) for w in projections}) == 1 else len(projections)

    def tp_pair(self, T: frozenset, n_in: int) -> None:
        """Megatron: a column-parallel projection in, a row-parallel projection out; `n_in` input projections
        each reduce their input gradient."""
        x, out, in_axes, out_axes = self.x, self.out, self.in_axes, self.out_axes
        ax = self.sorted_axes(T)
        what = f"tensor-parallel ({self.node.op})"
        p_in = self.nbytes(x, in_axes - T)
        p_out = self.nbytes(out, out_axes - T)
        if in_axes & T:  # sequence parallel: the input arrives sharded over the sequence
            for ph in self.phases:
                self.add_coll("all-gather", ax, ph, what + " input all-gather", p_in, True)
                self.add_coll("reduce-scatter", ax, ph, what + " output reduce-scatter", p_out, True)
            self.add_coll("all-gather", ax, "backward", what + " output-gradient all-gather", p_out, True)
            if self.needs_dx:
                self.add_coll("reduce-scatter", ax, "backward", what + " input-gradient reduce-scatter", p_in, True,
                              n_in)
        else:
            for ph in self.phases:
                self.add_coll("all-reduce", ax, ph, what + " output all-reduce", p_out, True)
            if self.needs_dx:
                self.add_coll("all-reduce", ax, "backward", what + " input-gradient all-reduce", p_in, True, n_in)

    def reduce_out(self, T: frozenset, what: str) -> None:
        """The output is a partial sum over `T`: all-reduced (or reduce-scattered onto its own layout)."""
        out, out_axes = self.out, self.out_axes
        ax = self.sorted_axes(T)
        for ph in self.phases:
            if out_axes & T:
                self.add_coll("reduce-scatter", ax, ph, what.replace("all-reduce", "reduce-scatter"),
                              self.nbytes(out, out_axes - T), True)
            else:
                self.add_coll("all-reduce", ax, ph, what, self.nbytes(out, out_axes - T), True)

    def matmul(self, T_in: frozenset, T_out: frozenset, in_feat: frozenset, out_feat: frozenset) -> None:
        """A weight contracted with the input's features: row parallel over `T_in` (partial sums), column
        parallel over `T_out`; `in_feat`/`out_feat`: the mesh axes the activations' feature dims hold."""
        x, out, in_axes, out_axes = self.x, self.out, self.in_axes, self.out_axes
        op = self.node.op
        if T_in:  # row parallel: partial sums
            self.reduce_out(T_in, f"tensor-parallel all-reduce ({op} output)")
        if T_out:  # column parallel: the input's gradient is a partial sum
            ax = self.sorted_axes(T_out)
            sp = (in_axes - in_feat) & T_out
            if sp:
                for ph in self.phases:
                    self.add_coll("all-gather", ax, ph, f"tensor-parallel ({op} input all-gather)",
                                  self.nbytes(x, in_axes - T_out), True)
            if self.needs_dx:
                kind = "reduce-scatter" if sp else "all-reduce"
                self.add_coll(kind, ax, "backward", f"tensor-parallel ({op} input-gradient {kind})",
                              self.nbytes(x, in_axes - T_out), True)
            missing = T_out - out_feat
            if missing:
                for ph in self.phases:
                    self.add_coll("all-gather", self.sorted_axes(missing), ph, f"all-gather ({op} output)",
                                  self.nbytes(out, out_axes - missing), True)
        extra = in_feat - T_in
        if extra:
            for ph in self.phases:
                self.add_coll("all-gather", self.sorted_axes(extra), ph, f"all-gather ({op} input features)",
                              self.nbytes(x, in_axes - extra), True)


class LossCosts:
    """What a loss's `costs(c)` sees: the prediction tensor and its layout."""

    def __init__(self, walk: Walk, u: _Unit, pred: TensorType):
        self.walk, self.u, self.pred = walk, u, pred
        self.axes = walk.act_axes(pred)
        self.b, self.compute_bytes = walk.b, walk.c

    def save(self, what: str, nbytes: int, loss: str) -> None:
        """A float32 tensor the loss saves for the backward pass."""
        self.u.saved[("loss", "", what)] = (loss, nbytes, False)
        self.u.elems[("loss", "", what)] = nbytes // 4

    def set_temporaries(self, nbytes: int) -> None:
        self.u.loss = nbytes
