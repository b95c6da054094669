"""Automatic planning: search meshes and remat settings for a device count and a hardware profile, and
suggest changes when a plan does not fit (diagnostic E050).

Every candidate mesh is checked by the real planner (`make_plan` with a `--mesh` override, so divisibility,
batch splitting and layout checks are the ones `plan` applies), then costed under each remat setting.
Candidates that fit in device memory are ranked by predicted step time.

Searched axes: data, fsdp, tensor. Not searched (reported as such, NOT_SEARCHED): pipe, because a pipeline
also needs its schedule and micro-batches, and expert, which needs moe layers. Both targets run them;
`plan --mesh pipe=..,expert=..` costs a chosen split.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..diagnostics import Diagnostic, DiagnosticError
from ..graph import Graph
from ..source import Document
from ..spec.root import Spec
from .costs import REMAT_MODES, CostOptions, Costs, estimate, estimate_remats
from .hardware import Hardware
from .plan import Plan, make_plan

SEARCH_AXES = ("data", "fsdp", "tensor")
NOT_SEARCHED = {
    "pipe": "not searched (a pipeline also needs its schedule and micro-batches); `plan --mesh pipe=..` costs one",
    "expert": "not searched (experts need an moe layer); `plan --mesh expert=..` costs a given split",
}


@dataclasses.dataclass(frozen=True)
class Candidate:
    sizes: tuple[tuple[str, int], ...]  # (axis, size) for the searched axes
    remat: str
    costs: Costs

    @property
    def mesh(self) -> str:
        return ",".join(f"{a}={n}" for a, n in self.sizes)

    @property
    def argument(self) -> str:
        return f"--mesh {self.mesh}"

    @property
    def fits(self) -> bool:
        return bool(self.costs.fits)

    @property
    def step_s(self) -> float:
        t = self.costs.time
        return t.step_s if t is not None else float("inf")

    def to_json(self) -> dict[str, Any]:
        t = self.costs.time
        return {
            "mesh": dict(self.sizes), "argument": self.argument, "remat": self.remat, "fits": self.fits,
            "peak_bytes": self.costs.peak, "step_s": t.step_s if t else None, "mfu": t.mfu if t else None,
        }


@dataclasses.dataclass(frozen=True)
class Rejected:
    sizes: tuple[tuple[str, int], ...]
    code: str
    message: str

    @property
    def mesh(self) -> str:
        return ",".join(f"{a}={n}" for a, n in self.sizes)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    devices: int
    hardware: Hardware
    candidates: tuple[Candidate, ...]  # every valid (mesh, remat), best first: fitting by step time, then the rest
    rejected: tuple[Rejected, ...]
    meshes: int  # factorizations tried

    @property
    def fitting(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.candidates if c.fits)

    def to_json(self, top: int = 10) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "hardware": self.hardware.name,
            "meshes_tried": self.meshes,
            "searched_axes": list(SEARCH_AXES),
            "not_searched": dict(NOT_SEARCHED),
            "candidates": [c.to_json() for c in self.candidates[:top]],
            "fitting": len(self.fitting),
            "rejected": [{"mesh": r.mesh, "code": r.code, "message": r.message} for r in self.rejected],
        }


def factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """Every ordered k-tuple of positive integers whose product is n."""
    if k == 1:
        return [(n,)]
    out = []
    for d in range(1, n + 1):
        if n % d == 0:
            out += [(d,) + rest for rest in factorizations(n // d, k - 1)]
    return out


def search(spec: Spec, doc: Document, graph: Graph, devices: int, hardware: Hardware,
           remats: tuple[str, ...] = REMAT_MODES, options: Optional[CostOptions] = None) -> SearchResult:
    options = options or CostOptions()
    cands: list[Candidate] = []
    rejected: list[Rejected] = []
    meshes = factorizations(devices, len(SEARCH_AXES))
    for sizes in meshes:
        named = tuple(zip(SEARCH_AXES, sizes))
        arg = ",".join(f"{a}={n}" for a, n in named)
        try:
            plan = make_plan(spec, doc, graph, arg, devices)
        except DiagnosticError as e:
            first = next((d for d in e.diagnostics if d.severity == "error"), e.diagnostics[0])
            rejected.append(Rejected(named, first.code, first.message))
            continue
        for r, costs in estimate_remats(plan, hardware, remats, options).items():
            cands.append(Candidate(named, r, costs))
    # equal predicted times (compute hidden behind communication) prefer less recompute, then less memory
    cands.sort(key=lambda c: (not c.fits, float(f"{c.step_s:.4g}") if c.fits else c.costs.peak,
                              c.costs.flops.recompute, c.costs.peak))
    return SearchResult(devices, hardware, tuple(cands), tuple(rejected), len(meshes))


# ---------------------------------------------------------------- does it fit?


def _human(n: float) -> str:
    from .table import human_bytes

    return human_bytes(int(n))


def fit_diagnostics(spec: Spec, doc: Document, graph: Graph, plan: Plan, hardware: Hardware, costs: Costs,
                    options: Optional[CostOptions] = None, mesh_label: str = "") -> list[Diagnostic]:
    """E050 when the predicted peak exceeds the device's usable memory, with changes predicted to fit."""
    if costs.fits is not False:
        return []
    options = options or CostOptions()
    s = costs.worst
    hints = fit_hints(spec, doc, graph, plan, hardware, costs, options)
    path = plan.mesh.source if plan.mesh.source and plan.mesh.source[0] != "cli" else ("mesh",)
    msg = (f"predicted peak memory {_human(s.peak)} per device exceeds the {_human(hardware.usable_bytes)} usable "
           f"on {hardware.name}{mesh_label} (states {_human(s.states.total)}, activations "
           f"{_human(s.activations.total)}, temporaries {_human(s.temporaries.total)})")
    fit = [h for h in hints if not h.startswith("another mesh")]
    other = [h for h in hints if h.startswith("another mesh")]
    if fit:
        help_ = "predicted to fit: " + "; ".join(fit) + ("; or " + other[0] if other else "")
    else:
        help_ = ("no single change tried fits (remat, zero, fsdp, grad_accum); " + (other[0] if other else
                 "use more devices or a device with more memory"))
    return [Diagnostic("E050", msg, doc.pos(path), help=help_)]


def fit_hints(spec: Spec, doc: Document, graph: Graph, plan: Plan, hardware: Hardware, costs: Costs,
              options: CostOptions, limit: int = 4) -> list[str]:
    out: list[str] = []
    tr = spec.training
    mesh = plan.mesh

    def fits(p: Plan, **kw) -> Optional[Costs]:
        c = estimate(p, hardware, dataclasses.replace(options, **kw))
        return c if c.fits else None

    # 1. recompute activations
    order = REMAT_MODES.index(costs.remat)
    for r in REMAT_MODES[order + 1:]:
        c = fits(plan, remat=r)
        if c:
            out.append(f"`training.remat: {r}` (peak {_human(c.peak)})")
            break
    # 2. ZeRO over the data axes
    if plan.dp_degree > 1 and costs.zero < 2:
        for z in range(costs.zero + 1, 3):
            p = dataclasses.replace(plan, spec=_with_training(spec, zero=z))
            c = fits(p)
            if c:
                out.append(f"`training.zero: {z}` (peak {_human(c.peak)})")
                break
    # 3. more fsdp (move the data axis onto fsdp)
    if mesh.sizes["data"] > 1:
        sizes = dict(mesh.sizes)
        sizes["fsdp"] *= sizes["data"]
        sizes["data"] = 1
        arg = ",".join(f"{a}={n}" for a, n in sizes.items() if n > 1) or "data=1"
        p = _try_plan(spec, doc, graph, arg)
        c = fits(p) if p else None
        if c:
            out.append(f"`--mesh {arg}` (shard over fsdp instead of data; peak {_human(c.peak)})")
    # 4. smaller micro-batches
    for k in (2, 4, 8, 16):
        accum = tr.grad_accum * k
        if tr.batch_size % (accum * plan.dp_degree):
            continue
        new = _with_training(spec, grad_accum=accum)
        p = _try_plan(new, doc, graph, _mesh_arg(plan))
        c = fits(p) if p else None
        if c:
            out.append(f"`training.grad_accum: {accum}` (micro-batch {tr.batch_size // accum}; peak "
                       f"{_human(c.peak)})")
            break
    # 5. another mesh on as many devices: searching them all is `plan --auto` (seconds on large models)
    if mesh.devices > 1 and not any("--mesh" in h for h in out):
        out.append(f"another mesh: `mithril-spec plan SPEC --auto --devices {mesh.devices} --hardware "
                   f"{hardware.name}` searches them")
    return out[:limit]


def _mesh_arg(plan: Plan) -> str:
    return ",".join(f"{a}={n}" for a, n in plan.mesh.sizes.items() if n > 1) or "data=1"


def _try_plan(spec: Spec, doc: Document, graph: Graph, mesh_arg: str) -> Optional[Plan]:
    try:
        return make_plan(spec, doc, graph, mesh_arg)
    except DiagnosticError:
        return None


def _with_training(spec: Spec, **changes) -> Spec:
    tr = spec.training.model_copy(update=changes)
    return spec.model_copy(update={"training": tr})
