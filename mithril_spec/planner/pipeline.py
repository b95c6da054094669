"""Pipeline stages: which layers (and which copies of a repeated block) run on which stage, and the
checks that keep a pipeline from hanging or failing after launch."""

from __future__ import annotations

import dataclasses
from typing import Optional

from .. import codes
from ..diagnostics import Diagnostic
from ..graph import Graph, Node, RepeatNode
from ..source import Document
from ..spec.root import Spec
from .mesh import Mesh


@dataclasses.dataclass(frozen=True)
class Stage:
    index: int
    rank: int  # position on the pipe axis (stage index mod pipe for interleaved schedules)
    units: tuple[str, ...]  # top-level layer names, and `blocks[0:2]` for a slice of a repeat
    params: int
    flops: int  # forward FLOPs per sample


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    pipe: int
    virtual: int
    microbatches: int
    schedule: str
    stages: tuple[Stage, ...]
    param_stage: dict[str, int]  # canonical parameter name -> stage index
    layer_stage: dict[str, int]  # top-level layer name (repeat: first copy) -> stage index
    repeat_split: dict[str, tuple[tuple[int, int], ...]]  # repeat name -> (start, end) copies per stage
    # per stage, the copies of repeated blocks it runs: (repeat name, start, end), in layer order (for the
    # planner's split and explicit placement alike)
    stage_repeats: tuple[tuple[tuple[str, int, int], ...], ...] = ()
    # a table that tied layers on other pipe ranks read -> the stages of those layers, each of which holds a copy
    # (a target that runs a tied layer away from its table: the torch pipeline)
    tied_copies: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    @property
    def stage_copies(self) -> tuple[tuple[tuple[str, int], ...], ...]:
        """Per stage, the copies of repeated blocks it runs: (repeat name, copy index), in order."""
        return tuple(tuple((r, i) for r, a, b in s for i in range(a, b)) for s in self.stage_repeats)

    @property
    def bubble(self) -> float:
        p, m, v = self.pipe, self.microbatches, self.virtual
        return (p - 1) / (v * m + p - 1) if p > 1 else 0.0


def plan_pipeline(spec: Spec, doc: Document, graph: Graph, mesh: Mesh, micro_batch: int, dp: int,
                  diags: list[Diagnostic]) -> Optional[PipelinePlan]:
    cfg = spec.pipeline
    pipe = mesh.pipe
    if cfg is None:
        if pipe > 1:
            diags.append(Diagnostic(codes.E053, f"the mesh has a `pipe` axis of size {pipe} but the spec has no "
                                    "`pipeline` section", doc.pos(mesh.source),
                                    help="add `pipeline: {microbatches: N}` or drop the pipe axis"))
        return None
    path = ("pipeline",)
    virtual = cfg.virtual_stages if pipe > 1 else 1
    if cfg.virtual_stages > 1 and cfg.schedule != "interleaved":
        diags.append(Diagnostic(codes.E053, "virtual_stages > 1 needs the `interleaved` schedule",
                                doc.pos(path + ("virtual_stages",)), help="set `schedule: interleaved`"))
    n_stages = pipe * virtual
    m = cfg.microbatches
    if pipe > 1 and cfg.schedule in ("1f1b", "interleaved") and m < pipe:
        diags.append(Diagnostic(codes.E051, f"the {cfg.schedule} schedule needs at least {pipe} micro-batches "
                                f"(one per pipeline stage rank), got {m}", doc.pos(path + ("microbatches",)),
                                help=f"use microbatches >= {pipe}, or the gpipe schedule"))
    elif pipe > 1 and cfg.schedule == "interleaved" and m % pipe:
        diags.append(Diagnostic(codes.E051, f"the interleaved schedule needs micro-batches in multiples of the pipe "
                                f"size {pipe}, got {m}", doc.pos(path + ("microbatches",)),
                                help=f"use a multiple of {pipe}"))
    if micro_batch % (m * dp):
        diags.append(Diagnostic(codes.E052, f"a step's batch of {micro_batch} does not split into {m} micro-batches "
                                f"over a data-parallel degree of {dp}", doc.pos(path + ("microbatches",)),
                                help=f"make batch_size / grad_accum divisible by {m * dp}"))

    explicit = any(n.stage is not None for n in graph.layers)
    placed = graph.placed
    if placed and explicit:
        staged = next(n for n in graph.layers if n.stage is not None)
        diags.append(Diagnostic(codes.E054, f"`{staged.name}` has a `stage:` and `{placed[0].name}` a `device:`",
                                doc.pos(staged.path + ("stage",)),
                                help="place the layers one way: `device:` fields (consecutive layers on one device "
                                "form a stage) or `stage:` fields"))
        return None
    if placed:
        assign = _devices(graph, doc, n_stages, pipe, diags)
    elif explicit:
        assign = _explicit(graph, doc, n_stages, pipe, diags)
    else:
        assign = _auto(graph, doc, n_stages, diags, path)
    if assign is None:
        return None
    layer_stage, repeat_split = assign
    return _summarise(graph, pipe, virtual, m, cfg.schedule, n_stages, layer_stage, repeat_split)


def _explicit(graph, doc, n_stages, pipe, diags):
    layer_stage: dict[str, int] = {}
    prev = 0
    ok = True
    first = graph.layers[0]
    if first.stage not in (None, 0):
        diags.append(Diagnostic(codes.E054, f"the first layer `{first.name}` is on stage {first.stage}; stages start "
                                "at 0", doc.pos(first.path + ("stage",)), help="put the first layer on stage 0"))
        ok = False
    for n in graph.layers:
        s = n.stage if n.stage is not None else prev
        if n.stage is not None and n.stage < prev:
            diags.append(Diagnostic(codes.E054, f"`{n.name}` is on stage {n.stage}, after a layer on stage {prev}",
                                    doc.pos(n.path + ("stage",)),
                                    help="stages must not decrease along the layer list"))
            ok = False
        if n.stage is not None and n.stage > prev + 1:
            diags.append(Diagnostic(codes.E054, f"`{n.name}` jumps from stage {prev} to stage {n.stage}",
                                    doc.pos(n.path + ("stage",)), help="stages must be contiguous"))
            ok = False
        layer_stage[n.name] = s
        prev = max(prev, s)
    if ok and pipe > 1 and prev != n_stages - 1:
        last = graph.layers[-1]
        diags.append(Diagnostic(codes.E054, f"the layers use stages 0..{prev} but the pipeline has {n_stages}",
                                doc.pos(last.path), help=f"assign layers up to stage {n_stages - 1}"))
        ok = False
    if not ok:
        return None
    if pipe == 1:  # a single-stage mesh runs the whole model on stage 0
        layer_stage = {k: 0 for k in layer_stage}
    return layer_stage, {}


def _span(run) -> str:
    """A run [device, first layer, last layer] as the diagnostics name it."""
    return f"`{run[1].name}`" if run[1] is run[2] else f"`{run[1].name}`..`{run[2].name}`"


def _devices(graph, doc, n_stages, pipe, diags):
    """`device:` placement (Mithril's device_id): the device along `pipe` of each layer, mapped to stages.
    A layer without one is on the previous layer's device (the first on device 0); a repeat is on its own
    device or the one its block's layers name (all of them one device: a stage holds whole copies). Each run
    of consecutive layers on one device is a stage, and the schedules run stage s on device s % pipe: the
    runs must go round the devices in order, pipe x virtual_stages of them. Anything else is E054 with the
    nearest assignment that runs."""
    units: list[tuple[Node | RepeatNode, int]] = []
    ok = True
    prev = 0
    for n in graph.layers:
        dev = n.device
        if n.is_repeat:
            named = sorted({x.device for x in n.layers if x.device is not None})
            if len(named) > 1:
                where = next(x for x in n.layers if x.device is not None and x.device != named[0])
                per = n.count // n_stages if n.count % n_stages == 0 else None
                even = (f"or leave placement to the planner: without `device:` fields it splits the {n.count} "
                        f"copies of `{n.name}` evenly, {per} per stage" if per else
                        f"or give the copies of `{n.name}` to the stages in whole copies (a repeat per stage)")
                diags.append(Diagnostic(
                    codes.E054, f"block `{n.block}` puts its layers on devices {', '.join(map(str, named))}: every copy "
                    f"of `{n.name}` would cross devices, and a pipeline stage holds whole copies of a block",
                    doc.pos(where.path + ("device",)),
                    help=f"give the whole block one device (`device: {named[0]}` on `{n.name}`), {even}"))
                ok = False
                continue
            if named and dev is not None and dev != named[0]:
                diags.append(Diagnostic(codes.E054, f"`{n.name}` is on device {dev} and its block `{n.block}`'s layers on "
                                        f"device {named[0]}", doc.pos(n.path + ("device",)),
                                        help="give the device once, on the repeat or in its block"))
                ok = False
                continue
            dev = named[0] if named else dev
        if dev is not None and pipe > 1 and dev >= pipe:
            diags.append(Diagnostic(codes.E054, f"`{n.name}` is on device {dev}, but the `pipe` axis has {pipe} devices",
                                    doc.pos(n.path + ("device",)), help=f"use devices 0 to {pipe - 1}"))
            ok = False
        prev = dev if dev is not None else prev
        units.append((n, prev))
    if not ok:
        return None
    if pipe == 1:  # a single-stage mesh runs the whole model on its one device
        return {n.name: 0 for n in graph.layers}, {}
    runs: list[list] = []  # [device, first unit, last unit]
    for n, dev in units:
        if runs and runs[-1][0] == dev:
            runs[-1][2] = n
        else:
            runs.append([dev, n, n])
    want = [s % pipe for s in range(len(runs))]
    if [r[0] for r in runs] != want or len(runs) != n_stages:
        bad = next((r for r, w in zip(runs, want) if r[0] != w), runs[-1])
        nearest = "; ".join(f"{_span(r)}: device {w}" for r, w in zip(runs, want))
        if len(runs) == n_stages:
            msg = (f"{_span(bad)} on device {bad[0]} would run stage {runs.index(bad)}, which the schedules run on "
                   f"device {runs.index(bad) % pipe} (stage s on device s % {pipe})")
            help = f"the nearest placement that runs: {nearest}"
        else:
            msg = (f"the `device:` fields make {len(runs)} stages (runs of consecutive layers on one device), and "
                   f"the pipeline has {n_stages} (pipe {pipe} x virtual_stages {n_stages // pipe})")
            if len(runs) > n_stages:  # the runs past the last stage join it
                merged = [*runs[:n_stages - 1], [None, runs[n_stages - 1][1], runs[-1][2]]]
                help = "the nearest placement that runs: " + "; ".join(
                    f"{_span(r)}: device {s % pipe}" for s, r in enumerate(merged))
            else:
                help = (f"give the layers {n_stages} runs of devices, in order 0..{pipe - 1}"
                        + (" and round again" if n_stages > pipe else "")
                        + (f", or use a `pipe` axis of {len(runs)}" if len(runs) > 1 else ", or no `pipe` axis"))
            if len(runs) % pipe == 0 and len(runs) > pipe:
                help += f", or `virtual_stages: {len(runs) // pipe}` with the interleaved schedule"
        diags.append(Diagnostic(codes.E054, msg, doc.pos(bad[1].path + ("device",) if bad[1].device is not None
                                                     else bad[1].path), help=help))
        return None
    layer_stage: dict[str, int] = {}
    for s, (_dev, first, last) in enumerate(runs):
        inside = False
        for n in graph.layers:
            inside = inside or n is first
            if inside:
                layer_stage[n.name] = s
            if n is last:
                break
    return layer_stage, {}


def _auto(graph, doc, n_stages, diags, path):
    repeats = [n for n in graph.layers if isinstance(n, RepeatNode)]
    layer_stage: dict[str, int] = {}
    if n_stages == 1:
        return {n.name: 0 for n in graph.layers}, {r.name: ((0, r.count),) for r in repeats}
    if len(repeats) != 1:
        diags.append(Diagnostic(codes.E053, f"automatic stage splitting needs exactly one repeated block, found "
                                f"{len(repeats)}", doc.pos(path, key=True),
                                help="give layers explicit `stage:` fields instead"))
        return None
    (rep,) = repeats
    if rep.count % n_stages:
        diags.append(Diagnostic(codes.E053, f"`{rep.name}` repeats {rep.count} times, which does not split evenly "
                                f"into {n_stages} stages", doc.pos(rep.path + ("repeat",)),
                                help=f"use a repeat count divisible by {n_stages}, or another pipe size"))
        return None
    per = rep.count // n_stages
    before = True
    for n in graph.layers:
        if n is rep:
            before = False
            layer_stage[n.name] = 0
        else:
            layer_stage[n.name] = 0 if before else n_stages - 1
    return layer_stage, {rep.name: tuple((s * per, (s + 1) * per) for s in range(n_stages))}


def _summarise(graph, pipe, virtual, m, schedule, n_stages, layer_stage, repeat_split) -> PipelinePlan:
    units: list[list[str]] = [[] for _ in range(n_stages)]
    copies: list[list[tuple[str, int, int]]] = [[] for _ in range(n_stages)]
    params = [0] * n_stages
    flops = [0] * n_stages
    param_stage: dict[str, int] = {}
    tied: dict[str, list[int]] = {}
    for n in graph.layers:
        if isinstance(n, RepeatNode):
            spans = repeat_split.get(n.name) or ((0, n.count),)
            for s, (a, b) in enumerate(spans):
                stage = s if len(spans) > 1 else layer_stage[n.name]
                units[stage].append(f"{n.name}[{a}:{b}]")
                copies[stage].append((n.name, a, b))
                for i in range(a, b):
                    for inner in n.layers:
                        for p in inner.params:
                            param_stage[f"{n.name}.{i}.{inner.name}.{p.name}"] = stage
                            params[stage] += p.numel
                        for bf in inner.buffers:
                            param_stage[f"{n.name}.{i}.{inner.name}.{bf.name}"] = stage
                        flops[stage] += inner.flops
        else:
            stage = layer_stage[n.name]
            units[stage].append(n.name)
            assert isinstance(n, Node)
            for p in n.params + n.buffers:
                param_stage[f"{n.name}.{p.name}"] = stage
            params[stage] += sum(p.numel for p in n.params)
            flops[stage] += n.flops
            table = n.attrs.get("tie")
            if table in param_stage and param_stage[table] % pipe != stage % pipe:
                tied.setdefault(table, [])
                if stage not in tied[table]:
                    tied[table].append(stage)
    # A tied linear on another pipe rank than its table reads a copy of it there (`tied_copies`); the table
    # itself stays with its embedding (param_stage).
    stages = tuple(Stage(i, i % pipe, tuple(units[i]), params[i], flops[i]) for i in range(n_stages))
    return PipelinePlan(pipe, virtual, m, schedule, stages, param_stage, layer_stage, repeat_split,
                        tuple(tuple(c) for c in copies), {k: tuple(v) for k, v in tied.items()})
