"""The "costs" object of `plan --format json`."""

from __future__ import annotations

from typing import Any

from .results import Collective, Costs, StageCosts


def _coll_json(c: Collective) -> dict[str, Any]:
    return {"kind": c.kind, "axes": list(c.axes), "group": c.group, "phase": c.phase, "what": c.what,
            "bytes": c.bytes, "count": c.count, "total_bytes": c.total_bytes, "wire_bytes": round(c.wire_bytes),
            "blocking": c.blocking}


def costs_to_json(costs: Costs) -> dict[str, Any]:
    """The "costs" object of `plan --format json` (every key documented in docs/cost-model.md)."""

    def stage(s: StageCosts) -> dict:
        st, a, t = s.states, s.activations, s.temporaries
        return {
            "stage": s.stage,
            "layers": list(s.layers),
            "devices": s.devices,
            "states": {"params": st.params, "grads": st.grads, "optimizer": st.optimizer, "master": st.master,
                       "moments": st.moments, "buffers": st.buffers, "total": st.total},
            "activations": {
                "remat": a.remat, "saved": a.saved, "recompute": a.recompute, "total": a.total,
                "by_op": dict(sorted(a.by_op.items())),
                "blocks": [{"name": bl.name, "count": bl.count, "per_copy": bl.per_copy, "scores": bl.scores,
                            "checkpoint": bl.checkpoint} for bl in a.blocks],
            },
            "temporaries": {"gradient_flow": t.gradient_flow, "loss": t.loss, "gathered_params": t.gathered_params,
                            "unsharded_grads": t.unsharded_grads, "optimizer": t.optimizer, "total": t.total},
            "in_flight": s.in_flight,
            "flops_per_device": s.flops_per_device,
            "collectives": [_coll_json(c) for c in s.collectives],
            "peak": s.peak,
        }

    out: dict[str, Any] = {
        "remat": costs.remat,
        "zero": costs.zero,
        "micro_batches": costs.micro_batches,
        "local_batch": costs.local_batch,
        "peak_bytes": costs.peak,
        "stages": [stage(s) for s in costs.stages],
        "collectives": [_coll_json(c) for c in costs.collectives],
        "comm_bytes": sum(c.total_bytes for c in costs.collectives),
        "flops": {
            "forward": costs.flops.forward, "backward": costs.flops.backward, "recompute": costs.flops.recompute,
            "model": costs.flops.model, "per_device": {
                "forward": costs.flops.per_device_forward, "backward": costs.flops.per_device_backward,
                "recompute": costs.flops.per_device_recompute, "total": costs.flops.per_device_total},
        },
        "hardware": costs.hardware.to_json() if costs.hardware else None,
        "fits": costs.fits,
        "capacity_bytes": costs.capacity,
        "time": None,
        "notes": list(costs.notes),
    }
    t = costs.time
    if t is not None:
        out["time"] = {
            "peak_flops": t.peak_flops, "efficiency": t.efficiency, "compute_s": t.compute_s,
            "blocking_comm_s": t.blocking_comm_s, "overlapped_comm_s": t.overlapped_comm_s,
            "exposed_comm_s": t.exposed_comm_s, "optimizer_s": t.optimizer_s, "bubble": t.bubble,
            "step_s": t.step_s, "mfu": t.mfu, "hfu": t.hfu, "samples_per_s": t.samples_per_s,
            "tokens_per_s": t.tokens_per_s,
            "collective_s": list(t.collective_s), "links": list(t.links),
        }
    return out
