"""Planning: Graph + mesh -> Plan (a layout for every parameter and input, checks, per-device bytes)."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

from .. import codes
from ..axes import MESH_AXES
from ..diagnostics import Diagnostic, DiagnosticError, did_you_mean
from ..graph import Graph, InputNode, Param
from ..ops import OPS, TensorType
from ..source import Document
from ..spec.root import Spec
from ..targets import TARGETS
from . import context_parallel
from .data_check import check_data, data_files
from .language_model import language_model
from .layouts import DEFAULT_RULES, Layout, Rules, batch_axes, check_layout, local_shape, param_layouts, read_rules
from .mesh import Mesh, select_mesh
from .pipeline import PipelinePlan, plan_pipeline
from .sizes import DTYPE_BYTES, OPTIMIZER_SLOTS  # noqa: F401 (re-exported)
from .states import state_memory

REPLICATED_WARN_NUMEL = 1 << 20


@dataclasses.dataclass(frozen=True)
class ParamPlan:
    param: Param
    spec: tuple[tuple[str, ...], ...]  # partition spec
    local_shape: tuple[int, ...]
    dtype: str
    stage: int = 0  # pipeline stage that holds it

    @property
    def name(self) -> str:
        return self.param.name

    @property
    def bytes(self) -> int:
        return self.param.numel * DTYPE_BYTES[self.dtype]

    @property
    def local_bytes(self) -> int:
        return math.prod(self.local_shape) * DTYPE_BYTES[self.dtype]

    @property
    def decay(self) -> bool:
        return self.param.trainable and len(self.param.shape) >= 2


@dataclasses.dataclass(frozen=True)
class BlockParamPlan:
    """One parameter of a repeated block, for all its copies: `copies[i]` is the plan of copy i
    (`<repeat>.<i>.<local>`). Every copy has the same shape, layout, dtype and init (E073 otherwise), so a
    program keeps one table row per block parameter and may stack the copies along a leading layer axis."""

    local: str  # name inside the block, e.g. attn.q.weight
    copies: tuple[ParamPlan, ...]

    @property
    def first(self) -> ParamPlan:
        return self.copies[0]


@dataclasses.dataclass(frozen=True)
class RepeatPlan:
    """A `repeat` of the model: one block, `count` copies."""

    name: str  # the repeat layer's name: canonical names are <name>.<i>.<local>
    block: str
    count: int
    params: tuple[BlockParamPlan, ...]
    buffers: tuple[BlockParamPlan, ...]

    def copy_name(self, i: int, local: str) -> str:
        return f"{self.name}.{i}.{local}"


@dataclasses.dataclass(frozen=True)
class InputPlan:
    input: InputNode
    spec: tuple[tuple[str, ...], ...]  # including the batch dimension
    local_batch: int  # per device, per micro-batch


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per device of model state (the largest over devices; layouts here are even)."""

    params: int
    grads: int
    optimizer: int
    buffers: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.buffers


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: Spec
    graph: Graph
    mesh: Mesh
    params: tuple[ParamPlan, ...]
    buffers: tuple[ParamPlan, ...]
    inputs: tuple[InputPlan, ...]
    batch_axes: tuple[str, ...]
    dp_degree: int
    micro_batch: int  # global samples per micro-batch
    memory: Memory
    warnings: tuple[Diagnostic, ...]
    pipeline: Optional[PipelinePlan] = None
    rules: Rules = Rules({}, {})  # the sharding rules as resolved (logical axis -> mesh axes)
    repeats: tuple[RepeatPlan, ...] = ()  # the repeated blocks, one entry per block parameter
    # the files the spec names, by role (`data`, `eval`, `tokenizer`), as absolute paths (data_check.py)
    data_files: dict[str, str] = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def in_repeat(self) -> frozenset[str]:
        """Canonical names of the parameters and buffers that belong to a repeated block."""
        return frozenset(c.name for r in self.repeats for b in r.params + r.buffers for c in b.copies)

    @functools.cached_property
    def language_model(self):
        """A language model the programs can sample from (generate.py), or None (planner/language_model.py)."""
        return language_model(self.graph)

    @property
    def top_params(self) -> tuple[ParamPlan, ...]:
        """The parameters outside every repeated block."""
        return tuple(p for p in self.params if p.name not in self.in_repeat)

    @property
    def top_buffers(self) -> tuple[ParamPlan, ...]:
        return tuple(b for b in self.buffers if b.name not in self.in_repeat)

    @property
    def param_count(self) -> int:
        return self.graph.param_count

    @functools.cached_property
    def _by_name(self) -> dict[str, ParamPlan]:
        return {p.name: p for p in self.params + self.buffers}

    def param(self, name: str) -> ParamPlan:
        return self._by_name[name]

    def memory_for(self, target: str) -> Memory:
        """The bytes per device `target`'s program holds: `memory`, except in a pipelined build of a target
        that runs the layers outside the pipelined block on every pipe rank (its capability
        `pipeline_outside_everywhere`), which holds those layers' parameters on every rank, and (capability
        `pipeline_pads_stages`) as many copies of the pipelined block on each stage as the largest stage has."""
        st = self.states_for(target)
        if st is None:
            return self.memory
        return Memory(params=st.params, grads=st.grads, optimizer=st.optimizer, buffers=st.buffers)

    def states_for(self, target: str):
        """The training state per device (states.StateMemory) of `target`'s program where it holds more than
        the stage split (see `memory_for`), the same on every pipe rank; None where it holds the split."""
        cap = TARGETS[target].capabilities
        if self.pipeline is None or not cap.pipeline_outside_everywhere:
            return None
        return state_memory(self, outside_everywhere=True, padded=cap.pipeline_pads_stages)

    def activation_layout(self, t: TensorType) -> tuple[tuple[str, ...], ...]:
        """Mesh axes per dimension of an activation (without its batch dimension, which takes `batch_axes`).
        The one policy every consumer uses (cost model, render adapters): a dimension takes the mesh axes of
        size > 1 its logical axis is ruled to, less the batch axes and those another dimension took, when
        their product divides it; otherwise it is whole. Dimensions are served from the last (the features,
        which tensor parallelism splits) to the first (the sequence, which sequence parallelism splits), so
        logits ruled `[seq, vocab]` to `tensor` twice are vocab-parallel, as Megatron computes them."""
        key = (t.shape, t.axes)
        hit = self._layouts.get(key)
        if hit is None:
            used = set(self.batch_axes)
            dims: list[tuple[str, ...]] = [()] * len(t.shape)
            for i in reversed(range(len(t.shape))):
                ruled = self.rule(t.axes[i])
                if t.axes[i] is not None and t.axes[i] == self.context_sequence_axis:
                    ruled = (context_parallel.AXIS,) + tuple(ruled)  # context parallelism splits the sequence
                axes = tuple(a for a in ruled if self.mesh.size(a) > 1 and a not in used)
                if axes and t.shape[i] % self.mesh.degree(axes) == 0:
                    used.update(axes)
                    dims[i] = axes
            hit = self._layouts[key] = tuple(dims)
        return hit

    @functools.cached_property
    def _layouts(self) -> dict:
        return {}

    @functools.cached_property
    def context_sequence_axis(self) -> Optional[str]:
        """The logical axis the `context` mesh axis splits (planner/context_parallel.py), None without that axis."""
        return context_parallel.attended_axis(self.graph) if context_parallel.degree(self.mesh) > 1 else None

    def rule(self, logical: Optional[str]) -> tuple[str, ...]:
        """The mesh axes the rules assign to a logical axis (as written; the built-in defaults apply)."""
        if logical is None:
            return ()
        return self.rules.table.get(logical, DEFAULT_RULES.get(logical, ()))


def make_plan(spec: Spec, doc: Document, graph: Graph, mesh_choice: Optional[str] = None,
              devices: Optional[int] = None) -> Plan:
    mesh = select_mesh(spec, doc, mesh_choice)
    diags: list[Diagnostic] = []
    rules = read_rules(spec, doc, diags)
    if diags:
        raise DiagnosticError(diags)

    want = devices if devices is not None else spec.devices
    if want is not None and want != mesh.devices:
        path = ("devices",) if devices is None else mesh.source
        diags.append(Diagnostic(
            codes.E046, f"the mesh ({mesh.describe()}) uses {mesh.devices} devices, but {want} are given",
            doc.pos(path), help=f"choose mesh sizes whose product is {want}"))

    if spec.hf is not None:
        from ..hf_import import check_hf

        diags += check_hf(spec, doc, graph)
    layouts = param_layouts(graph, spec, doc, mesh, rules, diags)
    skip = _check_experts(graph, doc, mesh, layouts, diags)
    seen: set = set()
    pdtype = spec.training.precision.params
    baxes = batch_axes(rules, mesh)
    dp = mesh.degree(baxes)
    tr = spec.training
    pipeline = plan_pipeline(spec, doc, graph, mesh, tr.batch_size // tr.grad_accum, dp, diags)
    params, buffers = [], []
    checked: set = set()  # (shape, units, layout) already checked: copies of a block repeat them
    shapes: dict[tuple, tuple[int, ...]] = {}
    for p in graph.params + graph.buffers:
        lay = layouts[p.name]
        if p.name not in skip and (p.shape, p.units, lay) not in checked:
            checked.add((p.shape, p.units, lay))
            check_layout(p.name, p.shape, p.units, lay, mesh, doc, diags, seen)
        stage = pipeline.param_stage.get(p.name, 0) if pipeline else 0
        local = shapes.get((p.shape, lay.spec))
        if local is None:
            local = shapes[(p.shape, lay.spec)] = local_shape(p.shape, lay.spec, mesh)
        plan = ParamPlan(p, lay.spec, local, pdtype if p.trainable else "float32", stage)
        (params if p.trainable else buffers).append(plan)

    if tr.batch_size % tr.grad_accum or (tr.batch_size // tr.grad_accum) % dp:
        diags.append(Diagnostic(
            codes.E043, f"global batch {tr.batch_size} does not split into grad_accum={tr.grad_accum} micro-batches "
            f"over a data-parallel degree of {dp} ({' x '.join(f'{a}={mesh.size(a)}' for a in baxes) or '1'})",
            doc.pos(("training", "batch_size")),
            help=f"use a batch size divisible by {tr.grad_accum * dp}"))
    micro = tr.batch_size // tr.grad_accum
    files = data_files(spec, doc)
    data_warnings: list[Diagnostic] = []
    check_data(spec, graph, doc, files, diags, data_warnings)
    if getattr(spec.data, "mask", None) is not None and (mesh.pipe_enabled or context_parallel.degree(mesh) > 1):
        axis = "pipe" if mesh.pipe_enabled else context_parallel.AXIS
        diags.append(Diagnostic(
            codes.E013, f"`data.mask` on a mesh with `{axis}`: no target masks the loss across {axis} ranks yet",
            doc.pos(("data", "mask"), key=True), help=f"use a mesh without `{axis}` (data, fsdp, tensor mask the loss)"))
    if any(d.code == codes.E043 for d in diags):
        seen.add("batch-reported")

    repeats = _repeat_plans(graph, doc, params, buffers, layouts, diags)
    inputs = _input_plans(graph, spec, doc, mesh, rules, baxes, micro, dp, diags, seen)
    warnings = _warnings(graph, spec, doc, mesh, rules, params, baxes) + data_warnings
    if diags:
        raise DiagnosticError(diags + warnings)

    # A device holds the parameters of the stages on its pipe rank; report the fullest rank. The cost model
    # owns the formulas (fp32 master weights, ZeRO sharding of optimizer state and gradients).
    plan = Plan(spec, graph, mesh, tuple(params), tuple(buffers), tuple(inputs), baxes, dp, micro,
                Memory(0, 0, 0, 0), tuple(warnings), pipeline, rules, repeats, files)
    st = state_memory(plan)
    return dataclasses.replace(plan, memory=Memory(params=st.params, grads=st.grads, optimizer=st.optimizer,
                                                   buffers=st.buffers))


def _repeat_plans(graph: Graph, doc: Document, params, buffers, layouts, diags) -> tuple[RepeatPlan, ...]:
    """Groups the copies of every repeated block's parameters. A program keeps one row per block parameter
    (and JAX stacks the copies), so the copies must agree on layout and init: E073 where a `sharding.params`
    glob gives some copies another layout than the rest."""
    from ..graph import RepeatNode

    by_name = {p.name: p for p in list(params) + list(buffers)}
    out = []
    for node in graph.layers:
        if not isinstance(node, RepeatNode):
            continue
        groups: dict[str, list] = {}
        for inner in node.layers:
            for d, trainable in [(d, True) for d in inner.params] + [(d, False) for d in inner.buffers]:
                local = f"{inner.name}.{d.name}"
                groups[local] = [by_name[f"{node.name}.{i}.{local}"] for i in range(node.count)]
        for local, copies in groups.items():
            first = copies[0]
            odd = [c for c in copies if (c.spec, c.local_shape, c.dtype) != (first.spec, first.local_shape, first.dtype)]
            if odd:
                pick = next((c for c in (first, odd[0]) if layouts[c.name].origin[:2] == ("sharding", "params")),
                            odd[0])
                origin = layouts[pick.name].origin
                diags.append(Diagnostic(
                    codes.E073, f"copies of the repeated block `{node.name}` lay out `{local}` differently: "
                    f"`{first.name}` {_show_spec(first.spec)}, `{odd[0].name}` {_show_spec(odd[0].spec)}",
                    doc.pos(origin if origin else node.path, key=bool(origin) and origin[:2] == ("sharding", "params")),
                    help="a block is one block in the program: give every copy the same layout (a glob such as "
                    f"`{node.name}.*.{local}`)"))
        blocks = [BlockParamPlan(local, tuple(copies)) for local, copies in groups.items()]
        out.append(RepeatPlan(node.name, node.block, node.count,
                              tuple(b for b in blocks if b.first.param.trainable),
                              tuple(b for b in blocks if not b.first.param.trainable)))
    return tuple(out)


def _show_spec(spec) -> str:
    return "[" + ", ".join("+".join(d) if d else "whole" for d in spec) + "]"


def _check_experts(graph: Graph, doc: Document, mesh: Mesh, layouts, diags) -> set[str]:
    """E055: an moe layer's experts must split evenly over the mesh axes its expert dimension uses."""
    from ..graph import RepeatNode

    skip: set[str] = set()
    reported: set[tuple] = set()
    for top in graph.layers:
        copies = [(f"{top.name}.{i}.", n) for i in range(top.count) for n in top.layers] if isinstance(
            top, RepeatNode) else [("", top)]
        for prefix, node in copies:
            experts = OPS[node.op].expert_dims  # parameter -> its expert dimension
            if not experts:
                continue
            local = next(p.name for p in node.params if p.name in experts)  # (the layer's expert form)
            name = f"{prefix}{node.name}.{local}"
            axes = layouts[name].spec[experts[local]]
            deg = mesh.degree(axes)
            if deg > 1 and node.attrs["experts"] % deg:
                skip |= {f"{prefix}{node.name}.{k}" for k in experts}
                if node.path in reported:
                    continue
                reported.add(node.path)
                diags.append(Diagnostic(
                    codes.E055, f"`{node.name}`: {node.attrs['experts']} experts do not split over "
                    f"{' x '.join(f'{a}={mesh.size(a)}' for a in axes)} = {deg}", doc.pos(node.path + ("experts",)),
                    help=f"use a number of experts divisible by {deg}, or a smaller expert axis"))
    return skip


def _input_plans(graph, spec, doc, mesh, rules, baxes, micro, dp, diags, seen) -> list[InputPlan]:
    explicit = spec.sharding.inputs
    names = {i.name for i in graph.inputs}
    for name in explicit:
        if name not in names:
            diags.append(Diagnostic(codes.E045, f"`sharding.inputs` names `{name}`, which is not a model input",
                                    doc.pos(("sharding", "inputs", name), key=True), help=did_you_mean(name, names)))
    out = []
    for inp in graph.inputs:
        shape = (micro,) + inp.type.shape
        if inp.name in explicit:
            path = ("sharding", "inputs", inp.name)
            layout = explicit[inp.name]
            bad = [(j, a) for j, e in enumerate(layout) for a in ((e,) if isinstance(e, str) else (e or ()))
                   if a not in MESH_AXES]
            for j, a in bad:
                diags.append(Diagnostic(codes.E040, f"unknown mesh axis `{a}` in the layout for input `{inp.name}`",
                                        doc.pos(path + (j,)), help=did_you_mean(a, MESH_AXES)))
            if bad:
                continue
            if len(layout) != len(shape):
                diags.append(Diagnostic(
                    codes.E048, f"layout for input `{inp.name}` has {len(layout)} entries but the input has "
                    f"{len(shape)} dimensions (batch first)", doc.pos(path), help="one entry per dimension"))
                continue
            from .layouts import _explicit

            spec_ = _explicit(layout, mesh)
            lay = Layout(spec_, path, (path,) * len(shape))
        else:
            seq = context_parallel.attended_axis(graph) if context_parallel.degree(mesh) > 1 else None
            dims = (baxes,) + tuple((context_parallel.AXIS,) * (a is not None and a == seq) + rules.mesh_axes(a, mesh)
                                    for a in inp.type.axes)
            origins = (rules.paths.get("batch", ("training", "batch_size")),) + tuple(
                rules.paths.get(a, ()) if a else () for a in inp.type.axes)
            lay = Layout(dims, origins[0], origins)
        # The batch dimension's divisibility is E043's (or E052's) to report.
        units = (mesh.degree(lay.spec[0]),) + inp.type.shape if "batch-reported" in seen else None
        if check_layout(inp.name, shape, units, lay, mesh, doc, diags, seen):
            out.append(InputPlan(inp, lay.spec, micro // mesh.degree(lay.spec[0])))
    return out


def _warnings(graph, spec, doc, mesh, rules, params, baxes) -> list[Diagnostic]:
    out = []
    if mesh.devices > 1:
        for p in params:
            if p.param.numel >= REPLICATED_WARN_NUMEL and not any(p.spec):
                out.append(Diagnostic(
                    codes.W001, f"`{p.name}` ({p.param.numel:,} elements) is replicated on all {mesh.devices} devices",
                    doc.pos(p.param.path),
                    help=f"add a rule for one of its logical axes {[a for a in p.param.axes if a]} or use fsdp"))
    used = {a for p in graph.params for a in p.axes if a} | {a for i in graph.inputs for a in i.type.axes if a}
    used.add("batch")
    for logical, path in rules.paths.items():
        if logical not in used:
            out.append(Diagnostic(codes.W002, f"the rule for `{logical}` matches no parameter or input axis",
                                  doc.pos(path, key=True), help=did_you_mean(logical, sorted(used))))
    return out
