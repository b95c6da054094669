"""What each target can express. A plan a target cannot run is a diagnostic (E049) at build time, naming
what the target supports, never a crash inside the generated program."""

from __future__ import annotations

import dataclasses

from ..diagnostics import Diagnostic
from ..graph import Node, RepeatNode
from ..source import Document
from .plan import Plan

ELEMENTWISE = {"relu", "gelu", "silu", "tanh", "sigmoid", "dropout"}

# Attribute and method names of torch.nn.Module: a layer with one of these names would be shadowed.
TORCH_MODULE_ATTRS = {
    "add_module", "apply", "bfloat16", "buffers", "children", "compile", "cpu", "cuda", "double", "dump_patches",
    "eval", "extra_repr", "float", "forward", "get_buffer", "get_extra_state", "get_parameter", "get_submodule",
    "half", "ipu", "load_state_dict", "modules", "mtia", "named_buffers", "named_children", "named_modules",
    "named_parameters", "parameters", "register_backward_hook", "register_buffer", "register_forward_hook",
    "register_forward_pre_hook", "register_full_backward_hook", "register_full_backward_pre_hook",
    "register_load_state_dict_post_hook", "register_load_state_dict_pre_hook", "register_module",
    "register_parameter", "register_state_dict_post_hook", "register_state_dict_pre_hook", "requires_grad_",
    "set_extra_state", "set_submodule", "share_memory", "state_dict", "to", "to_empty", "train", "training",
    "type", "xpu", "zero_grad", "call_super_init", "T_destination",
}  # fmt: skip

SUPPORTED = {"jax": ("pipe", "data", "fsdp", "expert", "tensor"),
             "torch": ("pipe", "data", "fsdp", "expert", "tensor")}


def tensor_dims(plan: Plan, name: str) -> tuple[int, ...]:
    """The dimensions of parameter `name` that are split over the tensor axis."""
    p = plan.param(name)
    return tuple(i for i, d in enumerate(p.spec) if "tensor" in d)


def linear_style(plan: Plan, weight: str) -> str:
    """colwise (output features split), rowwise (input features split) or replicate, for [in, out] weights."""
    dims = tensor_dims(plan, weight)
    return "colwise" if dims == (1,) else "rowwise" if dims == (0,) else "replicate" if not dims else "both"


def check_target(plan: Plan, doc: Document, target: str) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for axis in plan.mesh.axes:
        if axis not in SUPPORTED[target]:
            out.append(Diagnostic(
                "E049", f"the {target} target does not support the `{axis}` mesh axis yet", doc.pos(plan.mesh.source),
                help=f"supported axes: {', '.join(SUPPORTED[target])}"))
    tr = plan.spec.training
    # The jax target implements ZeRO-1/2 and float32 master weights (templates/jax/train.py.j2).
    if getattr(tr, "zero", 0) and target != "jax":
        out.append(Diagnostic("E049", f"the {target} target does not implement `training.zero: {tr.zero}` yet",
                              doc.pos(("training", "zero")),
                              help="use an fsdp mesh axis (ZeRO-3), which both targets implement"))
    if getattr(tr.precision, "master_weights", False) and target != "jax":
        out.append(Diagnostic("E049", f"the {target} target does not implement `precision.master_weights` yet",
                              doc.pos(("training", "precision", "master_weights")),
                              help="keep parameters in float32 (`precision.params: float32`)"))
    if target == "torch":
        out += _torch(plan, doc)
    if target == "jax":
        out += _jax(plan, doc)
    return out


def _jax(plan: Plan, doc: Document) -> list[Diagnostic]:
    """The JAX target renders every operator; a pipeline (more than one stage) has the limits below."""
    pp = plan.pipeline
    if pp is None or pp.pipe <= 1:
        return []
    return _jax_pipeline(plan, doc)


def _jax_pipeline(plan: Plan, doc: Document) -> list[Diagnostic]:
    """The jax target pipelines one repeated block, split evenly over the stages (the planner's automatic
    split; templates/jax/train.py.j2 "Pipeline"). The layers before and after it run outside the pipeline
    on every pipe rank, so they may not read what the other side computes."""
    out: list[Diagnostic] = []
    pp = plan.pipeline

    def err(path, msg, help):
        out.append(Diagnostic("E049", msg, doc.pos(path), help=help))

    if not pp.repeat_split:
        first = next((n for n in plan.graph.layers if n.stage is not None), plan.graph.layers[0])
        err(first.path + ("stage",), "the jax target pipelines one repeated block split evenly over the stages; "
            "it does not support explicit `stage:` fields yet",
            help="remove the `stage:` fields: the planner then splits the repeated block evenly")
        return out
    tr = plan.spec.training
    if tr.zero:
        err(("training", "zero"), f"the jax target does not combine `training.zero: {tr.zero}` with a pipeline yet",
            help="shard over `fsdp` instead (ZeRO-3), which the pipeline supports")
    (name,) = pp.repeat_split
    at = next(i for i, n in enumerate(plan.graph.layers) if n.name == name)
    rep = plan.graph.layers[at]
    for _, nodes in _scopes(plan):
        for node in nodes:
            if not isinstance(node, Node):
                continue
            what = {"moe": "moe layers (their load-balancing loss does not cross the pipeline yet)",
                    "batch_norm": "batch_norm (running statistics per stage)",
                    "dropout": "dropout with a rate above 0 (masks per micro-batch and stage)"}.get(node.op)
            if what and not (node.op == "dropout" and not node.attrs["rate"]):
                err(node.path + ("op",), f"`{node.name}`: the jax target does not support {what} in a pipelined "
                    "model yet", help="drop the `pipe` mesh axis, or change the layer")
    if len(rep.inputs) != 1:
        err(rep.path + ("name",), f"`{name}`: the jax target pipelines a repeated block with one input",
            help="give the block one input (block_input)")
    # the layers after the block run in the last stage (1f1b) or after the pipeline: they see the block's
    # output, later layers and the model inputs, never the layers before the block
    before = {n.name for n in plan.graph.layers[:at]}
    for n in plan.graph.layers[at + 1:]:
        bad = [i for i in n.inputs if i in before]
        if bad:
            err(n.path + ("name",), f"`{n.name}` reads `{bad[0]}` from before the pipelined block `{name}`: the jax "
                "target runs the layers after the block apart from those before it",
                help="let the layers after the block read only its output, later layers and the model inputs")
    loss = plan.graph.loss
    for role, t in (("prediction", loss.prediction), ("targets", loss.targets)):
        if t in before:
            err(("model", "loss"), f"the loss reads `{t}` ({role}) from before the pipelined block `{name}`",
                help="compute the loss from the layers after the block or the model inputs")
    return out


def _scopes(plan: Plan):
    """(prefix of the first copy, nodes) for the top level and each repeated block (first copy suffices)."""
    yield "", [n for n in plan.graph.layers]
    for n in plan.graph.layers:
        if isinstance(n, RepeatNode):
            yield f"{n.name}.0.", list(n.layers)


def _torch(plan: Plan, doc: Document) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    tp = plan.mesh.sizes["tensor"] > 1
    dp = plan.dp_degree > 1

    def err(node, msg, help=None):
        out.append(Diagnostic("E049", msg, doc.pos(node.path + ("name",)), help=help))

    pr = plan.spec.training.precision
    if pr.params != "float32" and pr.compute == "float32":  # (zero and master_weights: check_target)
        out.append(Diagnostic(
            "E049", f"the torch target does not compute in float32 with {pr.params} parameters",
            doc.pos(("training", "precision", "compute")),
            help="store parameters in float32 and compute in bfloat16 (FSDP2 MixedPrecisionPolicy or autocast)"))
    for n in plan.graph.layers:
        if isinstance(n, RepeatNode) and torch_sequence_parallel(plan, n):
            for node in n.layers:
                if node.op not in SP_OPS or (node.op == "dropout" and node.attrs["rate"] > 0):
                    err(node, f"`{node.name}`: the torch target cannot run a {node.op} layer on a sequence split "
                        "over `tensor` (sequence parallelism)",
                        help=f"sequence-parallel blocks hold {', '.join(sorted(SP_OPS))} (dropout only with "
                        "rate 0); or do not rule the sequence axis to `tensor`")
                elif node.op in ("attention", "mlp") and not any(
                        tensor_dims(plan, f"{n.name}.0.{node.name}.{p.name}") for p in node.params):
                    err(node, f"`{node.name}`: under sequence parallelism the torch target needs {node.op} layers "
                        "split over `tensor`", help="rule `heads`/`kv_heads` (attention) or `mlp` to `tensor`")

    out += _torch_experts(plan, doc)
    if plan.pipeline is not None and len(plan.pipeline.stages) > 1:
        out += _torch_pipeline(plan, doc)

    for prefix, nodes in _scopes(plan):
        for i, node in enumerate(nodes):
            if node.name in TORCH_MODULE_ATTRS:
                err(node, f"layer name `{node.name}` clashes with torch.nn.Module.{node.name}",
                    help="rename the layer (names are shared by every target)")
            elif node.name.startswith("_") or node.name in FSDP_MODULE_ATTRS:
                what = "FSDPModule" if node.name in FSDP_MODULE_ATTRS else "torch.nn.Module's internal attributes"
                err(node, f"layer name `{node.name}` clashes with {what} in the torch target",
                    help="rename the layer (names are shared by every target)")
            if not isinstance(node, Node):
                continue
            name = prefix + node.name
            if node.op == "batch_norm" and dp:
                err(node, f"`{node.name}`: batch_norm under data parallelism would use per-rank statistics in "
                    "PyTorch, not the global batch's", help="use layer_norm or rms_norm, or a single data shard")
            if not tp or not node.params:
                continue
            styles = {p.name: tensor_dims(plan, f"{name}.{p.name}") for p in node.params}
            if node.op == "linear":
                style = linear_style(plan, f"{name}.weight")
                if style == "both":
                    err(node, f"`{node.name}`: a linear layer split on both dimensions over `tensor`")
                elif style == "colwise" and _neighbour(plan, prefix, nodes, i, +1) != "rowwise":
                    err(node, f"`{node.name}` is column-parallel (output features over `tensor`) but is not "
                        "followed by a row-parallel linear layer",
                        help="PyTorch tensor parallelism pairs a column-parallel linear with a row-parallel one, "
                        "with only element-wise activations between")
                elif style == "rowwise" and _neighbour(plan, prefix, nodes, i, -1) != "colwise":
                    err(node, f"`{node.name}` is row-parallel (input features over `tensor`) but does not follow "
                        "a column-parallel linear layer",
                        help="shard the previous linear layer's output features with the same mesh axis")
            elif node.op in ("attention", "mlp"):
                first = [d for n, d in styles.items() if n.split(".")[0] in ("q", "k", "v", "fc", "gate", "up")
                         and n.endswith("weight")]
                last = [d for n, d in styles.items() if n.split(".")[0] in ("o", "proj", "down")
                        and n.endswith("weight")]
                ok = (all(d == (1,) for d in first) and all(d == (0,) for d in last)) or (
                    all(not d for d in first + last))
                if not ok:
                    err(node, f"`{node.name}`: PyTorch tensor parallelism needs every input projection split on "
                        "its output features and the output projection on its input features (or none split)",
                        help="shard `heads`/`kv_heads` (attention) or `mlp` (mlp) over `tensor` together")
            elif any(styles.values()):
                err(node, f"`{node.name}`: the torch target cannot split a {node.op} layer over `tensor`",
                    help="tensor parallelism applies to linear, attention and mlp layers in the torch target")
    return out


def _torch_experts(plan: Plan, doc: Document) -> list[Diagnostic]:
    """Expert parallelism in the torch target: the experts of every moe layer split over `expert` (dim 0,
    DTensor Shard(0)), tokens sent to them with all-to-all; everything else data parallel (DDP) over
    data x expert. So the expert axis goes with data alone, and only the experts are split over it."""
    out: list[Diagnostic] = []
    sizes = plan.mesh.sizes
    if sizes.get("expert", 1) <= 1:
        return out
    others = [a for a in ("pipe", "fsdp", "tensor") if sizes.get(a, 1) > 1]
    if others:
        out.append(Diagnostic(
            "E049", f"the torch target combines the `expert` mesh axis with `data` only, not with "
            f"{', '.join(f'`{a}`' for a in others)}", doc.pos(plan.mesh.source),
            help="use a mesh of data and expert axes for expert parallelism in the torch target"))
    moe_params = set()
    for prefix, nodes in _scopes(plan):
        for node in nodes:
            if not (isinstance(node, Node) and node.op == "moe"):
                continue
            for p in node.params:
                if p.name.startswith("experts."):
                    moe_params.add(f"{prefix}{node.name}.{p.name}")
            for p in node.params:
                if not p.name.startswith("experts."):
                    continue
                spec = plan.param(f"{prefix}{node.name}.{p.name}").spec
                if tuple(spec[0]) != ("expert",) or any(spec[1:]):
                    out.append(Diagnostic(
                        "E049", f"`{node.name}`: the torch target splits a moe layer's experts over exactly the "
                        f"`expert` axis (its `{p.name}` is laid out as {_layout(spec)})",
                        doc.pos(node.path + ("name",)),
                        help="rule the `experts` axis to `expert` alone (the default) and leave the other "
                        "dimensions of the experts whole"))
                    break
    for pp in plan.params:
        if "expert" in {a for d in pp.spec for a in d} and _first_copy(plan, pp.name) not in moe_params:
            out.append(Diagnostic(
                "E049", f"`{pp.name}` is split over `expert`; the torch target splits only the experts of moe "
                "layers over that axis", doc.pos(plan.mesh.source),
                help="rule no logical axis but `experts` to the `expert` mesh axis"))
            break
    return out


def _layout(spec) -> str:
    return "[" + ", ".join(",".join(d) if d else "-" for d in spec) + "]"


def _first_copy(plan: Plan, name: str) -> str:
    """blocks.3.moe.router.weight -> blocks.0.moe.router.weight (the name in the repeat's first copy)."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1].isdigit() and any(
            isinstance(n, RepeatNode) and n.name == parts[0] for n in plan.graph.layers):
        parts[1] = "0"
    return ".".join(parts)


def _torch_pipeline(plan: Plan, doc: Document) -> list[Diagnostic]:
    """torch.distributed.pipelining in the torch target: one module per stage, exactly one tensor passed
    from stage to stage, the model inputs fed to the first stage and the loss targets to the last."""
    out: list[Diagnostic] = []

    def err(node, msg, help):
        out.append(Diagnostic("E049", msg, doc.pos(node.path + ("name",)), help=help))

    _, problems = pipeline_flow(plan)
    for node, msg in problems:
        err(node, msg, help="restructure the layers so that one tensor flows from stage to stage, or change the "
            "`stage:` fields")
    for n in plan.graph.layers:
        if isinstance(n, RepeatNode) and torch_sequence_parallel(plan, n):
            err(n, f"`{n.name}`: the torch target does not run sequence parallelism in a pipeline yet",
                help="do not rule the sequence axis to `tensor` in a pipelined model")
    if plan.spec.training.remat != "none" and not any(isinstance(n, RepeatNode) for n in plan.graph.layers):
        err(plan.graph.layers[0], "the torch target rematerialises repeated blocks in a pipeline; this model has "
            "none", help="use `remat: none`, or a repeated block")
    for _, nodes in _scopes(plan):
        for node in nodes:
            if not isinstance(node, Node):
                continue
            what = {"moe": "moe layers (their load-balancing loss does not cross the pipeline yet)",
                    "batch_norm": "batch_norm (running statistics per micro-batch)",
                    "dropout": "dropout with a rate above 0 (masks per micro-batch and stage)"}.get(node.op)
            if what and not (node.op == "dropout" and not node.attrs["rate"]):
                err(node, f"`{node.name}`: the torch target does not support {what} in a pipelined model yet",
                    help="drop the `pipe` mesh axis, or change the layer")
    return out


@dataclasses.dataclass(frozen=True)
class StageFlow:
    """What one pipeline stage runs and what passes between stages (more than one stage)."""

    index: int
    units: tuple  # (node, start, end): top-level layers in order; start/end: the copies of a repeat
    inputs: tuple[str, ...]  # the model inputs the stage reads (the first stage only)
    receives: str | None  # the tensor from the previous stage (None on the first)
    sends: str  # the tensor for the next stage; the loss prediction on the last


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
        spans = pp.repeat_split.get(node.name) if isinstance(node, RepeatNode) else None
        if spans and len(spans) > 1:
            used = [(s, a, b) for s, (a, b) in enumerate(spans) if b > a]
            for s, a, b in used:
                units[s].append((node, a, b))
            begins[node.name], ends[node.name] = used[0][0], used[-1][0]
        else:
            s = pp.layer_stage[node.name]
            units[s].append((node, 0, node.count) if isinstance(node, RepeatNode) else (node, None, None))
            begins[node.name] = ends[node.name] = s
    problems: list[tuple[object, str]] = []
    crossing: list[list[str]] = [[] for _ in range(n - 1)]  # boundary b: from stage b to stage b + 1
    readers: list[dict[str, object]] = [{} for _ in range(n - 1)]  # boundary b: tensor -> a layer beyond it
    first_inputs: set[str] = set()
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
        tie = node.attrs.get("tie") if isinstance(node, Node) else None
        owner = tie.split(".")[0] if tie else None
        if owner in ends and ends[owner] != s:
            msg = f"`{node.name}` is tied to `{tie}`, which is on pipeline stage {ends[owner]}, not on stage {s} with it"
            problems.append((node, msg))
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
        flows.append(StageFlow(s, tuple(units[s]), mine, receives, sends))
    return flows, problems


# Methods fully_shard adds to a module (FSDP2's FSDPModule): a layer of that name would be shadowed.
FSDP_MODULE_ATTRS = {
    "reshard", "unshard", "set_is_last_backward", "set_requires_gradient_sync", "set_requires_all_reduce",
    "set_reshard_after_forward", "set_reshard_after_backward", "set_modules_to_forward_prefetch",
    "set_modules_to_backward_prefetch", "set_all_reduce_hook", "set_post_optim_event",
    "set_reduce_scatter_divide_factor", "set_gradient_divide_factor", "set_force_sum_reduction_for_comms",
    "set_unshard_in_backward", "set_custom_all_gather", "set_custom_reduce_scatter", "share_comm_ctx",
    "set_allocate_memory_from_process_group_for_comm",
}  # fmt: skip

# Operators a torch sequence-parallel block may hold: per-position ones, and tensor-parallel attention / mlp.
SP_OPS = {"relu", "gelu", "silu", "tanh", "sigmoid", "softmax", "dropout", "add", "mul", "layer_norm", "rms_norm",
          "linear", "attention", "mlp"}


def torch_sequence_parallel(plan: Plan, rep: RepeatNode) -> bool:
    """Does the plan split the sequence axis of this repeat's residual stream ([seq, dim]) over `tensor`?
    The torch target then runs the block sequence-parallel (SequenceParallel between the tensor-parallel
    layers), the way the plan's costs assume."""
    t = plan.mesh.sizes.get("tensor", 1)
    if t <= 1 or len(rep.out.shape) != 2 or not rep.out.axes[0]:
        return False
    raw = plan.spec.sharding.rules
    items = list(raw.items()) if isinstance(raw, dict) else [(k, v) for k, v in raw]
    rules = {k: ((v,) if isinstance(v, str) else tuple(v or ())) for k, v in items}
    return "tensor" in rules.get(rep.out.axes[0], ()) and rep.out.shape[0] % t == 0


def _neighbour(plan: Plan, prefix: str, nodes: list, i: int, step: int) -> str | None:
    j = i + step
    while 0 <= j < len(nodes):
        n = nodes[j]
        if isinstance(n, Node) and n.op == "linear" and n.attrs.get("tie") is None:
            return linear_style(plan, f"{prefix}{n.name}.weight")
        if not (isinstance(n, Node) and n.op in ELEMENTWISE):
            return None
        j += step
    return None
