"""What every lowering checks: the E049 diagnostics for a plan a target's capabilities (targets/) do not
cover, decided here, above the planner, once per (plan, target); and the helpers that read a plan's layouts
the way the targets' programs run them (tensor-parallel styles, vocab-parallel layers)."""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, ClassVar

from .. import codes
from ..diagnostics import Diagnostic
from ..ops import OPS
from ..ops.loss import LOSSES
from ..targets.base import Capabilities, Target
from .communication import communication_errors
from .context_parallel import context_errors
from .offload import offload_errors

if TYPE_CHECKING:
    from ..planner.plan import Plan
    from ..source import Document


def _a(word: str) -> str:
    """`word` with its indefinite article (an attention layer, a linear layer)."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def layout_text(spec) -> str:
    return "[" + ", ".join(",".join(d) if d else "-" for d in spec) + "]"


def scopes(plan: Plan):
    """(prefix of the first copy, nodes) for the top level and each repeated block (first copy suffices)."""
    yield "", list(plan.graph.layers)
    for n in plan.graph.layers:
        if n.is_repeat:
            yield f"{n.name}.0.", list(n.layers)


def tensor_dims(plan: Plan, name: str) -> tuple[int, ...]:
    """The dimensions of parameter `name` that are split over the tensor axis."""
    p = plan.param(name)
    return tuple(i for i, d in enumerate(p.spec) if "tensor" in d)


def linear_style(plan: Plan, weight: str) -> str:
    """colwise (output features split), rowwise (input features split) or replicate, for [in, out] weights."""
    dims = tensor_dims(plan, weight)
    return "colwise" if dims == (1,) else "rowwise" if dims == (0,) else "replicate" if not dims else "both"


def _neighbour(plan: Plan, prefix: str, nodes: list, i: int, step: int) -> str | None:
    """The tensor-parallel style of the nearest linear layer before (step -1) or after (+1) nodes[i], across
    element-wise layers only."""
    j = i + step
    while 0 <= j < len(nodes):
        n = nodes[j]
        if n.is_repeat:
            return None
        if OPS[n.op].tensor_parallel == "matmul" and n.attrs.get("tie") is None:
            return linear_style(plan, f"{prefix}{n.name}.weight")
        if not OPS[n.op].elementwise:
            return None
        j += step
    return None


def vocab_parallel_layers(plan: Plan) -> tuple[set[str], set[str]]:
    """Top-level (embedding tables split on their vocabulary over `tensor`, column-parallel output layers
    whose logits go straight to a cross_entropy loss): the layers Megatron's vocab-parallel embedding and
    parallel cross-entropy run."""
    tables: set[str] = set()
    heads: set[str] = set()
    for node in plan.graph.layers:
        if node.is_repeat:
            continue
        if OPS[node.op].tieable and node.params and tensor_dims(plan, f"{node.name}.weight") == (0,):
            tables.add(node.name)
        elif (OPS[node.op].tensor_parallel == "matmul" and LOSSES[plan.graph.loss.op].class_targets
              and node.name == plan.graph.loss.prediction
              and (node.attrs.get("tie") or linear_style(plan, f"{node.name}.weight") == "colwise")):
            heads.add(node.name)
    return tables, heads


def tensor_parallel_errors(plan: Plan, doc: Document, name: str, title: str, vocab_parallel: bool = False,
                           kinds: tuple[str, ...] = ("matmul", "pair")) -> list[Diagnostic]:
    """E049 for the layouts over `tensor` that Megatron-style tensor parallelism (the torch and mlx
    targets) cannot run: a column-parallel linear followed by a row-parallel one with only element-wise
    layers between, attention and mlp with every input projection split on its outputs and the output
    projection on its inputs; no other operator split. With `vocab_parallel`, also an embedding table split
    on its vocabulary and a column-parallel (or tied to such a table) output layer whose logits a
    cross_entropy loss reads (vocab_parallel_layers). `kinds`: the operators' tensor_parallel kinds the
    target runs besides (ops/base.py): "experts" (a moe layer's experts and shared experts split on their
    hidden features, as its handled_dims say, or not at all), "gather" (any split: stored split, gathered
    for use)."""
    out: list[Diagnostic] = []
    tables, heads = vocab_parallel_layers(plan) if vocab_parallel else (set(), set())
    tp_ops = ", ".join(k for k, op in OPS.items() if op.tensor_parallel in kinds)

    def err(node, msg, help=None):
        out.append(Diagnostic(codes.E049, msg, doc.pos(node.path + ("name",)), help=help))

    for prefix, nodes in scopes(plan):
        for i, node in enumerate(nodes):
            if node.is_repeat or not node.params:
                continue
            full = prefix + node.name
            styles = {p.name: tensor_dims(plan, f"{full}.{p.name}") for p in node.params}
            kind = OPS[node.op].tensor_parallel
            kind = kind if kind in kinds else None
            if prefix == "" and (node.name in tables or node.name in heads):
                continue  # vocab-parallel
            if kind == "matmul" and not node.attrs.get("tie"):
                style = linear_style(plan, f"{full}.weight")
                if style == "both":
                    err(node, f"`{node.name}`: a linear layer split on both dimensions over `tensor`")
                elif style == "colwise" and _neighbour(plan, prefix, nodes, i, +1) != "rowwise":
                    err(node, f"`{node.name}` is column-parallel (output features over `tensor`) but is not "
                        "followed by a row-parallel linear layer",
                        help=f"{title} tensor parallelism pairs a column-parallel linear with a row-parallel one, "
                        "with only element-wise activations between")
                elif style == "rowwise" and _neighbour(plan, prefix, nodes, i, -1) != "colwise":
                    err(node, f"`{node.name}` is row-parallel (input features over `tensor`) but does not follow "
                        "a column-parallel linear layer",
                        help="shard the previous linear layer's output features with the same mesh axis")
            elif kind == "pair":
                # [in, out] weights: the input projections split on dim 1, the output projection on dim 0
                first = [d for n, d in styles.items() if OPS[node.op].handled_dims.get(n) == (1,)]
                last = [d for n, d in styles.items() if n.endswith("weight") and OPS[node.op].handled_dims.get(n) == (0,)]
                ok = (all(d == (1,) for d in first) and all(d == (0,) for d in last)) or (
                    all(not d for d in first + last))
                if not ok:
                    err(node, f"`{node.name}`: {title} tensor parallelism needs every input projection split on "
                        "its output features and the output projection on its input features (or none split)",
                        help="shard `heads`/`kv_heads` (attention) or `mlp` (mlp) over `tensor` together")
            elif kind == "experts":
                handled = OPS[node.op].handled_dims
                if any(styles.values()) and any(d != handled.get(n, ()) for n, d in styles.items()):
                    if node.attrs["activation"] == "swiglu":
                        err(node, f"`{node.name}`: {title} tensor parallelism splits a moe layer's swiglu experts "
                            "and shared experts on their hidden features, together (experts.gate/up and "
                            "shared.gate/up on their outputs, experts.down and shared.down on their inputs), or "
                            "not at all",
                            help="rule `mlp` to `tensor` and leave the router, the experts' other dimensions and "
                            "shared_gate whole")
                    else:
                        err(node, f"`{node.name}`: {title} tensor parallelism splits a moe layer's experts on their "
                            "hidden features (experts.fc on its outputs, experts.proj on its inputs) or not at all",
                            help="rule `mlp` to `tensor` and leave the router, the experts' other dimensions and "
                            "experts.proj.bias whole")
            elif kind == "gather":
                pass  # stored split, gathered whole for use
            elif any(styles.values()):
                err(node, f"`{node.name}`: the {name} target cannot split {_a(node.op)} layer over `tensor`",
                    help=f"tensor parallelism applies to {tp_ops} layers in the {name} target")
    return out


def aux_loss_left_out(plan: Plan) -> str | None:
    """Why generate.py is left out of a build of a language model with layers of a loss of their own (moe, with
    dropless routing: Op.decodes), or None: it samples them on a mesh without `pipe` and `context` (their
    load-balancing loss crosses neither the pipelined build's stages nor its prediction pass, and under
    context parallelism the training program's moe layer gathers the whole sequence)."""
    if plan.language_model is None or (plan.mesh.pipe <= 1 and plan.mesh.context <= 1):
        return None
    ops = sorted({n.op for n in plan.graph.nodes() if OPS[n.op].has_aux_loss})
    if not ops:
        return None
    axis = "pipe" if plan.mesh.pipe > 1 else "context"
    return (f"generate.py does not sample {', '.join(ops)} layers in a build over `{axis}` yet; sample from a "
            "build without it (a checkpoint resumes on any mesh)")


class Lowering:
    """One target's lowering: its declaration (`target`, in targets/), the checks that refuse what its
    program cannot run (E049), the cost model's options for its program, and `lower` (program.py), which
    turns a plan into the Program its templates render. Subclasses add their checks in `check_more`."""

    target: ClassVar[Target]

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def title(self) -> str:
        return self.target.title

    @property
    def capabilities(self) -> Capabilities:
        return self.target.capabilities

    def reduction_calls(self, plan: Plan) -> int | None:
        """How many calls the program issues the data-parallel gradient reduction of a step in (the cost
        model's CostOptions.reduction_calls); None: one call of all the gradients, or not known."""
        return None

    def sharded_layers(self, plan: Plan) -> int:
        """Layers of one pipe rank the program runs as sharded-tensor modules, whose every op goes through a
        dispatch in Python (the cost model's CostOptions.sharded_layers); 0: none (compiled or plain arrays)."""
        return 0

    def check(self, plan: Plan, doc: Document) -> list[Diagnostic]:
        """E049 for everything in `plan` this target cannot run."""
        out: list[Diagnostic] = []
        cap = self.capabilities

        def refuse(path: Any, what: str, help: str, pos=None) -> None:
            out.append(Diagnostic(codes.E049, f"the {self.name} target does not support {what}",
                                  pos or doc.pos(path), help=help))

        for axis in plan.mesh.axes:
            if axis not in cap.mesh_axes and plan.mesh.size(axis) > 1:
                refuse(None, f"the `{axis}` mesh axis", cap.reason(axis, f"supported axes: {', '.join(cap.mesh_axes)}"),
                       pos=doc.pos(plan.mesh.source))
        if "context" in cap.mesh_axes:
            out += context_errors(plan, doc, self.name)
        tr = plan.spec.training
        if tr.zero not in cap.zero_stages:
            way = (f"supported: {', '.join(map(str, cap.zero_stages))}" if cap.zero_stages != (0,)
                   else "use an fsdp mesh axis (ZeRO-3), which this target implements" if "fsdp" in cap.mesh_axes
                   else "keep the optimizer state replicated (`training.zero: 0`)")
            refuse(("training", "zero"), f"`training.zero: {tr.zero}`", cap.reason("zero", way))
        pr = tr.precision
        if getattr(pr, "master_weights", False) and not cap.master_weights:
            refuse(("training", "precision", "master_weights"), "`precision.master_weights`",
                   cap.reason("master_weights", "keep parameters in float32 (`precision.params: float32`)"))
        if pr.float8 and not cap.float8:
            refuse(("training", "precision", "float8"), "`precision.float8` (FP8 linear layers)",
                   cap.reason("float8", "build for the torch target (torchao.float8), or set `precision.float8: "
                              "false`"))
        if tr.remat not in cap.remat:
            refuse(("training", "remat"), f"`training.remat: {tr.remat}`",
                   cap.reason("remat", f"supported: {', '.join(cap.remat)}"))
        if pr.compute not in cap.compute_dtypes:
            refuse(("training", "precision", "compute"), f"computing in {pr.compute}",
                   cap.reason(pr.compute, f"supported compute dtypes: {', '.join(cap.compute_dtypes)}"))
        if pr.params not in cap.param_dtypes:
            refuse(("training", "precision", "params"), f"{pr.params} parameters",
                   cap.reason(pr.params, f"supported parameter dtypes: {', '.join(cap.param_dtypes)}"))
        for params, compute, help in cap.dtype_limits:
            if pr.params == params and pr.compute == compute:
                refuse(("training", "precision", "compute"), f"computing in {compute} with {params} parameters",
                       help)
        if cap.ops is not None:
            for _, nodes in scopes(plan):
                for node in nodes:
                    if not node.is_repeat and node.op not in cap.ops:
                        refuse(node.path + ("op",), f"the `{node.op}` operator",
                               cap.reason(node.op, f"operators it renders: {', '.join(sorted(cap.ops))}"))
        if not cap.data_param_layouts and plan.mesh.data_enabled:
            split = next((pp for pp in plan.params if any("data" in d for d in pp.spec)), None)
            if split is not None:
                glob = next((g for g in plan.spec.sharding.params if fnmatch.fnmatchcase(split.name, g)), None)
                refuse(split.param.path if glob is None else ("sharding", "params", glob), f"parameters split over the `data` axis (`{split.name}` is laid out as "
                       f"{layout_text(split.spec)})", cap.reason(
                           "data_param_layouts", "split parameters over `fsdp` (ZeRO-3) instead, and keep `data` "
                           "for the batch"))
        if not cap.input_layouts:
            explicit = plan.spec.sharding.inputs
            for ip in plan.inputs:
                if ip.input.name not in explicit:
                    continue
                usual = (tuple(plan.batch_axes),) + ((),) * (len(ip.spec) - 1)
                if tuple(map(tuple, ip.spec)) != usual:
                    refuse(("sharding", "inputs", ip.input.name), f"the layout {layout_text(ip.spec)} of input "
                           f"`{ip.input.name}`", cap.reason(
                               "input_layouts", f"leave `{ip.input.name}` out of `sharding.inputs`: its batch is "
                               f"then split over the batch axes ({layout_text(usual)}), the other dimensions whole"))
        if not cap.global_batch_statistics and plan.dp_degree > 1:
            for _, nodes in scopes(plan):
                for node in nodes:
                    if not node.is_repeat and OPS[node.op].batch_statistics:
                        out.append(Diagnostic(
                            codes.E049, f"`{node.name}`: {node.op} under data parallelism would use per-rank "
                            f"statistics in the {self.name} target, not the global batch's",
                            doc.pos(node.path + ("name",)),
                            help="use layer_norm or rms_norm, or a single data shard"))
        pp = plan.pipeline
        if pp is not None and len(pp.stages) > 1:
            if pp.schedule not in cap.pipeline_schedules:
                refuse(("pipeline", "schedule"), f"the `{pp.schedule}` pipeline schedule", cap.reason(
                    "pipeline", f"supported schedules: {', '.join(cap.pipeline_schedules) or 'none'}"))
            if not cap.explicit_stages and not pp.repeat_split:
                first = next((n for n in plan.graph.layers if n.stage is not None), None)
                field = "stage" if first else "device"
                first = first or next(iter(plan.graph.placed), plan.graph.layers[0])
                out.append(Diagnostic(
                    codes.E049, f"the {self.name} target pipelines one repeated block split evenly over the stages; it "
                    f"does not support explicit `{field}:` placement yet", doc.pos(first.path + (field,)),
                    help=f"remove the `{field}:` fields: the planner then splits the repeated block evenly"))
            if tr.zero and not cap.zero_with_pipeline:
                refuse(("training", "zero"), f"`training.zero: {tr.zero}` with a pipeline",
                       cap.reason("zero_pipeline", "shard over `fsdp` instead (ZeRO-3), which the pipeline supports"))
            if plan.spec.eval is not None and not cap.eval_with_pipeline:
                refuse(("eval",), "evaluation (`eval`) in a pipelined build",
                       cap.reason("eval", "build it without the `pipe` mesh axis (a one-stage build evaluates the same "
                                  "samples), or leave out `eval`"), pos=doc.pos(("eval",), key=True))
            for _, nodes in scopes(plan):
                for node in nodes:
                    why = None if node.is_repeat or node.op in cap.pipelined_ops else (
                        OPS[node.op].pipeline_limit(node.attrs))
                    if why:
                        out.append(Diagnostic(
                            codes.E049, f"`{node.name}`: the {self.name} target does not support {why} in a "
                            "pipelined model yet", doc.pos(node.path + self.target.pipeline_limit_field),
                            help="drop the `pipe` mesh axis, or change the layer"))
        out += communication_errors(self.target, plan, doc)
        out += offload_errors(self.target, plan, doc)
        out += self.check_more(plan, doc)
        return out

    def files_for(self, plan: Plan) -> tuple[tuple[str, str], ...]:
        """The (template, output file) pairs a build of `plan` renders: the target's `files_for` less what its
        lowering leaves out (`left_out`)."""
        left = self.left_out(plan)
        return tuple((t, name) for t, name in self.target.files_for(plan) if name not in left)

    def left_out(self, plan: Plan) -> dict[str, str]:
        """The files a build of `plan` would have but this target leaves out, each with why (`build` says so)."""
        return {}

    def check_more(self, plan: Plan, doc: Document) -> list[Diagnostic]:
        return []
