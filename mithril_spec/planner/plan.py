"""Planning: Graph + mesh -> Plan (a layout for every parameter and input, checks, per-device bytes)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from ..diagnostics import Diagnostic, DiagnosticError
from ..graph import Graph, InputNode, Param
from ..source import Document
from ..spec.root import Spec
from .layouts import Layout, batch_axes, check_layout, local_shape, param_layouts, read_rules
from .mesh import Mesh, select_mesh

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "int64": 8}
REPLICATED_WARN_NUMEL = 1 << 20
OPTIMIZER_SLOTS = {"adamw": 2, "adam": 2, "sgd": 1}  # state tensors per parameter (sgd: momentum only)


@dataclasses.dataclass(frozen=True)
class ParamPlan:
    param: Param
    spec: tuple[tuple[str, ...], ...]  # partition spec
    local_shape: tuple[int, ...]
    dtype: str

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

    @property
    def param_count(self) -> int:
        return self.graph.param_count

    def param(self, name: str) -> ParamPlan:
        return next(p for p in self.params + self.buffers if p.name == name)


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
            "E046", f"the mesh ({mesh.describe()}) uses {mesh.devices} devices, but {want} are given",
            doc.pos(path), help=f"choose mesh sizes whose product is {want}"))

    layouts = param_layouts(graph, spec, doc, mesh, rules, diags)
    seen: set = set()
    pdtype = spec.training.precision.params
    params, buffers = [], []
    for p in graph.params + graph.buffers:
        lay = layouts[p.name]
        check_layout(p.name, p.shape, p.units, lay, mesh, doc, diags, seen)
        plan = ParamPlan(p, lay.spec, local_shape(p.shape, lay.spec, mesh), pdtype if p.trainable else "float32")
        (params if p.trainable else buffers).append(plan)

    baxes = batch_axes(rules, mesh)
    dp = mesh.degree(baxes)
    tr = spec.training
    if tr.batch_size % tr.grad_accum or (tr.batch_size // tr.grad_accum) % dp:
        diags.append(Diagnostic(
            "E043", f"global batch {tr.batch_size} does not split into grad_accum={tr.grad_accum} micro-batches "
            f"over a data-parallel degree of {dp} ({' x '.join(f'{a}={mesh.sizes[a]}' for a in baxes) or '1'})",
            doc.pos(("training", "batch_size")),
            help=f"use a batch size divisible by {tr.grad_accum * dp}"))
    micro = tr.batch_size // tr.grad_accum

    inputs = _input_plans(graph, spec, doc, mesh, rules, baxes, micro, dp, diags, seen)
    warnings = _warnings(graph, spec, doc, mesh, rules, params, baxes)
    if diags:
        raise DiagnosticError(diags + warnings)

    slots = OPTIMIZER_SLOTS[tr.optimizer.name]
    if tr.optimizer.name == "sgd" and tr.optimizer.momentum == 0:
        slots = 0
    local = sum(p.local_bytes for p in params)
    memory = Memory(params=local, grads=local, optimizer=slots * local,
                    buffers=sum(b.local_bytes for b in buffers))
    return Plan(spec, graph, mesh, tuple(params), tuple(buffers), tuple(inputs), baxes, dp, micro, memory,
                tuple(warnings))


def _input_plans(graph, spec, doc, mesh, rules, baxes, micro, dp, diags, seen) -> list[InputPlan]:
    explicit = spec.sharding.inputs
    names = {i.name for i in graph.inputs}
    for name in explicit:
        if name not in names:
            from ..diagnostics import did_you_mean

            diags.append(Diagnostic("E045", f"`sharding.inputs` names `{name}`, which is not a model input",
                                    doc.pos(("sharding", "inputs", name), key=True), help=did_you_mean(name, names)))
    out = []
    for inp in graph.inputs:
        shape = (micro,) + inp.type.shape
        if inp.name in explicit:
            path = ("sharding", "inputs", inp.name)
            layout = explicit[inp.name]
            if len(layout) != len(shape):
                diags.append(Diagnostic(
                    "E048", f"layout for input `{inp.name}` has {len(layout)} entries but the input has "
                    f"{len(shape)} dimensions (batch first)", doc.pos(path), help="one entry per dimension"))
                continue
            from .layouts import _explicit

            spec_ = _explicit(layout, mesh)
            lay = Layout(spec_, path, (path,) * len(shape))
        else:
            dims = (baxes,) + tuple(rules.mesh_axes(a, mesh) for a in inp.type.axes)
            origins = (rules.paths.get("batch", ("training", "batch_size")),) + tuple(
                rules.paths.get(a, ()) if a else () for a in inp.type.axes)
            lay = Layout(dims, origins[0], origins)
        if check_layout(inp.name, shape, None, lay, mesh, doc, diags, seen):
            out.append(InputPlan(inp, lay.spec, micro // mesh.degree(lay.spec[0])))
    return out


def _warnings(graph, spec, doc, mesh, rules, params, baxes) -> list[Diagnostic]:
    out = []
    if mesh.devices > 1:
        for p in params:
            if p.param.numel >= REPLICATED_WARN_NUMEL and not any(p.spec):
                out.append(Diagnostic(
                    "W001", f"`{p.name}` ({p.param.numel:,} elements) is replicated on all {mesh.devices} devices",
                    doc.pos(p.param.path),
                    help=f"add a rule for one of its logical axes {[a for a in p.param.axes if a]} or use fsdp"))
    used = {a for p in graph.params for a in p.axes if a} | {a for i in graph.inputs for a in i.type.axes if a}
    used.add("batch")
    for logical, path in rules.paths.items():
        if logical not in used:
            from ..diagnostics import did_you_mean

            out.append(Diagnostic("W002", f"the rule for `{logical}` matches no parameter or input axis",
                                  doc.pos(path, key=True), help=did_you_mean(logical, sorted(used))))
    return out


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """Everything `plan --format json` prints (documented in docs/plan-json.md)."""

    def pspec(s):
        return [list(d) if d else None for d in s]

    tr = plan.spec.training
    return {
        "format": 1,
        "name": plan.spec.name,
        "mesh": {"name": plan.mesh.name, "axes": {a: plan.mesh.sizes[a] for a in plan.mesh.axes},
                 "devices": plan.mesh.devices},
        "batch": {"global": tr.batch_size, "grad_accum": tr.grad_accum, "micro_batch": plan.micro_batch,
                  "axes": list(plan.batch_axes), "data_parallel": plan.dp_degree,
                  "per_device": plan.micro_batch // plan.dp_degree},
        "inputs": [
            {"name": i.input.name, "shape": ["batch", *i.input.type.shape], "dtype": i.input.type.dtype,
             "layout": pspec(i.spec), "local_batch": i.local_batch}
            for i in plan.inputs
        ],
        "params": [
            {"name": p.name, "shape": list(p.param.shape), "axes": list(p.param.axes), "layout": pspec(p.spec),
             "local_shape": list(p.local_shape), "dtype": p.dtype, "bytes": p.bytes, "local_bytes": p.local_bytes}
            for p in plan.params + plan.buffers
        ],
        "totals": {
            "param_count": plan.param_count,
            "param_bytes": sum(p.bytes for p in plan.params),
            "per_device": {"params": plan.memory.params, "grads": plan.memory.grads,
                           "optimizer": plan.memory.optimizer, "buffers": plan.memory.buffers,
                           "total": plan.memory.total},
            "flops_per_sample_forward": plan.graph.flops_per_sample,
        },
        "diagnostics": [d.to_json() for d in plan.warnings],
    }
