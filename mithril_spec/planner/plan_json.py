"""`plan --format json`: everything a plan says, as one JSON document.

The document is `plan_document.PlanDocument`, published as schemas/plan.schema.json (`mithril-spec schema
--plan`); docs/plan-json.md describes how to call it.
"""

from __future__ import annotations

from typing import Any

from . import plan_document as doc
from .costs import Costs
from .costs.serialise import costs_document
from .plan import BlockParamPlan, Plan, RepeatPlan
from .table import repeat_stage_runs


def _layout(spec) -> doc.Layout:
    return [list(d) if d else None for d in spec]


def plan_document(plan: Plan, costs: Costs, predicted: dict[str, Any] | None = None) -> doc.PlanDocument:
    """The `plan --format json` document of `plan`, as a model. `costs`: the command's one costing of it
    (lowering/costing.py; with a hardware profile, its step time), never estimated here: a document that
    costed the plan itself could disagree with what the command prints beside it. `predicted`: what the
    target's program compares `--profile` with, read from the same costing (lowering/predicted.py), or None."""
    tr = plan.spec.training
    mem = plan.memory
    pipe = plan.pipeline
    return doc.PlanDocument(
        format=2,
        name=plan.spec.name,
        mesh=doc.Mesh(name=plan.mesh.name, axes={a: plan.mesh.size(a) for a in plan.mesh.axes},
                      devices=plan.mesh.devices),
        batch=doc.Batch(**{"global": tr.batch_size}, grad_accum=tr.grad_accum, micro_batch=plan.micro_batch,
                        axes=list(plan.batch_axes), data_parallel=plan.dp_degree,
                        per_device=plan.micro_batch // plan.dp_degree),
        inputs=[
            doc.Input(name=i.input.name, shape=["batch", *i.input.type.shape], dtype=i.input.type.dtype,
                      layout=_layout(i.spec), local_batch=i.local_batch)
            for i in plan.inputs
        ],
        params=[
            doc.Param(name=p.name, shape=list(p.param.shape), axes=list(p.param.axes), layout=_layout(p.spec),
                      local_shape=list(p.local_shape), dtype=p.dtype, bytes=p.bytes, local_bytes=p.local_bytes,
                      stage=p.stage, buffer=not p.param.trainable)
            for p in plan.top_params + plan.top_buffers
        ],
        repeats=[_repeat(plan, r) for r in plan.repeats],
        totals=doc.Totals(
            param_count=plan.param_count,
            param_bytes=sum(p.bytes for p in plan.params),
            per_device=doc.PerDeviceState(params=mem.params, grads=mem.grads, optimizer=mem.optimizer,
                                          buffers=mem.buffers, total=mem.total),
            flops_per_sample_forward=plan.graph.flops_per_sample,
        ),
        pipeline=None if pipe is None else doc.Pipeline(
            pipe=pipe.pipe, virtual_stages=pipe.virtual, microbatches=pipe.microbatches, schedule=pipe.schedule,
            bubble_fraction=pipe.bubble,
            stages=[doc.PipelineStage(index=s.index, rank=s.rank, layers=list(s.units), params=s.params,
                                      flops_per_sample_forward=s.flops) for s in pipe.stages],
        ),
        diagnostics=[doc.Diagnostic(d.to_json()) for d in plan.warnings],
        costs=costs_document(costs),
        predicted=None if predicted is None else doc.Predicted.model_validate(predicted),
    )


def _block_param(b: BlockParamPlan) -> doc.BlockParam:
    p = b.first
    return doc.BlockParam(name=b.local, shape=list(p.param.shape), axes=list(p.param.axes), layout=_layout(p.spec),
                          local_shape=list(p.local_shape), dtype=p.dtype, bytes=p.bytes, local_bytes=p.local_bytes,
                          buffer=not p.param.trainable)


def _repeat(plan: Plan, r: RepeatPlan) -> doc.Repeat:
    return doc.Repeat(name=r.name, block=r.block, count=r.count,
                      stages=[doc.CopyStages(stage=s, start=a, end=b) for a, b, s in repeat_stage_runs(plan, r)],
                      params=[_block_param(b) for b in r.params + r.buffers])


def per_copy_params(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The parameters of a plan document one entry per copy, as format 1 listed them: `params`, then every
    copy `i` of every block parameter of every repeat as a `params` entry named `<repeat>.<i>.<name>`, with
    the stage of its copy. (Format 1 put the copies among the parameters in layer order; here they follow
    the parameters outside repeats, trainable ones before buffers.)"""
    top = document["params"]
    copies: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for rep in document["repeats"]:
        stage_of = [0] * rep["count"]
        for run in rep["stages"]:
            stage_of[run["start"]:run["end"]] = [run["stage"]] * (run["end"] - run["start"])
        for i in range(rep["count"]):
            for p in rep["params"]:
                copies[p["buffer"]].append({**p, "name": f"{rep['name']}.{i}.{p['name']}", "stage": stage_of[i]})
    order = list(doc.Param.model_fields)
    out = [p for p in top if not p["buffer"]] + copies[False] + [p for p in top if p["buffer"]] + copies[True]
    return [{k: p[k] for k in order} for p in out]


def plan_to_json(plan: Plan, costs: Costs, predicted: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything `plan --format json` prints, as plain JSON data (its fields: schemas/plan.schema.json), with
    `costs` and `predicted` (see `plan_document`)."""
    return plan_document(plan, costs, predicted).to_json()
