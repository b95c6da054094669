"""The MLX target's lowering (targets/mlx.py declares it): what its program cannot run (E049)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import codes
from ..diagnostics import Diagnostic
from ..ops import OPS
from ..targets.mlx import _ONE_GROUP, MlxTarget
from .base import Lowering, scopes, tensor_parallel_errors

if TYPE_CHECKING:
    from ..planner.plan import Plan
    from ..source import Document


class MlxLowering(Lowering):
    target = MlxTarget()

    def left_out(self, plan: Plan) -> dict[str, str]:
        """generate.py runs in one process, where every parameter is whole: not in a build over `tensor`."""
        if plan.language_model is None or plan.mesh.tensor <= 1:
            return {}
        return {"generate.py": "the mlx generate.py runs in one process, which a build over `tensor` does not "
                "hold the whole model in; build the spec with a mesh without `tensor` (e.g. --mesh data=1) and "
                "sample from the file of --export-params (--params)"}

    def check_more(self, plan: Plan, doc: Document) -> list[Diagnostic]:
        mesh = plan.mesh
        if not mesh.tensor_enabled:
            return []
        if mesh.data_enabled:
            return [Diagnostic(codes.E049, "the mlx target does not combine the `tensor` mesh axis with `data`",
                               doc.pos(plan.mesh.source),
                               help=_ONE_GROUP + ": use a mesh of `tensor` alone, or of `data` alone")]
        out = tensor_parallel_errors(plan, doc, "mlx", "MLX")
        for prefix, nodes in scopes(plan):
            for node in nodes:
                op = None if node.is_repeat else OPS[node.op]
                if op is not None and op.is_random(node.attrs) and not op.random_tensor_parallel:
                    out.append(Diagnostic(
                        codes.E049, f"`{node.name}`: the mlx target runs no dropout above rate 0 in a tensor-parallel "
                        "build (its masks on split features would differ from the one-device run)",
                        doc.pos(node.path + ("rate",)), help="set the rate to 0, or drop the `tensor` axis"))
                if op is not None and node.attrs.get("qk_norm"):
                    out.append(Diagnostic(
                        codes.E049, f"`{node.name}`: the mlx target does not run q/k norms (qk_norm) in a tensor-parallel "
                        "build (each process's heads give a part of the norms' gradients, which it does not sum)",
                        doc.pos(node.path + ("qk_norm",)), help="drop the `tensor` axis (or use jax or torch)"))
        for n in plan.graph.layers:
            if n.is_repeat and len(n.out.shape) == 2 and n.out.axes[0] and "tensor" in plan.rule(n.out.axes[0]):
                out.append(Diagnostic(
                    codes.E049, f"`{n.name}`: the mlx target does not split the sequence over `tensor` (sequence "
                    "parallelism)", doc.pos(n.path + ("name",)),
                    help="do not rule the sequence axis to `tensor`"))
        return out
