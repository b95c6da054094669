"""The PyTorch target's lowering (targets/torch.py declares it): what its program cannot run (E049), how it
runs what it can (data_parallel, shard_axis, pipeline_flow, sequence_parallel, relaid_inputs: read by its
render adapter too), and the cost model's options for it (reduction_calls, sharded_layers)."""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import TYPE_CHECKING

from .. import codes
from ..diagnostics import Diagnostic
from ..ops import OPS
from ..targets.torch import (
    DATA_SPLIT_LIMITS,
    FLOAT8_LIMITS,
    FSDP_MODULE_ATTRS,
    SP_KINDS,
    SP_OPS,
    TORCH_MODULE_ATTRS,
    TP_KINDS,
    ZERO_LIMITS,
    TorchTarget,
)
from .base import Lowering, _a, aux_loss_left_out, layout_text, scopes, tensor_dims, tensor_parallel_errors, vocab_parallel_layers
from .communication import torch_communication_errors

if TYPE_CHECKING:
    from ..graph import RepeatNode
    from ..planner.plan import Plan
    from ..source import Document


class TorchLowering(Lowering):
    target = TorchTarget()

    def left_out(self, plan: Plan) -> dict[str, str]:
        why = aux_loss_left_out(plan)
        return {"generate.py": why} if why else {}

    def reduction_calls(self, plan: Plan) -> int | None:
        """FSDP2 (hsdp, fsdp) reduces each fully_shard unit's gradients on its own, after that unit's backward:
        one unit per copy of a repeated block (a pipe rank's copies) and the root (parameters outside the
        blocks). DDP's buckets and ZeRO-2 are left at one call."""
        if data_parallel(plan) not in ("hsdp", "fsdp"):
            return None
        pipe = plan.mesh.pipe
        copies = sum(n.count for n in plan.graph.layers if n.is_repeat)
        return -(-copies // pipe) + 1

    def sharded_layers(self, plan: Plan) -> int:
        """parallelize_module makes each layer whose parameters the plan splits over `tensor` a DTensor module
        (colwise, rowwise, vocab-parallel), and in a sequence-parallel block every layer with parameters
        (SequenceParallel norms): every copy of a repeated block's, on a pipe rank its share."""
        if not plan.mesh.tensor_enabled:
            return 0
        split = [p for p in plan.params if any("tensor" in axes for axes in p.spec)]
        modules = {p.name.rsplit(".", 1)[0] for p in split}
        split_layers = {p.param.layer for p in split}
        for node in plan.graph.layers:
            if node.is_repeat and sequence_parallel(plan, node):
                for i in range(node.count):
                    modules |= {f"{node.name}.{i}.{layer.name}" for layer in node.layers if layer.params} - split_layers
        return -(-len(modules) // plan.mesh.pipe)

    def check_more(self, plan: Plan, doc: Document) -> list[Diagnostic]:
        return (_checks(plan, doc) + _zero(plan, doc) + _data_split(plan, doc) + _input_layouts(plan, doc)
                + _float8(plan, doc)
                + torch_communication_errors(plan, doc, data_parallel(plan), shard_axis(plan)))


def _checks(plan: Plan, doc: Document) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    tp = plan.mesh.tensor_enabled

    def err(node, msg, help=None):
        out.append(Diagnostic(codes.E049, msg, doc.pos(node.path + ("name",)), help=help))

    for n in plan.graph.layers:
        if n.is_repeat and sequence_parallel(plan, n):
            for node in n.layers:
                op = OPS[node.op]
                if not (op.per_position or op.tensor_parallel in SP_KINDS) or (
                        op.is_random(node.attrs) and not op.random_sequence_parallel):
                    err(node, f"`{node.name}`: the torch target cannot run {_a(node.op)} layer on a sequence split "
                        "over `tensor` (sequence parallelism)",
                        help=f"sequence-parallel blocks hold {', '.join(SP_OPS)}; or do not rule the sequence axis "
                        "to `tensor`")
                elif op.tensor_parallel in SP_KINDS and not any(
                        tensor_dims(plan, f"{n.name}.0.{node.name}.{p.name}") for p in node.params):
                    err(node, f"`{node.name}`: under sequence parallelism the torch target needs {node.op} layers "
                        "split over `tensor`", help="rule `heads`/`kv_heads` (attention) or `mlp` (mlp, moe) to "
                        "`tensor`")

    out += _experts(plan, doc)
    out += _whole_under_fsdp(plan, doc)
    if plan.pipeline is not None and len(plan.pipeline.stages) > 1:
        out += _pipeline(plan, doc)

    for prefix, nodes in scopes(plan):
        for node in nodes:
            if node.name in TORCH_MODULE_ATTRS:
                err(node, f"layer name `{node.name}` clashes with torch.nn.Module.{node.name}",
                    help="rename the layer (names are shared by every target)")
            elif node.name.startswith("_") or node.name in FSDP_MODULE_ATTRS:
                what = "FSDPModule" if node.name in FSDP_MODULE_ATTRS else "torch.nn.Module's internal attributes"
                err(node, f"layer name `{node.name}` clashes with {what} in the torch target",
                    help="rename the layer (names are shared by every target)")
    if tp:
        out += tensor_parallel_errors(plan, doc, "torch", "PyTorch", vocab_parallel=True, kinds=TP_KINDS)
        out += _vocab_parallel(plan, doc)
    return out



def _zero(plan: Plan, doc: Document) -> list[Diagnostic]:
    """E049 for `training.zero` on a mesh axis the torch program's ZeRO does not combine with (ZERO_LIMITS)."""
    out: list[Diagnostic] = []
    mesh = plan.mesh
    tr = plan.spec.training
    if tr.zero:
        for axis, (what, why) in zip(("fsdp", "tensor", "expert"), ZERO_LIMITS):
            # (tensor alone splits no batch: ZeRO has nothing to split over, and the program is the plain one)
            if mesh.size(axis) > 1 and (axis != "tensor" or mesh.data_enabled):
                out.append(Diagnostic(
                    codes.E049, f"the torch target does not support `training.zero: {tr.zero}` with {what}",
                    doc.pos(("training", "zero")),
                    help=f"{why}; use `training.zero: 0` on this mesh (the fsdp axis is ZeRO-3), or a mesh of "
                    "`data` alone"))
    return out


def _float8(plan: Plan, doc: Document) -> list[Diagnostic]:
    """E049 for `precision.float8` on a mesh axis the torch program's FP8 layers do not combine with
    (FLOAT8_LIMITS): they run on one device, under DDP (`data`) and under FSDP2 (`fsdp`, HSDP)."""
    if not plan.spec.training.precision.float8:
        return []
    return [Diagnostic(codes.E049, f"the torch target does not support `precision.float8` with {words}",
                       doc.pos(("training", "precision", "float8")),
                       help=f"{why}; use a mesh of `data` and `fsdp` axes, or `precision.float8: false`")
            for axis, words, why in FLOAT8_LIMITS if plan.mesh.size(axis) > 1]


def expert_group(plan: Plan) -> tuple[str, ...]:
    """The mesh axes the plan splits the moe experts' dimension 0 over, in its order (`expert`, or `expert`
    then `fsdp`: each rank of that group holds its own experts, whole on that dimension, and the tokens travel
    to them by all-to-all over the group); () where no expert is split."""
    for prefix, nodes in scopes(plan):
        for node in nodes:
            if not node.is_repeat and OPS[node.op].expert_dims:
                for p in node.params:
                    if p.name in OPS[node.op].expert_dims:
                        return tuple(a for a in plan.param(f"{prefix}{node.name}.{p.name}").spec[0]
                                     if plan.mesh.size(a) > 1)
    return ()


def _experts(plan: Plan, doc: Document) -> list[Diagnostic]:
    """Expert parallelism in the torch target: the experts of every moe layer split on dimension 0 over
    `expert` (or `expert` and `fsdp`: more ranks, each with its own experts), tokens sent to them with
    all-to-all over those ranks (in a pipeline: the ranks of the layer's stage); their hidden features may
    be split over `tensor` too (split_tensor, as without experts split). Everything else data parallel over
    the batch axes (DDP, or FSDP2 beside `fsdp`, `tensor` or `pipe`, whose gradients the program then
    averages over `expert` too)."""
    out: list[Diagnostic] = []
    mesh = plan.mesh
    if not mesh.expert_enabled:
        return out
    moe_params = set()
    group = None
    for prefix, nodes in scopes(plan):
        for node in nodes:
            if node.is_repeat or not OPS[node.op].expert_dims:
                continue
            for p in node.params:
                if p.name in OPS[node.op].expert_dims:
                    moe_params.add(f"{prefix}{node.name}.{p.name}")
            for p in node.params:
                if p.name not in OPS[node.op].expert_dims:
                    continue
                spec = plan.param(f"{prefix}{node.name}.{p.name}").spec
                first = tuple(a for a in spec[0] if mesh.size(a) > 1)
                rest = {a for d in spec[1:] for a in d if mesh.size(a) > 1}
                if "expert" not in first or not set(first) <= {"expert", "fsdp"} or not rest <= {"tensor"} or (
                        group is not None and first != group):
                    out.append(Diagnostic(
                        codes.E049, f"`{node.name}`: the torch target splits a moe layer's experts on dimension 0 "
                        "over `expert` (and `fsdp`: more ranks with experts of their own), the same in every moe "
                        f"layer, and their other dimensions over `tensor` at most (its `{p.name}` is laid out as "
                        f"{layout_text(spec)})", doc.pos(node.path + ("name",)),
                        help="rule the `experts` axis to `expert` (the default), and choose a number of experts "
                        "that the expert (x fsdp) ranks divide"))
                    break
                group = first
    for pp in plan.params:
        if "expert" in {a for d in pp.spec for a in d} and _first_copy(plan, pp.name) not in moe_params:
            out.append(Diagnostic(
                codes.E049, f"`{pp.name}` is split over `expert`; the torch target splits only the experts of moe "
                "layers over that axis", doc.pos(plan.mesh.source),
                help="rule no logical axis but `experts` to the `expert` mesh axis"))
            break
    return out



def _vocab_parallel(plan: Plan, doc: Document) -> list[Diagnostic]:
    """A tied linear layer reading a table split on its vocabulary only as the output layer whose logits,
    split over `tensor`, go into a parallel cross-entropy. Vocab-parallel layers run in a pipeline too: the
    table's lookups come out whole, and the output layer is the loss prediction, so the last layer (E027
    otherwise), on the last stage, whose loss_fn runs the parallel cross-entropy: its split logits never
    pass between stages. A tied output layer there sits on another stage than its table, or its table
    reads the model input on a later stage than the first: pipeline_flow refuses both."""
    tables, heads = vocab_parallel_layers(plan)
    out: list[Diagnostic] = []

    def table(node) -> str:  # the embedding layer a tied linear reads (its attrs name the table parameter)
        return (node.attrs.get("tie") or "").rsplit(".", 1)[0]

    for node in plan.graph.layers:
        if not node.is_repeat and table(node) in tables and node.name not in heads:
            out.append(Diagnostic(
                codes.E049, f"`{node.name}` is tied to `{table(node)}`, whose table is split on its vocabulary "
                "over `tensor`: the torch target runs that only for the output layer of a cross_entropy loss",
                doc.pos(node.path + ("name",)), help="leave the vocabulary whole, or untie the layer"))
    return out


def _whole_under_fsdp(plan: Plan, doc: Document) -> list[Diagnostic]:
    """FSDP2 leaves the parameters the plan keeps whole (no dimension divides over fsdp) to the program,
    which averages their gradients itself; its MixedPrecisionPolicy casts only the parameters it shards, so
    a whole one would meet 16-bit activations in float32."""
    pr = plan.spec.training.precision
    axis = shard_axis(plan)  # (parameters split over `data`: FSDP2 shards over data, and leaves the others whole)
    if plan.mesh.size(axis) <= 1 or pr.compute == pr.params:
        return []
    # (the experts split over `expert` are the program's own, cast to the compute dtype where they are used)
    whole = next((pp for pp in plan.params if pp.param.trainable and not any(axis in d for d in pp.spec)
                  and not any("expert" in d for d in pp.spec)), None)
    if whole is None:
        return []
    why = "no dimension divides" if axis == "fsdp" else "not split over it"
    return [Diagnostic(
        codes.E049, f"`{whole.name}` {list(whole.param.shape)} stays whole over {axis}={plan.mesh.size(axis)} ({why}), "
        f"and the torch target's FSDP2 casts only the parameters it shards to {pr.compute}", doc.pos(whole.param.path),
        help=f"choose sizes that the {axis} axis divides, or compute in the parameters' dtype" if axis == "fsdp" else
        "split every trainable parameter over `data`, or compute in the parameters' dtype")]


def _data_split(plan: Plan, doc: Document) -> list[Diagnostic]:
    """E049 for parameters split over `data` where the torch program's FSDP2 over the data axis cannot hold
    them as planned (DATA_SPLIT_LIMITS, and the checks below)."""
    split = split_over_data(plan)
    if split is None:
        return []
    mesh = plan.mesh
    glob = next((g for g in plan.spec.sharding.params if fnmatch.fnmatchcase(split.name, g)), None)
    where = doc.pos(split.param.path if glob is None else ("sharding", "params", glob))
    what = f"parameters split over the `data` axis (`{split.name}` is laid out as {layout_text(split.spec)})"
    out: list[Diagnostic] = []

    def refuse(how: str, why: str, help: str = "split parameters over `fsdp` (ZeRO-3) instead, and keep `data` "
               "for the batch", pos=None) -> None:
        out.append(Diagnostic(codes.E049, f"the torch target does not support {what} {how}", pos or where,
                              help=f"{why}; {help}"))

    for axis, words, why in DATA_SPLIT_LIMITS:
        if mesh.size(axis) > 1:
            refuse(f"with {words}", why)
    if out:
        return out
    if "data" not in plan.batch_axes:
        refuse("when `data` does not split the batch", "FSDP2 averages the gradients over the data axis, which "
               "would then hold the same samples", help="add `data` to the `batch` rule")
    if plan.spec.training.zero:
        refuse(f"with `training.zero: {plan.spec.training.zero}`", "FSDP2 over `data` already splits those "
               "parameters' optimizer state, and the torch program's ZeRO splits replicated parameters only",
               help="use `training.zero: 0`", pos=doc.pos(("training", "zero")))
    buffer = next((b for b in plan.buffers if any("data" in d for d in b.spec)), None)
    if buffer is not None:
        refuse(f"with the buffer `{buffer.name}` split over `data` too", "the torch program keeps running "
               "statistics whole on every rank", help="rule the channels' logical axis to another mesh axis")
    return out


def relaid_inputs(plan: Plan) -> dict[str, list[list[str]]]:
    """The inputs `sharding.inputs` lays out otherwise than the batch split the model computes with (batch
    axes, then whole): name -> mesh axes per dimension. Each rank reads the block its layout gives it, and
    the program redistributes it to its rows of the batch (templates/torch/data.py.j2 relayout)."""
    out = {}
    for ip in plan.inputs:
        usual = (tuple(plan.batch_axes),) + ((),) * (len(ip.spec) - 1)
        if ip.input.name in plan.spec.sharding.inputs and tuple(map(tuple, ip.spec)) != usual:
            out[ip.input.name] = [list(d) for d in ip.spec]
    return out


def _input_layouts(plan: Plan, doc: Document) -> list[Diagnostic]:
    """E049 for the input layouts the torch program cannot read as laid out: it builds a DTensor of each
    rank's block (whose shards nest in mesh order) and redistributes it on the main thread."""
    out: list[Diagnostic] = []
    order = list(plan.mesh.axes)
    relaid = relaid_inputs(plan)
    for name, layout in relaid.items():
        where = doc.pos(("sharding", "inputs", name))
        what = f"the layout {layout_text(layout)} of input `{name}`"
        if plan.mesh.pipe_enabled:
            out.append(Diagnostic(codes.E049, f"the torch target does not support {what} with a `pipe` axis", where,
                                  help="the pipeline feeds each stage's micro-batches by rows of the batch; leave "
                                  f"`{name}` out of `sharding.inputs`"))
        elif any(d != sorted(d, key=order.index) for d in layout + [list(plan.batch_axes)]):
            out.append(Diagnostic(codes.E049, f"the torch target does not support {what} with the batch axes "
                                  f"{list(plan.batch_axes)}: mesh axes out of the mesh's order on one dimension",
                                  where, help="list the mesh axes of a dimension in the mesh's order ("
                                  f"{', '.join(order)})"))
        elif plan.micro_batch % plan.mesh.degree(layout[0]):
            out.append(Diagnostic(codes.E049, f"the torch target does not support {what}: a micro-batch of "
                                  f"{plan.micro_batch} samples does not split over {layout_text(layout[:1])}",
                                  where, help="choose a batch size that splits evenly"))
    return out


def split_over_data(plan: Plan):
    """The first parameter the plan splits over a `data` axis larger than 1 (None: none is)."""
    if not plan.mesh.data_enabled:
        return None
    return next((pp for pp in plan.params if any("data" in d for d in pp.spec)), None)


def shard_axis(plan: Plan) -> str:
    """The mesh axis FSDP2 shards parameters over: `data` where parameters are split over it (and the plan is
    one the torch program runs so: _data_split), else `fsdp`."""
    mesh = plan.mesh
    if split_over_data(plan) is not None and all(mesh.size(a) <= 1 for a, _, _ in DATA_SPLIT_LIMITS):
        return "data"
    return "fsdp"


def _first_copy(plan: Plan, name: str) -> str:
    """blocks.3.moe.router.weight -> blocks.0.moe.router.weight (the name in the repeat's first copy)."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1].isdigit() and any(
            n.is_repeat and n.name == parts[0] for n in plan.graph.layers):
        parts[1] = "0"
    return ".".join(parts)



def _pipeline(plan: Plan, doc: Document) -> list[Diagnostic]:
    """torch.distributed.pipelining in the torch target: one module per stage, exactly one tensor passed
    from stage to stage, the model inputs fed to the first stage and the loss targets to the last."""
    out: list[Diagnostic] = []

    def err(node, msg, help):
        out.append(Diagnostic(codes.E049, msg, doc.pos(node.path + ("name",)), help=help))

    _, problems = pipeline_flow(plan)
    for node, msg in problems:
        err(node, msg, help="restructure the layers so that one tensor flows from stage to stage, or change the "
            "`stage:` fields")
    for n in plan.graph.layers:
        if n.is_repeat and sequence_parallel(plan, n):
            err(n, f"`{n.name}`: the torch target does not run sequence parallelism in a pipeline yet",
                help="do not rule the sequence axis to `tensor` in a pipelined model")
    if plan.spec.training.remat != "none" and not any(n.is_repeat for n in plan.graph.layers):
        err(plan.graph.layers[0], "the torch target rematerialises repeated blocks in a pipeline; this model has "
            "none", help="use `remat: none`, or a repeated block")
    return out


@dataclasses.dataclass(frozen=True)
class StageFlow:
    """What one pipeline stage runs and what passes between stages (more than one stage)."""

    index: int
    units: tuple  # (node, start, end): top-level layers in order; start/end: the copies of a repeat
    inputs: tuple[str, ...]  # the model inputs the stage reads (the first stage only)
    receives: str | None  # the tensor from the previous stage (None on the first)
    sends: str  # the tensor for the next stage; the loss prediction on the last
    copies: tuple[str, ...] = ()  # embedding layers of other stages whose table a tied layer here reads (a copy)


def pipeline_flow(plan: Plan) -> tuple[list[StageFlow], list[tuple[object, str]]]:
    """Stage by stage: the layers, the model inputs read and the one tensor passed on; and the problems
    (node, message) that keep exactly one tensor from flowing from each stage to the next."""
    pp = plan.pipeline
    graph = plan.graph
    n = len(pp.stages)
    inputs = [i.name for i in graph.inputs]
    units: list[list] = [[] for _ in range(n)]
    begins: dict[str, int] = {}  # node -> the first stage that runs it
    ends: dict[str, int] = {}  # node -> the stage that computes its output
    for node in graph.layers:
        spans = pp.repeat_split.get(node.name) if node.is_repeat else None
        if spans and len(spans) > 1:
            used = [(s, a, b) for s, (a, b) in enumerate(spans) if b > a]
            for s, a, b in used:
                units[s].append((node, a, b))
            begins[node.name], ends[node.name] = used[0][0], used[-1][0]
        else:
            s = pp.layer_stage[node.name]
            units[s].append((node, 0, node.count) if node.is_repeat else (node, None, None))
            begins[node.name] = ends[node.name] = s
    problems: list[tuple[object, str]] = []
    crossing: list[list[str]] = [[] for _ in range(n - 1)]  # boundary b: from stage b to stage b + 1
    readers: list[dict[str, object]] = [{} for _ in range(n - 1)]  # boundary b: tensor -> a layer beyond it
    first_inputs: set[str] = set()
    copies: list[list[str]] = [[] for _ in range(n)]  # per stage: the embedding layers whose table it copies
    for node in graph.layers:
        s = begins[node.name]
        for name in node.inputs:
            if name in inputs:
                if s > 0:
                    msg = (f"`{node.name}` reads the model input `{name}` on pipeline stage {s}; the torch target "
                           "feeds the model inputs to the first stage only")
                    problems.append((node, msg))
                first_inputs.add(name)
                continue
            for b in range(ends[name], s):
                if name not in crossing[b]:
                    crossing[b].append(name)
                    readers[b][name] = node
        for b in range(begins[node.name], ends[node.name]):
            crossing[b].append(node.name)  # a repeat split over stages passes its stream on
            readers[b][node.name] = node
        tie = None if node.is_repeat else node.attrs.get("tie")
        owner = tie.split(".")[0] if tie else None
        if owner in ends and ends[owner] != s:
            # the stage holds a copy of the table, its gradient summed with the table's after the backward pass
            # (tied_tables); two stages of one pipe rank would hold it twice under one name
            if ends[owner] % plan.pipeline.pipe == s % plan.pipeline.pipe:
                msg = (f"`{node.name}` is tied to `{tie}`, which is on pipeline stage {ends[owner]}, a stage of the "
                       f"same pipe rank as stage {s}: the torch target holds a tied table's copies on different "
                       "pipe ranks")
                problems.append((node, msg))
            elif owner not in copies[s]:
                copies[s].append(owner)
    loss = graph.loss
    if loss.targets not in inputs:
        msg = (f"the loss targets `{loss.targets}` are not a model input; the torch pipeline gives the last stage "
               "its targets from the model inputs")
        problems.append((graph.layers[-1], msg))
    if loss.prediction in ends:
        for b in range(ends[loss.prediction], n - 1):
            if loss.prediction not in crossing[b]:
                crossing[b].append(loss.prediction)
                readers[b][loss.prediction] = graph.layers[-1]
    for b, names in enumerate(crossing):
        if len(names) != 1:
            # the layer that reads the last of the tensors (usually the one that should not cross)
            node = readers[b][names[-1]] if names else (units[b + 1][0][0] if units[b + 1] else graph.layers[-1])
            what = ", ".join(f"`{x}`" for x in names) or "nothing"
            msg = (f"pipeline stage {b} would pass {what} to stage {b + 1}; the torch target passes exactly one "
                   "tensor from stage to stage")
            problems.append((node, msg))
    flows = []
    for s in range(n):
        sends = loss.prediction if s == n - 1 else (crossing[s][0] if len(crossing[s]) == 1 else "")
        receives = None if s == 0 else (crossing[s - 1][0] if len(crossing[s - 1]) == 1 else "")
        mine = tuple(i for i in inputs if i in first_inputs) if s == 0 else ()
        flows.append(StageFlow(s, tuple(units[s]), mine, receives, sends, tuple(copies[s])))
    return flows, problems


def tied_tables(plan: Plan) -> dict[str, tuple[int, ...]]:
    """The embedding tables that tied layers of other pipeline stages read: table parameter -> the pipe ranks
    holding it, the embedding's first, then those holding a copy (Megatron's embedding group: each copy
    initialised as the table, and after the backward pass their gradients summed over these ranks, within
    each replica, so that every copy takes the same update). Empty without a pipeline."""
    pp = plan.pipeline
    if pp is None or len(pp.stages) < 2:
        return {}
    flows, _ = pipeline_flow(plan)
    owners = {node.name: f.index for f in flows for node, _, _ in f.units}
    out: dict[str, tuple[int, ...]] = {}
    for f in flows:
        for node, _, _ in f.units:
            name = None if node.is_repeat else node.attrs.get("tie")
            table = (name or "").rsplit(".", 1)[0]
            if table in f.copies and f.index % pp.pipe not in out.get(name, ()):
                out[name] = out.get(name, (owners[table] % pp.pipe,)) + (f.index % pp.pipe,)
    return out


def sequence_parallel(plan: Plan, rep: RepeatNode) -> bool:
    """Does the plan split the sequence axis of this repeat's residual stream ([seq, dim]) over `tensor`?
    The torch target then runs the block sequence-parallel (SequenceParallel between the tensor-parallel
    layers), the way the plan's costs assume."""
    t = plan.mesh.tensor
    if t <= 1 or len(rep.out.shape) != 2 or not rep.out.axes[0]:
        return False
    return "tensor" in plan.rule(rep.out.axes[0]) and rep.out.shape[0] % t == 0


def data_parallel(plan: Plan) -> str:
    """How the torch program replicates over the batch axes: "hsdp" / "fsdp" (FSDP2 fully_shard on the (data,
    fsdp) mesh / over fsdp, or over `data` where parameters are split over it: shard_axis; also data x tensor
    and data x pipe, with an fsdp axis of size 1, which keeps the tensor-parallel DTensors DTensors and
    survives the interleaved schedules), "zero2" (replicated over data, gradients reduce-scattered onto the
    ranks that update them), "zero1" (a pipeline with ZeRO-1: replicated over data, gradients all-reduced by
    the program), "ddp" (DistributedDataParallel over data x expert, without fsdp and tensor) or "none"."""
    mesh = plan.mesh
    D, Fs, T = mesh.data, mesh.fsdp, mesh.tensor
    P, X = mesh.pipe, mesh.expert
    if shard_axis(plan) == "data":
        return "fsdp"  # parameters split over `data`: FSDP2 over the data axis
    zero = plan.spec.training.zero
    if P > 1 and D > 1 and zero and Fs == 1 and T == 1 and X == 1:
        # ZeRO in a pipeline: the stages replicated over data without FSDP2, their gradients reduced by the
        # program (Shards.take_grads: all-reduced for ZeRO-1, reduce-scattered for ZeRO-2)
        return "zero2" if zero >= 2 else "zero1"
    if Fs > 1 or (T > 1 and (D > 1 or X > 1)) or (P > 1 and (D > 1 or X > 1)):
        # (expert x tensor, expert x pipe: FSDP2 with fsdp = 1, as beside `data`; the experts are its ignored
        # parameters, and the program averages the others' gradients over `expert` too)
        return "hsdp" if D > 1 else "fsdp"
    if D > 1 and X == 1 and plan.spec.training.zero >= 2:
        return "zero2"
    return "ddp" if D * X > 1 else "none"
