"""The parts of jax's ops, model and train_step templates (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    return {**_train_step(ctx)}


def _train_step(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """train_step.py.j2's slots (templates/jax/train_step_parts.py.j2)."""
    j = ctx["jax"]
    ls = ctx["training"]["loss_scaling"]  # None: no loss scaling
    pp = j.pipeline  # the jax pipeline (more than one stage); ctx["pipeline"]: the spec's, maybe of one stage
    chunks = ctx["pipeline"] is not None and not pp  # a one-stage pipeline: its chunks are the step's micro-batches
    mask = bool(ctx["data"]["mask"])
    replicas, psgd = j.comm["replicas"], j.comm["powersgd"]
    ev = ctx["eval"]
    reduced = "powersgd" if psgd else "compressed"  # how the replicas' gradients are reduced
    counting = "counting" if ev and ev["accuracy"] else "loss"  # the evaluation counts the correct predictions
    return {
        # the loss scaler's update rule: torch's GradScaler (dynamic) or a fixed scale (skipped steps counted)
        "scaler_update": [f"update_scaler_{'dynamic' if ls['dynamic'] else 'fixed'}"] if ls else [],
        # the gradients of one micro-batch: through the pipeline, of the scaled loss (a vjp from `scale`), or plain
        "grad_fn": ["grad_fn_pipelined" if pp else "grad_fn_scaled" if ls else "grad_fn_plain"],
        # what the step reads once before its micro-batches: data.mask's factor, the loss scale, the batch as
        # pipeline runs, the step's dropout key
        "step_start": ["mask_scale"] * mask + ["loss_scale"] * bool(ls) + ["pipeline_runs"] * bool(pp)
        + ["step_key"] * j.has_dropout,
        # a micro-batch's dropout keys, one per sample, drawn as the one-device build draws them (none: no dropout)
        "micro_keys": [("pipeline_run_keys" if pp else "chunk_keys" if chunks else "micro_batch_keys")
                       if j.has_dropout else "no_keys"],
        # data.mask: the micro-batch's loss and gradients scaled to the mean over the unmasked targets
        "after_grads": ["masked_grads"] * mask,
        # the sums' start: inside a replica's shard_map (compressed gradients, PowerSGD) or in the step itself
        "sums": [f"replica_{reduced}" if replicas else "zero_sums"],
        # the micro-batches' loop: none for one
        "accumulation": ["one_micro_batch" if j.accum == 1 else "scan_micro_batches"],
        # a replica's means over the replicas, its batch split over `data` (ZeRO's gradients come out split),
        # and the shard_map's results; or the sums themselves
        "replica_end": [f"replica_reduce_{reduced}"] * replicas,
        "replicas_split": ["batch_split_zero" if j.zero else "batch_split"] * replicas,
        "gathered": [f"shard_map_{reduced}" if replicas else "summed"],
        # before the norm: the gradients unscaled (and the step's finiteness), ZeRO-2's gradient slices
        "before_norm": ["unscale"] * bool(ls) + ["zero2_gradients"] * (j.zero >= 2),
        # the update: skipped where a scaled gradient is not finite, or always applied
        "apply_update": ["update_skipping" if ls else "update"],
        # the train state's optional entries: PowerSGD's state, the loss scaler
        "state_entries": ["powersgd_state"] * bool(psgd) + ["scaler_state"] * bool(ls),
        # the step's metrics: with the loss scale and the skipped steps
        "metrics": ["scaled_metrics" if ls else "metrics"],
        # the evaluation's step (through the pipeline or eval_fn) and loop, counting correct predictions with
        # `accuracy`; none without an `eval` section
        "eval_step": [f"eval_step_{counting}", f"pipeline_eval_{counting}" if pp else f"eval_{counting}"] if ev else [],
        "evaluate": [f"evaluate_{counting}"] * bool(ev),
    }
