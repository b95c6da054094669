"""E049 for activation offload (`training.offload`) a target cannot run: not at all, not under the spec's
remat setting, or not on some mesh axis (Capabilities.offload_remat / offload_without)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import codes
from ..diagnostics import Diagnostic

if TYPE_CHECKING:
    from ..planner.plan import Plan
    from ..source import Document
    from ..targets.base import Target


def offload_errors(target: Target, plan: Plan, doc: Document) -> list[Diagnostic]:
    tr = plan.spec.training
    if tr.offload_threshold() is None:
        return []
    cap = target.capabilities
    where = doc.pos(("training", "offload", "activations"))

    def refuse(what: str, help: str) -> list[Diagnostic]:
        return [Diagnostic(codes.E049, f"the {target.name} target does not support activation offload{what}", where,
                           help=help)]

    if not cap.offload_remat:
        return refuse("", cap.reason("offload", "leave `training.offload` out for this target"))
    if tr.remat not in cap.offload_remat:
        return refuse(f" with `training.remat: {tr.remat}`",
                      cap.reason("offload_remat", f"offload with remat {' or '.join(cap.offload_remat)}"))
    axes = [a for a in cap.offload_without if plan.mesh.size(a) > 1]
    if axes:
        return refuse(f" on the `{axes[0]}` mesh axis", cap.reason(
            f"offload_{axes[0]}", f"offload on a mesh without {', '.join(f'`{a}`' for a in cap.offload_without)}"))
    return []
