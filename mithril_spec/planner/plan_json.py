"""`plan --format json`: everything a plan says, as one JSON document (schemas/plan.schema.json)."""

from __future__ import annotations

from typing import Any

from .costs import costs_to_json, estimate
from .plan import Plan


def plan_to_json(plan: Plan, costs: Any = None) -> dict[str, Any]:
    """Everything `plan --format json` prints (documented in docs/plan-json.md; "costs" in
    docs/cost-model.md). `costs`: a `costs.Costs` (e.g. with a hardware profile); estimated when None."""
    def pspec(s):
        return [list(d) if d else None for d in s]

    tr = plan.spec.training
    return {
        "format": 1,
        "name": plan.spec.name,
        "mesh": {"name": plan.mesh.name, "axes": {a: plan.mesh.sizes[a] for a in plan.mesh.axes},
                 "devices": plan.mesh.devices},
        "batch": {"global": tr.batch_size, "grad_accum": tr.grad_accum, "micro_batch": plan.micro_batch,
                  "axes": list(plan.batch_axes), "data_parallel": plan.dp_degree,
                  "per_device": plan.micro_batch // plan.dp_degree},
        "inputs": [
            {"name": i.input.name, "shape": ["batch", *i.input.type.shape], "dtype": i.input.type.dtype,
             "layout": pspec(i.spec), "local_batch": i.local_batch}
            for i in plan.inputs
        ],
        "params": [
            {"name": p.name, "shape": list(p.param.shape), "axes": list(p.param.axes), "layout": pspec(p.spec),
             "local_shape": list(p.local_shape), "dtype": p.dtype, "bytes": p.bytes, "local_bytes": p.local_bytes,
             "stage": p.stage, "buffer": not p.param.trainable}
            for p in plan.params + plan.buffers
        ],
        "totals": {
            "param_count": plan.param_count,
            "param_bytes": sum(p.bytes for p in plan.params),
            "per_device": {"params": plan.memory.params, "grads": plan.memory.grads,
                           "optimizer": plan.memory.optimizer, "buffers": plan.memory.buffers,
                           "total": plan.memory.total},
            "flops_per_sample_forward": plan.graph.flops_per_sample,
        },
        "pipeline": None if plan.pipeline is None else {
            "pipe": plan.pipeline.pipe, "virtual_stages": plan.pipeline.virtual,
            "microbatches": plan.pipeline.microbatches, "schedule": plan.pipeline.schedule,
            "bubble_fraction": plan.pipeline.bubble,
            "stages": [{"index": s.index, "rank": s.rank, "layers": list(s.units), "params": s.params,
                        "flops_per_sample_forward": s.flops} for s in plan.pipeline.stages],
        },
        "diagnostics": [d.to_json() for d in plan.warnings],
        "costs": costs_to_json(costs if costs is not None else estimate(plan)),
    }
