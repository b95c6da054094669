"""The JAX target's lowering (targets/jax.py declares it): what its program cannot run (E049) and how it
pipelines (pipelined_repeats, read by its render adapter too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import codes
from ..diagnostics import Diagnostic
from ..targets.jax import JaxTarget
from .base import Lowering, aux_loss_left_out
from .communication import jax_communication_errors

if TYPE_CHECKING:
    from ..planner.plan import Plan
    from ..source import Document


class JaxLowering(Lowering):
    target = JaxTarget()

    def left_out(self, plan: Plan) -> dict[str, str]:
        """generate.py of a pipelined build runs the pipelined copies stage after stage (templates/jax/generate.py.j2
        pipelined_stages): not for copies from several repeats nor stages padded to the largest."""
        why = aux_loss_left_out(plan)
        if why:
            return {"generate.py": why}
        if plan.language_model is None or samples_through_pipeline(plan):
            return {}
        return {"generate.py": "the jax program samples a pipeline of one repeated block split into stages of "
                "equal size only, and this one's stages are padded or hold several repeats; sample from a build "
                "without the `pipe` axis, or with the torch target (a checkpoint resumes on any mesh)"}

    def check_more(self, plan: Plan, doc: Document) -> list[Diagnostic]:
        out = jax_communication_errors(plan, doc)
        pp = plan.pipeline
        if pp is None or pp.pipe <= 1:
            return out
        return out + _pipeline(plan, doc)


def samples_through_pipeline(plan: Plan) -> bool:
    """Whether generate.py can run a pipelined build's copies through its stages (true without a pipeline): the
    copies of one repeat, every stage holding as many (no padding rows)."""
    pp = plan.pipeline
    if pp is None or pp.pipe <= 1:
        return True
    return len(pipelined_repeats(plan)) == 1 and len({len(s) for s in pp.stage_copies}) == 1


def pipelined_repeats(plan: Plan) -> list:
    """The repeats whose copies the jax pipeline runs: every repeated block of the model (targets/jax.py
    `_pipeline` accepts consecutive repeats, each reading the one before, of one block or of several)."""
    return [n for n in plan.graph.layers if n.is_repeat]


def _pipeline(plan: Plan, doc: Document) -> list[Diagnostic]:
    """The jax target pipelines the copies of consecutive repeats (the planner's even split, or `stage:` /
    `device:` placement, possibly uneven, each stage padded to the largest stage's copies; of several blocks,
    each stage runs its own copies and holds as many rows of each block as the stage with the most of it:
    templates/jax/pipeline.py.j2). The layers before and after them run outside the pipeline
    on every pipe rank, so they may not read what the other side computes."""
    out: list[Diagnostic] = []

    def err(path, msg, help):
        out.append(Diagnostic(codes.E049, msg, doc.pos(path), help=help))

    reps = pipelined_repeats(plan)
    if not reps:
        err(plan.graph.layers[0].path + ("name",), "the jax target pipelines the copies of a repeated block, and "
            "this model has none", help="write the layers to pipeline as a `repeat:` of a block")
        return out
    rep = reps[0]
    name = rep.name
    at = next(i for i, n in enumerate(plan.graph.layers) if n.name == name)
    for k, n in enumerate(reps[1:], 1):
        prev = reps[k - 1]
        if plan.graph.layers[at + k] is not n:
            between = plan.graph.layers[at + k]
            err(between.path + ("name",), f"`{between.name}` runs between the repeats `{prev.name}` and `{n.name}`: the "
                "jax target pipelines consecutive copies of one block", help=f"move `{between.name}` before "
                f"`{name}` or after `{reps[-1].name}`, or build for the torch target")
        elif tuple(n.inputs) != (prev.name,) or n.in_types != rep.in_types or n.out != rep.out:
            err(n.path + ("name",), f"`{n.name}` does not read `{prev.name}` alone: the jax target pipelines a chain "
                "of copies, each reading the one before (of one shape)", help=f"let `{n.name}` take `{prev.name}`'s "
                "output")
        elif n.block != rep.block and any(inner.buffers for r in reps for inner in r.layers):
            bn = next(inner for r in reps for inner in r.layers if inner.buffers)
            err(n.path + ("block",), f"`{n.name}` repeats block `{n.block}` and `{name}` block `{rep.block}`, and "
                f"`{bn.name}` keeps running statistics: the jax target pipelines stages of several blocks without "
                "batch_norm only", help="use layer_norm or rms_norm in the pipelined blocks, repeat one block, or "
                "build for the torch target")
    if out:
        return out
    at_last = at + len(reps) - 1
    if len(rep.inputs) != 1:
        err(rep.path + ("name",), f"`{name}`: the jax target pipelines a repeated block with one input",
            help="give the block one input (block_input)")
    # the layers after the block run in the last stage (1f1b) or after the pipeline: they see the block's
    # output, later layers and the model inputs, never the layers before the block
    # (and the pipelined repeats but the last: their outputs stay inside the pipeline)
    before = {n.name for n in plan.graph.layers[:at_last]}
    for n in plan.graph.layers[at_last + 1:]:
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
