"""The "costs" object of `plan --format json`: `planner/plan_document.py`'s `Costs` model, from `Costs`."""

from __future__ import annotations

from typing import Any

from .. import plan_document as doc
from .results import Collective, Costs, StageCosts


def _collective(c: Collective) -> doc.Collective:
    return doc.Collective(kind=c.kind, axes=list(c.axes), group=c.group, phase=c.phase, what=c.what,
                          bytes=c.bytes, count=c.count, total_bytes=c.total_bytes, wire_bytes=round(c.wire_bytes),
                          blocking=c.blocking, compression=c.compression)


def _stage(s: StageCosts) -> doc.StageCosts:
    st, a, t = s.states, s.activations, s.temporaries
    return doc.StageCosts(
        stage=s.stage,
        layers=list(s.layers),
        devices=s.devices,
        states=doc.TrainingState(params=st.params, grads=st.grads, optimizer=st.optimizer, master=st.master,
                                 moments=st.moments, buffers=st.buffers, total=st.total),
        activations=doc.Activations(
            remat=a.remat, saved=a.saved, recompute=a.recompute, total=a.total, offloaded=a.offloaded,
            offload_per_step=a.offload_per_step,
            by_op=dict(sorted(a.by_op.items())),
            blocks=[doc.ActivationBlock(name=bl.name, count=bl.count, per_copy=bl.per_copy, scores=bl.scores,
                                        checkpoint=bl.checkpoint) for bl in a.blocks],
        ),
        temporaries=doc.Temporaries(gradient_flow=t.gradient_flow, loss=t.loss, gathered_params=t.gathered_params,
                                    unsharded_grads=t.unsharded_grads, optimizer=t.optimizer,
                                    float8_casts=t.float8_casts, total=t.total),
        in_flight=s.in_flight,
        flops_per_device=s.flops_per_device,
        float8_flops_per_device=s.float8_flops_per_device,
        collectives=[_collective(c) for c in s.collectives],
        peak=s.peak,
    )


def costs_document(costs: Costs) -> doc.Costs:
    """The "costs" object of `plan --format json`, as a model (its fields: schemas/plan.schema.json)."""
    f, t, hw = costs.flops, costs.time, costs.hardware
    return doc.Costs(
        remat=costs.remat,
        target=costs.target,
        zero=costs.zero,
        micro_batches=costs.micro_batches,
        local_batch=costs.local_batch,
        peak_bytes=costs.peak,
        offload_threshold=costs.offload_threshold,
        stages=[_stage(s) for s in costs.stages],
        collectives=[_collective(c) for c in costs.collectives],
        comm_bytes=sum(c.total_bytes for c in costs.collectives),
        flops=doc.Flops(
            forward=f.forward, backward=f.backward, recompute=f.recompute, model=f.model,
            per_device=doc.PerDeviceFlops(forward=f.per_device_forward, backward=f.per_device_backward,
                                          recompute=f.per_device_recompute, total=f.per_device_total),
        ),
        hardware=None if hw is None else doc.Hardware(**hw.to_json()),
        fits=costs.fits,
        capacity_bytes=costs.capacity,
        time=None if t is None else doc.StepTime(
            peak_flops=t.peak_flops, efficiency=t.efficiency, compute_s=t.compute_s,
            blocking_comm_s=t.blocking_comm_s, overlapped_comm_s=t.overlapped_comm_s,
            exposed_comm_s=t.exposed_comm_s, optimizer_s=t.optimizer_s, bubble=t.bubble, step_s=t.step_s,
            mfu=t.mfu, hfu=t.hfu, samples_per_s=t.samples_per_s, tokens_per_s=t.tokens_per_s,
            collective_s=list(t.collective_s), links=list(t.links),
            algorithms=list(t.algorithms), offload_s=t.offload_s, elementwise_s=t.elementwise_s, kernels=t.kernels,
            sharded_layers=t.sharded_layers, overhead_s=t.overhead_s,
        ),
        notes=list(costs.notes),
    )


def costs_to_json(costs: Costs) -> dict[str, Any]:
    """The "costs" object of `plan --format json` as plain JSON data (fields: schemas/plan.schema.json)."""
    return costs_document(costs).model_dump(mode="json", by_alias=True)
