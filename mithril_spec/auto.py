"""Automatic planning: search meshes and training settings for a device count and a hardware profile, and
suggest changes when a plan does not fit (diagnostic E050).

The search space is every mesh axis (context parallelism's `context` included, for a model with a sequence
that attention attends over) and every knob (`KNOBS`: pipeline, grad_accum, zero, sequence_parallel, offload,
compression; and remat) that all the spec's `targets` can build (their registry entries, mithril_spec/targets).
A knob is one entry of `KNOBS`: the spec value it sets, the values worth trying on a mesh, and the fragment of
a spec that sets it (what `plan --auto --write` writes).

Every candidate is planned by the real planner (`make_plan` with a `--mesh` override on the spec with the
knob values set, so divisibility, batch splitting, pipeline and layout checks are the ones `plan` applies)
and costed by the cost model; before a candidate is listed, every target of the spec checks it (the E049
checks of `validate`). Search, in two passes:

1. every mesh (prefiltered: tensor within a node, pipe dividing the repeated block or the one an explicit
   placement runs on, expert dividing the experts, the batch dividing over the batch axes; of the ways to
   divide one degree over the axes that split the batch's work, `SPLIT_AXES`, only all-data, all-fsdp and the middle, and all-context where those do not
   fit) is costed under its cheapest settings: the spec's gradient accumulation (1 with a pipeline), ZeRO and
   sequence-parallel rule where accepted, a 1f1b pipeline with the most micro-batches the batch allows, the
   spec's offload setting, gradient compression in the compute dtype where offered; every remat policy (one
   walk);
2. the best meshes and the fastest ones (fitting or not yet: other settings may fit them), `REFINE` of each,
   one per way of splitting the devices other than the split axes, are refined by coordinate descent: each
   knob's values in turn, then the other splits of the split axes, keeping whatever ranks better, until a
   whole pass changes nothing.

Ranking (`rank_key`): fitting candidates first; then predicted step time (equal to 4 significant digits
counts as a tie), then peak memory per device, then uncompressed gradients before compressed ones, then bytes
communicated per device per step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from . import codes
from .axes import MESH_AXES, ParallelDims
from .diagnostics import Diagnostic, DiagnosticError
from .graph import Graph
from .ops import OPS
from .planner.costs import REMAT_MODES, CostOptions, Costs, estimate, estimate_remats
from .planner.hardware import Hardware
from .planner.plan import Plan, make_plan
from .source import Document
from .spec.root import Spec

REFINE = 3  # meshes refined by coordinate descent: the best, and as many of the fastest (fitting or not)
LISTED = 50  # candidates kept (best first)
MAX_VALUES = 6  # values tried per numeric knob (spread geometrically over the valid ones)
WARN_FRACTION = 2 / 3  # warn when the best MFU is below this fraction of the profile's efficiency


# ---------------------------------------------------------------- what the targets allow


@dataclasses.dataclass(frozen=True)
class Allowed:
    """What every target of the spec can build (the intersection of their capabilities)."""

    targets: tuple[str, ...]
    mesh_axes: tuple[str, ...]
    zero_stages: tuple[int, ...]
    zero_with_pipeline: bool
    schedules: tuple[str, ...]
    remat: tuple[str, ...]
    offload_remat: tuple[str, ...]  # remat policies every target offloads activations under (empty: no offload)
    offload_without: tuple[str, ...]  # mesh axes some target does not offload on
    compression: tuple[str, ...]  # gradient compressions every target runs over data-parallel ranks
    explicit_stages: bool = False  # every target runs `stage:` / `device:` placement

    @classmethod
    def of(cls, targets) -> Allowed:
        from .targets import TARGETS

        caps = [TARGETS[t].capabilities for t in targets]
        return cls(tuple(targets),
                   tuple(a for a in MESH_AXES if all(a in c.mesh_axes for c in caps)),
                   tuple(z for z in (0, 1, 2) if all(z in c.zero_stages for c in caps)),
                   all(c.zero_with_pipeline for c in caps),
                   tuple(s for s in ("1f1b", "interleaved", "gpipe") if all(s in c.pipeline_schedules for c in caps)),
                   tuple(r for r in REMAT_MODES if all(r in c.remat for c in caps)),
                   tuple(r for r in REMAT_MODES if all(r in c.offload_remat for c in caps)),
                   tuple(a for a in MESH_AXES if any(a in c.offload_without for c in caps)),
                   tuple(k for k in COMPRESSIONS if all(k in c.compression for c in caps)),
                   all(c.explicit_stages for c in caps))


def refusal(plan: Plan, doc: Document, targets) -> Diagnostic | None:
    """The first E049 any of `targets` reports for `plan` (None: every target builds it)."""
    from .lowering import check_target

    for t in targets:
        for d in check_target(plan, doc, t):
            if d.severity == "error":
                return d
    return None


# ---------------------------------------------------------------- the knobs


@dataclasses.dataclass(frozen=True)
class Context(ParallelDims):
    """What the knobs need to know about the spec and the mesh being searched (a ParallelDims: `ctx.pipe`,
    `ctx.tensor_enabled`)."""

    spec: Spec
    graph: Graph
    allowed: Allowed
    sizes: dict  # mesh axis -> size, every axis
    dp: int  # data-parallel degree (the batch axes)
    seq_axis: str | None  # the logical sequence axis of the repeated block's stream (sequence parallelism)
    repeat_count: int  # copies of the one repeated block (0: none, or more than one)
    # explicit `stage:` / `device:` placement: pipe size -> the virtual stages it gives (empty: none)
    placed: tuple[tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Knob:
    """One setting the search varies. `values(ctx, settings)`: the values to try on this mesh, given the other
    settings; `apply(spec, value, seq)`: the spec with it set; `fragment(spec, value, seq)`: the spec fragment
    (a nested mapping, merged by `extends`) that sets it; `show(value)`: for people. (`seq`: the logical
    sequence axis of the repeated block's stream, what sequence parallelism rules to `tensor`.)"""

    name: str
    values: Callable[[Context, dict], list]
    apply: Callable[[Spec, Any, str | None], Spec]  # (spec, value, the sequence axis)
    fragment: Callable[[Spec, Any, str | None], dict]
    show: Callable[[Any], str]
    initial: Callable[[Context], Any]  # the cheapest setting, costed first


def _training(spec: Spec, **changes) -> Spec:
    return spec.model_copy(update={"training": spec.training.model_copy(update=changes)})


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n > 0 else []


def spread(values: list[int], k: int = MAX_VALUES, keep: tuple = ()) -> list[int]:
    """At most about `k` of the sorted `values`, spread geometrically, always with the smallest, the largest
    and those in `keep`."""
    values = sorted(set(values))
    if len(values) <= k:
        return values
    lo, hi = values[0], values[-1]
    picks = {lo, hi} | {v for v in keep if v in values}
    for i in range(1, k - 1):
        want = lo * (hi / lo) ** (i / (k - 1))
        picks.add(min(values, key=lambda v: abs(math.log(v / want))))
    return sorted(picks)


def _micro_per_rank(ctx: Context, settings: dict) -> int:
    """Samples per data-parallel rank per optimizer step, after gradient accumulation (0: does not divide)."""
    g = settings.get("grad_accum", ctx.spec.training.grad_accum)
    b = ctx.spec.training.batch_size
    return b // (g * ctx.dp) if b % (g * ctx.dp) == 0 else 0


def _pipeline_values(ctx: Context, settings: dict) -> list:
    pipe = ctx.pipe
    if pipe <= 1:
        return [None]
    per = _micro_per_rank(ctx, settings)
    out = []
    # gpipe holds every micro-batch's activations where 1f1b holds `pipe` of them, at the same bubble: it is
    # tried only when some target has no 1f1b
    schedules = [s for s in ctx.allowed.schedules if s != "gpipe" or "1f1b" not in ctx.allowed.schedules]
    placed = dict(ctx.placed)
    for schedule in schedules:
        virtuals = [1]
        if pipe in placed:  # the placement fixes the stages: more than one per device is the interleaved schedule
            virtuals = [placed[pipe]] if (placed[pipe] > 1) == (schedule == "interleaved") else []
        elif schedule == "interleaved":
            virtuals = [v for v in divisors(ctx.repeat_count // pipe) if v > 1][:3] if ctx.repeat_count else []
        for v in virtuals:
            ms = [m for m in divisors(per) if (schedule == "gpipe" or m >= pipe)
                  and (schedule != "interleaved" or m % pipe == 0)]
            out += [(schedule, v, m) for m in spread(ms)]
    return out or [None]


def _pipeline_initial(ctx: Context):
    values = _pipeline_values(ctx, {})
    if values == [None]:
        return None
    plain = [v for v in values if v[1] == 1] or values
    return max(plain, key=lambda v: (v[0] == "1f1b", v[2]))  # the most micro-batches: the smallest bubble


def _set_pipeline(spec: Spec, value, seq=None) -> Spec:
    from .spec.pipeline import Pipeline

    if value is None:
        return spec.model_copy(update={"pipeline": None})
    schedule, v, m = value
    return spec.model_copy(update={"pipeline": Pipeline(microbatches=m, schedule=schedule, virtual_stages=v)})


def _pipeline_fragment(spec: Spec, value, seq=None) -> dict:
    if value is None:
        return {"pipeline": None}
    schedule, v, m = value
    return {"pipeline": {"schedule": schedule, "microbatches": m, "virtual_stages": v}}


def _show_pipeline(value) -> str:
    if value is None:
        return "no pipeline"
    schedule, v, m = value
    return f"{schedule} m={m}" + (f" v={v}" if v > 1 else "")


def _zero_values(ctx: Context, settings: dict) -> list:
    replicated = ctx.data * ctx.expert > 1  # ZeRO shards over the batch axes that replicate
    if not replicated or (ctx.pipe_enabled and not ctx.allowed.zero_with_pipeline):
        return [0]
    return list(ctx.allowed.zero_stages)


def _zero_initial(ctx: Context) -> int:
    z = ctx.spec.training.zero
    return z if z in _zero_values(ctx, {}) else 0


def _accum_values(ctx: Context, settings: dict) -> list:
    m = settings["pipeline"][2] if settings.get("pipeline") else 1
    b = ctx.spec.training.batch_size
    ok = [g for g in divisors(b) if b % (g * ctx.dp * m) == 0]
    return spread(ok, keep=(ctx.spec.training.grad_accum,)) or [1]


def _accum_initial(ctx: Context) -> int:
    g = ctx.spec.training.grad_accum
    if ctx.pipe_enabled:
        return 1  # pipeline micro-batches do what accumulation would, and shrink the bubble besides
    return g if ctx.spec.training.batch_size % (g * ctx.dp) == 0 else 1


def _rules(spec: Spec) -> dict | None:
    rules = spec.sharding.rules
    return dict(rules) if isinstance(rules, dict) else None


def _sp_now(spec: Spec, axis: str | None) -> bool:
    rules = _rules(spec)
    value = rules.get(axis) if rules is not None and axis else None
    return value in ("tensor", ["tensor"])


def _sp_values(ctx: Context, settings: dict) -> list:
    rules = _rules(ctx.spec)
    if not ctx.tensor_enabled or ctx.seq_axis is None or rules is None:
        return [_sp_now(ctx.spec, ctx.seq_axis)]
    if ctx.seq_axis in rules and not _sp_now(ctx.spec, ctx.seq_axis):
        return [False]  # the spec rules the sequence to other axes: not the search's to change
    return [False, True]


def _set_sp(spec: Spec, on: bool, axis: str | None) -> Spec:
    rules = _rules(spec)
    if rules is None or axis is None or _sp_now(spec, axis) == on:
        return spec
    if on:
        rules[axis] = "tensor"
    else:
        rules.pop(axis, None)
    return spec.model_copy(update={"sharding": spec.sharding.model_copy(update={"rules": rules})})


def _sp_fragment(spec: Spec, on: bool, axis: str | None) -> dict:
    return {"sharding": {"rules": {axis: "tensor" if on else None}}} if axis else {}


def _sp_initial(ctx: Context) -> bool:
    now = _sp_now(ctx.spec, ctx.seq_axis)
    return now if now in _sp_values(ctx, {}) else False


def _stream_elements(ctx: Context, settings: dict) -> int:
    """Elements per device of one micro-batch's stream tensor (the repeated block's output, else the largest
    layer output): the scale of the activations the forward pass saves, from which offload thresholds derive."""
    reps = [n for n in ctx.graph.layers if n.is_repeat]
    outs = [reps[0].out] if len(reps) == 1 else [n.out for n in ctx.graph.layers]
    per_sample = max((math.prod(t.shape) for t in outs), default=0)
    pipe = settings.get("pipeline") or (None, 1, 1)
    micro = max(_micro_per_rank(ctx, settings) // pipe[2], 1)
    split = ctx.context * (ctx.tensor if settings.get("sequence_parallel") else 1)
    return micro * per_sample // split


def _offload_values(ctx: Context, settings: dict) -> list:
    """Off, or on with thresholds derived from the stream's elements per device: 0 (every saved tensor moves),
    the stream's size (the block inputs and anything as large: the mlp hidden, attention scores) and four times
    it (only the largest)."""
    if not ctx.allowed.offload_remat or any(ctx.size(a) > 1 for a in ctx.allowed.offload_without):
        return [None]
    s = _stream_elements(ctx, settings)
    return [None] + sorted({0, s, 4 * s} if s else {0})


def _offload_initial(ctx: Context):
    t = ctx.spec.training.offload_threshold()
    return t if t in _offload_values(ctx, {}) else None


def _set_offload(spec: Spec, threshold, seq=None) -> Spec:
    from .spec.training import Offload

    return _training(spec, offload=None if threshold is None else Offload(activations=True, threshold=threshold))


def _offload_fragment(spec: Spec, threshold, seq=None) -> dict:
    return {"training": {"offload": None if threshold is None else {"activations": True, "threshold": threshold}}}


def _show_offload(threshold) -> str:
    return "" if threshold is None else f"offload activations >= {threshold:,} elements"


# The gradient compressions the search knows (a value: `none`, `fp16`, `bf16`, or ("powersgd", rank, start_step)).
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
COMPUTE_CAST = {"bfloat16": "bf16", "float16": "fp16"}  # the cast compression that rounds as the compute does


def _compression_now(spec: Spec):
    c = spec.communication.compression
    return c if isinstance(c, str) else (c.name, c.rank, c.start_step)


def _compression_name(value) -> str:
    return value if isinstance(value, str) else value[0]


def _compression_values(ctx: Context, settings: dict) -> list:
    """`none`; the cast to the compute dtype when the compute is 16-bit (the gradients are already rounded to
    it); and the spec's own compression, whatever it is (naming one opts into it: fp16/bf16 over fp32 compute,
    PowerSGD). Only over data-parallel ranks (nothing to compress otherwise), and only what every target runs."""
    now = _compression_now(ctx.spec)
    if ctx.dp <= 1:
        return [now]
    out = ["none", COMPUTE_CAST.get(ctx.spec.training.precision.compute, "none"), now]
    return list(dict.fromkeys(v for v in out if _compression_name(v) in ctx.allowed.compression)) or [now]


def _compression_initial(ctx: Context):
    """The cast to the compute dtype where offered (the fewest bytes; refinement drops it where that is no
    slower), else the spec's own where offered."""
    values = _compression_values(ctx, {})
    cast = COMPUTE_CAST.get(ctx.spec.training.precision.compute)
    now = _compression_now(ctx.spec)
    return cast if cast in values else now if now in values else values[0]


def _set_compression(spec: Spec, value, seq=None) -> Spec:
    from .spec.communication import PowerSGD

    c = value if isinstance(value, str) else PowerSGD(name="powersgd", rank=value[1], start_step=value[2])
    return spec.model_copy(update={"communication": spec.communication.model_copy(update={"compression": c})})


def _compression_fragment(spec: Spec, value, seq=None) -> dict:
    c = value if isinstance(value, str) else {"name": value[0], "rank": value[1], "start_step": value[2]}
    return {"communication": {"compression": c}}


def _show_compression(value) -> str:
    if value == "none":
        return ""
    return f"{value} compression" if isinstance(value, str) else f"PowerSGD rank {value[1]} compression"


# The knobs searched, in the order refinement tries them: pipeline (schedule, virtual stages, micro-batches),
# grad_accum, zero, sequence_parallel (the rule `SEQ: tensor`), offload (`training.offload`: off, or on at
# thresholds derived from the stream's size, where every target offloads on the mesh) and compression
# (`communication.compression`: none, the cast to a 16-bit compute dtype, or the spec's own; never PowerSGD
# unless the spec names it). The `context` mesh axis is searched as a mesh axis (`SPLIT_AXES`), not a knob.
KNOBS: tuple[Knob, ...] = (
    Knob("pipeline", _pipeline_values, _set_pipeline, _pipeline_fragment, _show_pipeline, _pipeline_initial),
    Knob("grad_accum", _accum_values, lambda s, g, _: _training(s, grad_accum=g),
         lambda s, g, _: {"training": {"grad_accum": g}}, lambda g: f"grad_accum {g}", _accum_initial),
    Knob("zero", _zero_values, lambda s, z, _: _training(s, zero=z), lambda s, z, _: {"training": {"zero": z}},
         lambda z: f"zero {z}", _zero_initial),
    Knob("sequence_parallel", _sp_values, _set_sp, _sp_fragment, lambda on: "sequence parallel" if on else "",
         _sp_initial),
    Knob("offload", _offload_values, _set_offload, _offload_fragment, _show_offload, _offload_initial),
    Knob("compression", _compression_values, _set_compression, _compression_fragment, _show_compression,
         _compression_initial),
)
# remat is a knob too, costed for every policy at once (the cost model shares one model walk across them)
REMAT = Knob("remat", lambda ctx, s: list(ctx.allowed.remat), lambda s, r, _: _training(s, remat=r),
             lambda s, r, _: {"training": {"remat": r}}, lambda r: f"remat {r}", lambda ctx: ctx.allowed.remat[0])
ALL_KNOBS = KNOBS + (REMAT,)


# ---------------------------------------------------------------- candidates


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


@dataclasses.dataclass(frozen=True)
class Candidate:
    sizes: tuple[tuple[str, int], ...]  # (axis, size) for every searched axis
    settings: tuple[tuple[str, Any], ...]  # (knob name, value) for every knob, remat included
    costs: Costs

    @property
    def mesh(self) -> str:
        return ",".join(f"{a}={n}" for a, n in self.sizes if n > 1) or "data=1"

    @property
    def argument(self) -> str:
        return f"--mesh {self.mesh}"

    @property
    def remat(self) -> str:
        return dict(self.settings)["remat"]

    @property
    def fits(self) -> bool:
        return bool(self.costs.fits)

    @property
    def step_s(self) -> float:
        t = self.costs.time
        return t.step_s if t is not None else float("inf")

    @property
    def comm_bytes(self) -> float:
        return sum(c.wire_bytes for c in self.costs.collectives)

    @property
    def key(self) -> tuple:
        return rank_key(self)

    def describe(self) -> str:
        by = {k.name: k for k in ALL_KNOBS}
        return ", ".join(x for x in (by[n].show(v) for n, v in self.settings) if x)

    def to_json(self) -> dict[str, Any]:
        t = self.costs.time
        settings = dict(self.settings)
        if settings.get("pipeline"):
            s, v, m = settings["pipeline"]
            settings["pipeline"] = {"schedule": s, "microbatches": m, "virtual_stages": v}
        if not isinstance(settings.get("compression", "none"), str):
            settings["compression"] = _compression_fragment(None, settings["compression"])["communication"][
                "compression"]
        return {
            "mesh": dict(self.sizes), "argument": self.argument, "remat": self.remat, "settings": settings,
            "fits": self.fits, "peak_bytes": self.costs.peak, "comm_bytes": self.comm_bytes,
            "step_s": t.step_s if t else None, "mfu": t.mfu if t else None,
        }


def rank_key(c: Candidate) -> tuple:
    """Fitting first; then predicted step time (4 significant digits), peak memory, uncompressed gradients
    before compressed ones (compression changes their rounding: chosen only when it is faster), bytes
    communicated."""
    compressed = dict(c.settings).get("compression", "none") != "none"
    return (not c.fits, _sig(c.step_s), c.costs.peak, compressed, _sig(c.comm_bytes))


@dataclasses.dataclass(frozen=True)
class Rejected:
    sizes: tuple[tuple[str, int], ...]
    code: str
    message: str

    @property
    def mesh(self) -> str:
        return ",".join(f"{a}={n}" for a, n in self.sizes if n > 1) or "data=1"


@dataclasses.dataclass(frozen=True)
class SearchResult:
    devices: int
    hardware: Hardware
    candidates: tuple[Candidate, ...]  # accepted by every target, best first (fitting by rank_key, then the rest)
    rejected: tuple[Rejected, ...]  # meshes the planner rejects under every setting tried
    refused: tuple[Rejected, ...]  # candidates a target refuses (E049), one per mesh
    meshes: int  # meshes costed
    pruned: dict  # why meshes were not costed -> how many
    axes: tuple[str, ...]
    knobs: tuple[str, ...]
    evaluations: int  # plans made and costed
    warning: str | None = None

    @property
    def fitting(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.candidates if c.fits)

    @property
    def best(self) -> Candidate | None:
        return self.fitting[0] if self.fitting else None

    def to_json(self, top: int = 10) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "hardware": self.hardware.name,
            "meshes_tried": self.meshes,
            "searched_axes": list(self.axes),
            "searched_knobs": list(self.knobs),
            "pruned": dict(self.pruned),
            "evaluations": self.evaluations,
            "candidates": [c.to_json() for c in self.candidates[:top]],
            "fitting": len(self.fitting),
            "rejected": [{"mesh": r.mesh, "code": r.code, "message": r.message} for r in self.rejected],
            "refused": [{"mesh": r.mesh, "code": r.code, "message": r.message} for r in self.refused],
            "warning": self.warning,
        }


def factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """Every ordered k-tuple of positive integers whose product is n."""
    if k == 1:
        return [(n,)]
    out = []
    for d in divisors(n):
        out += [(d,) + rest for rest in factorizations(n // d, k - 1)]
    return out


# ---------------------------------------------------------------- the search


def searched_axes(spec: Spec, graph: Graph, allowed: Allowed) -> tuple[str, ...]:
    """Mesh axes every target runs, less pipe without a block to pipeline, expert without moe layers and
    context without a sequence that attention attends over (planner/context_parallel.py)."""
    from .planner.context_parallel import attended_axis as attended_sequence

    axes = []
    for a in allowed.mesh_axes:
        if a == "context" and attended_sequence(graph) is None:
            continue
        if a == "pipe" and (not allowed.schedules or not (
                _pipelinable(graph) or (allowed.explicit_stages and placed_pipes(graph)))):
            continue
        if a == "expert" and not _experts(graph):
            continue
        axes.append(a)
    return tuple(axes)


def _pipelinable(graph: Graph) -> bool:
    """One repeated block and no explicit `stage:` or `device:` fields: the planner's even split (what every
    target runs)."""
    return (sum(n.is_repeat for n in graph.layers) == 1 and not graph.placed
            and not any(n.stage is not None for n in graph.layers))


def placed_pipes(graph: Graph) -> tuple[tuple[int, int], ...]:
    """For a model with explicit placement, the `pipe` sizes above 1 it runs on and the virtual stages each
    gives (planner/pipeline.py): `device: K` fields make runs of consecutive layers, which go round
    max(K) + 1 devices; `stage: S` fields make max(S) + 1 stages, on any `pipe` dividing them. Empty without
    placement (a mesh without `pipe` ignores it)."""
    staged = [n.stage for n in graph.layers if n.stage is not None]
    if staged:
        stages = max(staged) + 1
        return tuple((p, stages // p) for p in divisors(stages) if p > 1)
    if not graph.placed:
        return ()
    devices, prev = [], 0
    for n in graph.layers:
        named = [x.device for x in n.layers if x.device is not None] if n.is_repeat else []
        prev = n.device if n.device is not None else named[0] if named else prev
        if not devices or devices[-1] != prev:
            devices.append(prev)
    pipe = max(devices) + 1
    return ((pipe, len(devices) // pipe),) if pipe > 1 and len(devices) % pipe == 0 else ()


def _experts(graph: Graph) -> list[int]:
    out = []
    for n in graph.nodes():
        if OPS[n.op].expert_dims:
            out.append(n.attrs["experts"])
    return out


class Search:
    def __init__(self, spec: Spec, doc: Document, graph: Graph, devices: int, hardware: Hardware,
                 options: CostOptions | None = None, targets=None):
        from .planner.layouts import batch_axes, read_rules

        self.doc, self.graph, self.devices, self.hw = doc, graph, devices, hardware
        self.options = options or CostOptions()
        self.allowed = Allowed.of(targets if targets is not None else spec.targets)
        self.axes = searched_axes(spec, graph, self.allowed)
        reps = [n for n in graph.layers if n.is_repeat]
        self.repeat_count = reps[0].count if len(reps) == 1 else 0
        self.placed = placed_pipes(graph) if self.allowed.explicit_stages else ()
        self.seq_axis = block_sequence_axis(graph)
        self.spec = spec
        self.rules = read_rules(spec, doc, [])
        self._batch_axes = batch_axes
        self.cache: dict[tuple, list] = {}
        self.evaluations = 0
        self.rejected: dict[tuple, Rejected] = {}
        self.refused: dict[tuple, Rejected] = {}
        self._checked: dict[tuple, Diagnostic | None] = {}
        self.plans: dict[tuple, Plan] = {}

    # -- one mesh
    def context(self, sizes: dict) -> Context:
        from .planner.mesh import Mesh

        mesh = Mesh("cli", sizes, ("cli",))
        dp = mesh.degree(self._batch_axes(self.rules, mesh))
        return Context(self.spec, self.graph, self.allowed, sizes, dp, self.seq_axis, self.repeat_count,
                       self.placed)

    def configure(self, settings: dict) -> Spec:
        spec = self.spec
        for k in ALL_KNOBS:
            if k.name in settings:
                spec = k.apply(spec, settings[k.name], self.seq_axis)
        return spec

    def evaluate(self, named: tuple, settings: dict) -> list[Candidate]:
        """Every remat policy for one mesh and one setting of the other knobs (planned once, walked once).
        Knobs that change no planner check nor layout (`REUSE_PLAN`: ZeRO) reuse the plan of the others."""
        key = (named, tuple((k, settings[k]) for k in sorted(settings)))
        if key in self.cache:
            return self.cache[key]
        self.evaluations += 1
        spec = self.configure(settings)
        pkey = _plan_key(named, settings)
        plan = self.plans.get(pkey)
        if plan is None:
            arg = ",".join(f"{a}={n}" for a, n in named)
            try:
                plan = make_plan(spec, self.doc, self.graph, arg, self.devices)
            except DiagnosticError as e:
                first = next((d for d in e.diagnostics if d.severity == "error"), e.diagnostics[0])
                self.rejected.setdefault(named, Rejected(named, first.code, first.message))
                self.cache[key] = []
                return []
            self.plans[pkey] = plan
        plan = dataclasses.replace(plan, spec=spec)
        out = []
        base = tuple((k, settings[k]) for k in (x.name for x in KNOBS))
        for r, costs in estimate_remats(plan, self.hw, self.allowed.remat, self.options).items():
            if settings.get("offload") is not None and not any(st.activations.offload_per_step for st in costs.stages):
                continue  # a threshold no saved tensor reaches under this policy: the same as no offload
            out.append(Candidate(named, base + (("remat", r),), costs))
        self.cache[key] = out
        return out

    def accepted(self, c: Candidate) -> bool:
        """Does every target build it (their E049 checks on the candidate's plan)? Checked once per plan and
        ZeRO stage: the remat policies searched are those every target implements (`Allowed.remat`)."""
        settings = dict(c.settings)
        # remat policies every target implements; but offload and context parallelism accept only some of them
        by_remat = settings.get("offload") is not None or dict(c.sizes).get("context", 1) > 1
        key = (c.sizes, tuple((k, settings[k]) for k in sorted(settings) if by_remat or k != "remat"))
        if key not in self._checked:
            plan = self.plans[_plan_key(c.sizes, settings)]
            spec = self.configure(settings)
            d = refusal(dataclasses.replace(plan, spec=spec), self.doc, self.allowed.targets)
            self._checked[key] = d
            if d is not None:
                self.refused.setdefault(c.sizes, Rejected(c.sizes, d.code, d.message))
        return self._checked[key] is None

    def best_of(self, cands: list[Candidate]) -> Candidate | None:
        for c in sorted(cands, key=rank_key):
            if self.accepted(c):
                return c
        return None

    def initial(self, ctx: Context) -> dict:
        return {k.name: k.initial(ctx) for k in KNOBS}

    def ctx_of(self, named: tuple) -> Context:
        return self.context({a: 1 for a in MESH_AXES} | dict(named))

    def splits(self, named: tuple) -> list[tuple]:
        """Other ways to divide the same degree over the axes that split the batch's work (`SPLIT_AXES`), the
        other axes kept: every data x fsdp split (spread), and moving one prime factor between another split
        axis (context) and data or fsdp."""
        sizes = dict(named)
        present = [a for a in SPLIT_AXES if a in sizes]
        out: list[dict] = []
        if "data" in sizes and "fsdp" in sizes:
            both = sizes["data"] * sizes["fsdp"]
            out += [dict(sizes, data=both // f, fsdp=f) for f in spread(divisors(both)) if f != sizes["fsdp"]]
        for src in present:
            for dst in present:
                if src != dst and not {src, dst} <= {"data", "fsdp"}:  # (data x fsdp: every split, above)
                    for p in _primes(sizes[src]):
                        out.append(dict(sizes, **{src: sizes[src] // p, dst: sizes[dst] * p}))
        seen, result = set(), []
        for m in out:
            t = tuple((a, m[a]) for a, _ in named)
            if t != named and t not in seen:
                seen.add(t)
                result.append(t)
        return result

    def refine(self, named: tuple, start: dict, best: Candidate) -> Candidate:
        """Coordinate descent from (`named`, `start`): each knob's values in turn, then the data x fsdp split,
        keeping whatever ranks better, until a whole pass changes nothing."""
        cur = dict(start)
        for _ in range(8):
            changed = False
            ctx = self.ctx_of(named)
            for k in KNOBS:
                for v in k.values(ctx, cur):
                    if v == cur.get(k.name):
                        continue
                    trial = dict(cur, **{k.name: v})
                    b = self.best_of(self.evaluate(named, trial))
                    if b is not None and rank_key(b) < rank_key(best):
                        best, cur, changed = b, trial, True
            for other in self.splits(named):
                b = self.best_of(self.evaluate(other, cur))
                if b is not None and rank_key(b) < rank_key(best):
                    best, named, changed = b, other, True
            if not changed:
                break
        return best

    # -- every mesh
    def meshes(self) -> tuple[list[tuple], dict]:
        """The meshes costed first: every factorization of the devices over the searched axes, less those
        pruned (why -> how many); of the ways to split one data x fsdp degree, only all-data, all-fsdp and the
        middle (`refine` moves between them)."""
        pruned: dict[str, int] = {}
        out = []
        experts = _experts(self.graph)
        seen_groups: dict[tuple, list] = {}
        for sizes in factorizations(self.devices, len(self.axes)):
            full = {a: 1 for a in MESH_AXES} | dict(zip(self.axes, sizes))
            why = None
            if full["tensor"] > max(self.hw.devices_per_node, 1):
                why = "tensor beyond one node"
            elif full["pipe"] > 1 and self.placed and full["pipe"] not in dict(self.placed):
                why = "pipe is not what the `stage:` / `device:` placement runs on"
            elif full["pipe"] > 1 and not self.placed and (not self.repeat_count or self.repeat_count % full["pipe"]):
                why = "pipe does not divide the repeated block"
            elif full["expert"] > 1 and any(e % full["expert"] for e in experts):
                why = "expert does not divide the experts"
            elif self.spec.training.batch_size % self.context(full).dp:
                why = "the batch does not divide over the batch axes"
            if why:
                pruned[why] = pruned.get(why, 0) + 1
                continue
            group = tuple((a, n) for a, n in full.items() if a not in SPLIT_AXES)
            seen_groups.setdefault(group, []).append(tuple(zip(self.axes, sizes)))
        left = "splits of the batch axes left to refinement"
        for group, named in seen_groups.items():
            # first only the batch over data and fsdp (the other split axes at 1): all-data, middle, all-fsdp;
            # and the whole degree over context (the one split that shrinks each sample's activations, which a
            # long sequence may need to fit at all, or a batch too small to divide)
            plain = [m for m in named if all(n == 1 for a, n in m if a in SPLIT_AXES and a not in ("data", "fsdp"))]
            by_fsdp = sorted(plain, key=lambda m: dict(m).get("fsdp", 1))
            keep = by_fsdp if len(by_fsdp) <= 3 else [by_fsdp[0], by_fsdp[len(by_fsdp) // 2], by_fsdp[-1]]
            keep += [m for m in named if dict(m).get("context", 1) > 1 and all(
                n == 1 for a, n in m if a in SPLIT_AXES and a != "context")]
            out += keep
            if len(named) > len(keep):
                pruned[left] = pruned.get(left, 0) + len(named) - len(keep)
        return out, pruned

    def run(self) -> SearchResult:
        meshes, pruned = self.meshes()
        first: list[tuple[Candidate, Candidate, tuple, dict]] = []  # (best, fastest, mesh, settings)
        fitting_groups: set = set()  # ways of splitting the devices other than the split axes that fit already
        for named in meshes:
            group = tuple((a, n) for a, n in named if a not in SPLIT_AXES)
            if dict(named).get("context", 1) > 1 and group in fitting_groups:
                # all-context (listed after its group's data x fsdp splits): costed where those do not fit;
                # where they do, refinement still moves factors onto context when that is faster
                why = "context meshes whose group fits without context (left to refinement)"
                pruned[why] = pruned.get(why, 0) + 1
                continue
            start = self.initial(self.ctx_of(named))
            cands = self.evaluate(named, start)
            b = self.best_of(cands)
            if b is None:  # the spec's own settings refused on this mesh: the neutral ones
                neutral = dict(start, zero=0, grad_accum=1, sequence_parallel=False, offload=None,
                               compression="none")
                if neutral != start:
                    start = neutral
                    cands = self.evaluate(named, start)
                    b = self.best_of(cands)
            if b is not None:
                quick = min((c for c in cands if self.accepted(c)), key=lambda c: (_sig(c.step_s), c.costs.peak))
                first.append((b, quick, named, start))
                if b.fits:
                    fitting_groups.add(group)
        # refine the best meshes, and the fastest (whether they fit yet or not: other settings may fit them),
        # one per way of splitting the devices other than data x fsdp (refinement moves between those)
        picks: dict[tuple, tuple] = {}
        for order in (lambda x: rank_key(x[0]), lambda x: (_sig(x[1].step_s), x[1].costs.peak)):
            groups: set = set()
            for x in sorted(first, key=order):
                group = tuple((a, n) for a, n in x[2] if a not in ("data", "fsdp"))
                if group in groups:
                    continue
                groups.add(group)
                picks.setdefault(x[2], x)
                if len(groups) == REFINE:
                    break
        for b, _, named, start in picks.values():
            self.refine(named, start, b)
        # every candidate costed, best first; one row where remat policies cost the same (nothing to recompute)
        seen: set = set()
        cands = []
        for group in self.cache.values():
            for c in group:
                same = (c.sizes, c.settings[:-1], rank_key(c))
                if same not in seen:
                    seen.add(same)
                    cands.append(c)
        cands.sort(key=rank_key)
        listed = [c for c in cands if c.fits and self.accepted(c)][:LISTED]
        if not listed:  # nothing fits: the closest, smallest peak first
            listed = [c for c in sorted(cands, key=lambda c: c.costs.peak)[:LISTED * 4] if self.accepted(c)][:10]
        ok = {key[0] for key, d in self._checked.items() if d is None}  # meshes some checked setting builds
        rejected = tuple(r for named, r in self.rejected.items() if not any(c.sizes == named for c in cands))
        refused = tuple(r for named, r in self.refused.items() if named not in ok)
        result = SearchResult(self.devices, self.hw, tuple(listed), rejected, refused,
                              len(meshes), pruned, self.axes, tuple(k.name for k in ALL_KNOBS), self.evaluations)
        best = result.best
        return dataclasses.replace(result, warning=bottleneck_warning(best) if best else None)


# Mesh axes that divide the batch's work (data and fsdp its samples, context its tokens): splitting one degree
# among them trades memory for overlapped communication, so the search costs a few splits of each degree first
# and lets refinement move between them.
SPLIT_AXES = ("data", "fsdp", "context")


def _primes(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        if n % p == 0:
            out.append(p)
            while n % p == 0:
                n //= p
        p += 1
    return out + ([n] if n > 1 else [])


REUSE_PLAN = ("zero", "offload", "compression")  # knobs the plan does not depend on (the cost model reads them)


def _plan_key(named: tuple, settings: dict) -> tuple:
    return (named, tuple((k, settings[k]) for k in sorted(settings) if k not in REUSE_PLAN and k != "remat"))


def block_sequence_axis(graph: Graph) -> str | None:
    """The logical axis of the sequence in the one repeated block's stream ([seq, features]), if any."""
    reps = [n for n in graph.layers if n.is_repeat]
    if len(reps) == 1 and len(reps[0].out.shape) == 2 and reps[0].out.axes[0]:
        return reps[0].out.axes[0]
    return None


def search(spec: Spec, doc: Document, graph: Graph, devices: int, hardware: Hardware,
           options: CostOptions | None = None, targets=None) -> SearchResult:
    """Searches the meshes and knobs for `devices` devices of `hardware` (every target of `targets`, by
    default the spec's, must build each candidate listed)."""
    return Search(spec, doc, graph, devices, hardware, options, targets).run()


# ---------------------------------------------------------------- writing the choice


def candidate_spec(spec: Spec, graph: Graph, c: Candidate) -> Spec:
    """The spec with the candidate's knob values set (its mesh is the `--mesh` argument)."""
    seq = block_sequence_axis(graph)
    for k in ALL_KNOBS:
        spec = k.apply(spec, dict(c.settings)[k.name], seq)
    return spec


def fragment(spec: Spec, graph: Graph, c: Candidate) -> dict:
    """The spec fragment that, merged over `spec` by `extends`, sets the candidate: its mesh (every axis of
    the spec's mesh it does not use removed, named meshes replaced) and every knob whose value differs."""
    seq = block_sequence_axis(graph)
    out: dict = {}
    sizes = dict(c.sizes)
    mesh: dict[str, Any] = {a: n for a, n in sizes.items() if n > 1}
    for a in (spec.mesh or {}):
        mesh.setdefault(a, None)
    if not any(v for v in mesh.values()):
        mesh["data"] = 1
    if spec.meshes is not None:
        out["meshes"] = None
    out["mesh"] = mesh
    if spec.devices is not None and spec.devices != math.prod(sizes.values()):
        out["devices"] = math.prod(sizes.values())
    values = dict(c.settings)
    current = _current(spec, seq)
    for k in ALL_KNOBS:
        if values[k.name] != current[k.name]:
            _merge(out, k.fragment(spec, values[k.name], seq))
    return out


def written_spec(spec: Spec, graph: Graph, c: Candidate, path, base, command: str) -> str:
    """The text of a spec at `path` that extends `base` (the spec searched) with the candidate's settings."""
    import yaml

    from .extends import relative_base

    t = c.costs.time
    head = [f"# Written by `{command} --write {path}`: the best candidate,",
            f"# {c.argument} ({c.describe()}): predicted step {t.step_s:.4g} s, MFU {t.mfu:.1%}, peak "
            f"{c.costs.peak:,} bytes per device." if t else f"# {c.argument} ({c.describe()})",
            "# Keys set to null remove the base spec's value (`extends`)."]
    if dict(c.settings).get("compression", "none") != "none":
        head.append("# `communication.compression` changes the numerics: the gradients are reduced compressed "
                    "(docs/spec.md).")
    body = {"extends": relative_base(path, base)} | fragment(spec, graph, c)
    return "\n".join(head) + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


def _current(spec: Spec, seq: str | None) -> dict:
    """The spec's own value of every knob."""
    tr = spec.training
    pl = spec.pipeline
    return {"pipeline": (pl.schedule, pl.virtual_stages, pl.microbatches) if pl else None,
            "grad_accum": tr.grad_accum, "zero": tr.zero, "sequence_parallel": _sp_now(spec, seq),
            "offload": tr.offload_threshold(), "compression": _compression_now(spec), "remat": tr.remat}


def _merge(into: dict, frag: dict) -> None:
    for k, v in frag.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


# ---------------------------------------------------------------- is it far from the compute bound?


def bottleneck(c: Candidate) -> list[tuple[str, float]]:
    """Where the step's time goes beyond the model's own FLOPs at the profile's efficiency: (what, seconds),
    largest first."""
    t = c.costs.time
    assert t is not None
    per_dev = c.costs.flops.per_device_forward + c.costs.flops.per_device_backward
    compute = per_dev / (t.peak_flops * t.efficiency)
    out: dict[str, float] = {}
    recompute = max(0.0, t.compute_s - compute)
    if recompute > 0:
        out[f"recompute (remat {c.remat})"] = recompute
    # the busiest device's model FLOPs beyond its share of the model's (an axis that splits neither the
    # batch nor a layer's work computes the same thing on each of its devices; uneven pipeline stages)
    share = c.costs.flops.model / math.prod(n for _a, n in c.sizes)
    if per_dev > share * 1.01:
        out[f"compute beyond this device's share ({per_dev / share:.1f}x: an axis that splits neither the batch "
            "nor the layers repeats it, or the pipeline stages are uneven)"] = (per_dev - share) / (
            t.peak_flops * t.efficiency)
    blocking: dict[str, float] = {}
    overlapped: dict[str, float] = {}
    for coll, secs, where in zip(c.costs.collectives, t.collective_s, t.links):
        label = f"{'+'.join(coll.axes) or 'none'} ({where})"
        d = blocking if coll.blocking else overlapped
        d[label] = d.get(label, 0.0) + secs
    for label, secs in blocking.items():
        out[f"communication on {label}, not overlapped"] = secs
    total_over = sum(overlapped.values())
    if t.exposed_comm_s > 0 and total_over > 0:
        for label, secs in overlapped.items():
            out[f"exposed communication on {label}"] = t.exposed_comm_s * secs / total_over
    busy = t.compute_s + t.blocking_comm_s + t.exposed_comm_s
    if t.bubble > 0:
        out["pipeline bubble"] = busy * t.bubble / (1 - t.bubble)
    if t.optimizer_s > 0:
        out["optimizer update (memory-bound)"] = t.optimizer_s
    return sorted(out.items(), key=lambda kv: -kv[1])


def bottleneck_warning(c: Candidate) -> str | None:
    t = c.costs.time
    if t is None or t.mfu >= WARN_FRACTION * t.efficiency:
        return None
    parts = bottleneck(c)
    step = t.step_s
    what = "; ".join(f"{name} {secs / step:.0%}" for name, secs in parts[:3] if secs / step >= 0.01)
    return (f"the best plan's predicted MFU {t.mfu:.1%} is far below the compute bound ({t.efficiency:.0%}, the "
            f"profile's efficiency): of its {step:.3g} s step, {what}")


# ---------------------------------------------------------------- does it fit?


def _human(n: float) -> str:
    from .planner.table import human_bytes

    return human_bytes(int(n))


def fit_diagnostics(spec: Spec, doc: Document, graph: Graph, plan: Plan, hardware: Hardware, costs: Costs,
                    options: CostOptions | None = None, mesh_label: str = "") -> list[Diagnostic]:
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
    return [Diagnostic(codes.E050, msg, doc.pos(path), help=help_)]


def fit_hints(spec: Spec, doc: Document, graph: Graph, plan: Plan, hardware: Hardware, costs: Costs,
              options: CostOptions, limit: int = 4) -> list[str]:
    """Single changes predicted to fit, each one every target of the spec builds (their E049 checks)."""
    out: list[str] = []
    tr = spec.training
    mesh = plan.mesh
    targets = spec.targets

    def fits(p: Plan, **kw) -> Costs | None:
        if refusal(p, doc, targets) is not None:
            return None
        c = estimate(p, hardware, dataclasses.replace(options, **kw))
        return c if c.fits else None

    # 1. recompute activations
    order = REMAT_MODES.index(costs.remat)
    for r in REMAT_MODES[order + 1:]:
        c = fits(dataclasses.replace(plan, spec=_with_training(spec, remat=r)), remat=r)
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
    if mesh.data_enabled:
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


def _try_plan(spec: Spec, doc: Document, graph: Graph, mesh_arg: str) -> Plan | None:
    try:
        return make_plan(spec, doc, graph, mesh_arg)
    except DiagnosticError:
        return None


def _with_training(spec: Spec, **changes) -> Spec:
    tr = spec.training.model_copy(update=changes)
    return spec.model_copy(update={"training": tr})
