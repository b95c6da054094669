"""Context parallelism in the targets that run it (capability `mesh_axes` holding `context`): the checks
that turn what their programs do not run into E049 at validate time (docs/program.md "Context parallelism").

The programs split the sequence of every activation over `context` in the load-balanced order (rank r holds
chunks r and 2n-1-r of 2n), run attention as ring attention, give position embeddings the global positions,
and keep parameters whole over `context` (gradients reduced over it). So they need: a sequence that every
activation has as its first dimension, 2n chunks of it, layers that act per position or attend over it
(Op.context_role: dropout keeps the one-device masks, batch_norm's channels are the positions) or gather the
whole sequence (moe), and no other split of the sequence or of anything over `context`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import codes
from ..axes import CONTEXT
from ..diagnostics import Diagnostic
from ..ops import OPS

if TYPE_CHECKING:
    from ..planner.plan import Plan
    from ..source import Document


AXIS = CONTEXT  # the mesh axis (axes.py)

def context_errors(plan: Plan, doc: Document, target: str) -> list[Diagnostic]:
    """E049 for a plan over `context` (degree > 1) that `target`'s programs cannot run."""
    n = plan.mesh.size(AXIS)
    if n <= 1:
        return []
    out: list[Diagnostic] = []
    where = doc.pos(plan.mesh.source)

    def err(pos, msg, help):
        out.append(Diagnostic(codes.E049, f"the {target} target does not run {msg}", pos, help=help))

    seq = plan.context_sequence_axis
    if seq is None:
        err(where, "context parallelism on a model without a named sequence to split",
            "the `context` axis splits the sequence that attention layers attend over (their input's first "
            "dimension, a named dimension such as `seq`); drop the axis for this model")
        return out
    mesh = plan.mesh
    others = [a for a in ("pipe", "expert") if mesh.size(a) > 1]
    if others:
        err(where, f"the `context` mesh axis with {', '.join(f'`{a}`' for a in others)}",
            "context parallelism combines with data, fsdp and tensor; drop one of the axes")
    if plan.spec.hf is not None:
        err(doc.pos(("hf",), key=True), "an imported model (`hf`) with the `context` mesh axis",
            "its `--logits` compare whole sequences in their order, which the programs hold split and reordered; "
            "build it on a mesh without `context` (checkpoints resume on any mesh)")
    tr = plan.spec.training
    if tr.zero:
        err(doc.pos(("training", "zero")), f"`training.zero: {tr.zero}` with the `context` mesh axis",
            "use `training.zero: 0` (or an fsdp axis, which shards the parameters and optimizer state)")
    if tr.remat == "selective":
        err(doc.pos(("training", "remat")), "`training.remat: selective` with the `context` mesh axis",
            "ring attention's key/value blocks are recomputed unplanned under that policy; use `none` or `full`")
    for logical, path in plan.rules.paths.items():
        if AXIS in plan.rules.table.get(logical, ()):
            err(doc.pos(path), f"a rule naming `context` (`{logical}`)",
                "the `context` axis splits the sequence by itself; leave it out of `sharding.rules`")
        elif logical == seq and plan.rule(logical):
            err(doc.pos(path), f"the sequence `{seq}` split over another mesh axis as well as `context`",
                f"leave `{seq}` out of `sharding.rules` (no sequence parallelism with context parallelism)")
    for glob in plan.spec.sharding.params:
        if any(AXIS in (e if isinstance(e, list) else [e]) for e in plan.spec.sharding.params[glob]):
            err(doc.pos(("sharding", "params", glob)), "parameters split over `context`",
                "parameters stay whole over `context`; split them over `fsdp` or `tensor`")
    for name in plan.spec.sharding.inputs:
        err(doc.pos(("sharding", "inputs", name), key=True), f"an explicit layout of input `{name}` with the "
            "`context` mesh axis", f"leave `{name}` out of `sharding.inputs`: the programs split its sequence "
            "over `context`")
    lengths = set()
    for i in plan.graph.inputs:
        if not i.type.shape or i.type.axes[0] != seq:
            err(where, f"context parallelism on the input `{i.name}` {i.type.show()}, whose first dimension is "
                f"not the sequence `{seq}`", "every model input must be [batch, seq, ...] to split over `context`")
        else:
            lengths.add(i.type.shape[0])
    reported = set()
    for n_ in plan.graph.nodes():
        op = OPS[n_.op]
        if op.context_role(n_.attrs) is None and n_.path not in reported:
            reported.add(n_.path)
            why = "draws random numbers (its masks would follow the split)" if op.is_random(n_.attrs) else (
                "mixes sequence positions")
            err(doc.pos(n_.path + ("name",)), f"{n_.op} layer `{n_.name}` on a sequence split over `context`: it "
                f"{why}", "context parallelism runs per-position layers (dropout and batch_norm included), "
                "embeddings, mlp, attention and moe")
        elif any(not t.shape or t.axes[0] != seq for t in (*n_.in_types, n_.out)) and n_.path not in reported:
            reported.add(n_.path)
            err(doc.pos(n_.path + ("name",)), f"`{n_.name}` on a sequence split over `context`: its input or "
                f"output does not have the sequence `{seq}` as its first dimension",
                "every activation must be [batch, seq, ...] to split over `context`")
    for length in sorted(lengths):
        if length % (2 * n):
            err(where, f"a sequence of {length} positions over context={n}",
                f"the programs give each rank two of {2 * n} equal chunks (causal load balancing): use a sequence "
                f"length divisible by {2 * n}")
    return out
