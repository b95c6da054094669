"""Pipeline stages: which layers (and which copies of a repeated block) run on which stage, and the
checks that keep a pipeline from hanging or failing after launch."""

from __future__ import annotations

import dataclasses
from typing import Optional

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

    @property
    def bubble(self) -> float:
        p, m, v = self.pipe, self.microbatches, self.virtual
        return (p - 1) / (v * m + p - 1) if p > 1 else 0.0


def plan_pipeline(spec: Spec, doc: Document, graph: Graph, mesh: Mesh, micro_batch: int, dp: int,
                  diags: list[Diagnostic]) -> Optional[PipelinePlan]:
    cfg = spec.pipeline
    pipe = mesh.sizes["pipe"]
    if cfg is None:
        if pipe > 1:
            diags.append(Diagnostic("E053", f"the mesh has a `pipe` axis of size {pipe} but the spec has no "
                                    "`pipeline` section", doc.pos(mesh.source),
                                    help="add `pipeline: {microbatches: N}` or drop the pipe axis"))
        return None
    path = ("pipeline",)
    virtual = cfg.virtual_stages if pipe > 1 else 1
    if cfg.virtual_stages > 1 and cfg.schedule != "interleaved":
        diags.append(Diagnostic("E053", "virtual_stages > 1 needs the `interleaved` schedule",
                                doc.pos(path + ("virtual_stages",)), help="set `schedule: interleaved`"))
    n_stages = pipe * virtual
    m = cfg.microbatches
    if pipe > 1 and cfg.schedule in ("1f1b", "interleaved") and m < pipe:
        diags.append(Diagnostic("E051", f"the {cfg.schedule} schedule needs at least {pipe} micro-batches "
                                f"(one per pipeline stage rank), got {m}", doc.pos(path + ("microbatches",)),
                                help=f"use microbatches >= {pipe}, or the gpipe schedule"))
    elif pipe > 1 and cfg.schedule == "interleaved" and m % pipe:
        diags.append(Diagnostic("E051", f"the interleaved schedule needs micro-batches in multiples of the pipe "
                                f"size {pipe}, got {m}", doc.pos(path + ("microbatches",)),
                                help=f"use a multiple of {pipe}"))
    if micro_batch % (m * dp):
        diags.append(Diagnostic("E052", f"a step's batch of {micro_batch} does not split into {m} micro-batches "
                                f"over a data-parallel degree of {dp}", doc.pos(path + ("microbatches",)),
                                help=f"make batch_size / grad_accum divisible by {m * dp}"))

    explicit = any(n.stage is not None for n in graph.layers)
    if explicit:
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
        diags.append(Diagnostic("E054", f"the first layer `{first.name}` is on stage {first.stage}; stages start "
                                "at 0", doc.pos(first.path + ("stage",)), help="put the first layer on stage 0"))
        ok = False
    for n in graph.layers:
        s = n.stage if n.stage is not None else prev
        if n.stage is not None and n.stage < prev:
            diags.append(Diagnostic("E054", f"`{n.name}` is on stage {n.stage}, after a layer on stage {prev}",
                                    doc.pos(n.path + ("stage",)),
                                    help="stages must not decrease along the layer list"))
            ok = False
        if n.stage is not None and n.stage > prev + 1:
            diags.append(Diagnostic("E054", f"`{n.name}` jumps from stage {prev} to stage {n.stage}",
                                    doc.pos(n.path + ("stage",)), help="stages must be contiguous"))
            ok = False
        layer_stage[n.name] = s
        prev = max(prev, s)
    if ok and pipe > 1 and prev != n_stages - 1:
        last = graph.layers[-1]
        diags.append(Diagnostic("E054", f"the layers use stages 0..{prev} but the pipeline has {n_stages}",
                                doc.pos(last.path), help=f"assign layers up to stage {n_stages - 1}"))
        ok = False
    if not ok:
        return None
    if pipe == 1:  # a single-stage mesh runs the whole model on stage 0
        layer_stage = {k: 0 for k in layer_stage}
    return layer_stage, {}


def _auto(graph, doc, n_stages, diags, path):
    repeats = [n for n in graph.layers if isinstance(n, RepeatNode)]
    layer_stage: dict[str, int] = {}
    if n_stages == 1:
        return {n.name: 0 for n in graph.layers}, {r.name: ((0, r.count),) for r in repeats}
    if len(repeats) != 1:
        diags.append(Diagnostic("E053", f"automatic stage splitting needs exactly one repeated block, found "
                                f"{len(repeats)}", doc.pos(path, key=True),
                                help="give layers explicit `stage:` fields instead"))
        return None
    (rep,) = repeats
    if rep.count % n_stages:
        diags.append(Diagnostic("E053", f"`{rep.name}` repeats {rep.count} times, which does not split evenly "
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
    params = [0] * n_stages
    flops = [0] * n_stages
    param_stage: dict[str, int] = {}
    for n in graph.layers:
        if isinstance(n, RepeatNode):
            spans = repeat_split.get(n.name) or ((0, n.count),)
            for s, (a, b) in enumerate(spans):
                stage = s if len(spans) > 1 else layer_stage[n.name]
                units[stage].append(f"{n.name}[{a}:{b}]")
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
    # A tied linear reads its table from another stage; the table stays with its embedding.
    stages = tuple(Stage(i, i % pipe, tuple(units[i]), params[i], flops[i]) for i in range(n_stages))
    return PipelinePlan(pipe, virtual, m, schedule, stages, param_stage, layer_stage, repeat_split)
