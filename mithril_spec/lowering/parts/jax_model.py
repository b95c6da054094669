"""The parts of jax's ops, model and train_step templates (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any

from ...ops import OPS


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    return {**_ops(ctx), **_model(ctx), **_train_step(ctx)}


def block_parts(b: dict[str, Any]) -> dict[str, list[str]]:
    """The slots of one repeated block's functions in model.py.j2 (`blk.parts`; lowering/jax_program.py sets them
    once the block's fields are known), each macro of model_parts.py.j2 taking the block."""
    return {
        # the copy sums its moe layers' load-balancing losses
        "copy_start": ["zero_aux_loss"] * b["has_aux"],
        # the stack function's docstring: its copies' dropout keys (from `first` in a pipeline stage, or their own
        # repeat's name and index), the rows' copies (padding rows skipped), the buffers and losses it returns
        "stack_doc": ([("staged_keys_doc" if b["staged"] else "named_keys_doc" if b["named_keys"] else "keys_doc")]
                      * b["has_dropout"])
        + [("padded_copies_doc" if b["padded"] else "copies_doc")] * b["per_copy"]
        + ["buffers_aux_doc" if b["has_aux"] else "buffers_doc"] * b["has_buffers"]
        + ["aux_doc"] * (b["has_aux"] and not b["has_buffers"]),
        # what the scan runs over beside the parameters: the buffers, each row's copy (a pipeline stage gives them,
        # -1 a padding row), the copies' dropout keys, and the tied tables every copy reads
        "stack_rows": ["buffer_rows"] * b["has_buffers"] + ["copy_rows"] * b["per_copy"] + ["real_rows"] * b["padded"]
        + [("named_key_rows" if b["named_keys"] else "copy_key_rows" if b["per_copy"] else
            "staged_key_rows" if b["staged"] else "key_rows")] * b["has_dropout"]
        + ["shared_rows"] * bool(b["shared"]),
        # the copy under remat; the evaluation's pass (train False) without it
        "stack_block": ["block_or_eval" if b["train_arg"] else "block"],
        # a pipeline stage's padding rows skip the block: their function passes the input (and buffers) through
        "stack_skip": [{(False, False): "skip", (True, False): "skip_buffers", (False, True): "skip_aux",
                        (True, True): "skip_buffers_aux"}[(bool(b["has_buffers"]), bool(b["has_aux"]))]] * b["padded"],
        # the scan's step carries the load-balancing losses' sum
        "stack_step": ["step_with_aux" if b["has_aux"] else "step"],
        # the block's moved buffers back among all the buffers
        "stack_end": ["merged_buffers"] * b["has_buffers"],
        # the forward pass adds the repeat's load-balancing losses to its own
        "after_repeat": ["add_aux"] * b["has_aux"],
    }


def _model(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """model.py.j2's slots (templates/jax/model_parts.py.j2)."""
    j = ctx["jax"]
    remat = ctx["training"]["remat"] != "none"
    ev = ctx["eval"]
    return {
        # the helpers before the ops': constrain() inside the replicas' shard_map, project_together where some
        # layer projects several weights in one matmul
        "shared_helpers": ["constrain"] * j.comm["replicas"] + ["project_together"] * ("project_together" in j.helpers),
        # a block's copies: remat applies to each, or they keep their matmuls' outputs (remat: none)
        "stack_doc": ["remat_doc" if remat else "saved_outputs_doc"],
        # the forward pass sums the moe layers' load-balancing losses
        "forward_start": ["zero_aux_loss"] * j.has_aux,
        # loss_fn's forward pass: remat over the whole of it where no repeated block takes it
        "forward_call": ["remat_forward" if remat and not ctx["blocks"] else "forward"],
        # the targets are a model input: read from the batch (else forward returns them)
        "read_targets": ["targets_from_batch"] * bool(ctx["loss"]["targets_is_input"]),
        # the loss, with the load-balancing losses
        "loss_return": ["loss_with_aux" if j.has_aux else "loss_alone"],
        # eval_fn's results: the correct predictions counted with `accuracy`
        "eval_return": ["loss_and_hits" if ev and ev["accuracy"] else "loss_only"],
    }


def _ops(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """ops.py.j2's slots (templates/jax/ops_parts.py.j2): what the helper functions hold, each operator's decided by
    its ops/*.py `jax_parts` from the attrs of every layer of it, so that a helper holds only the code some layer
    of this program runs."""
    j = ctx["jax"]
    ring = bool(j.context)  # context parallelism: the sequence held in positions() order, split over `context`
    program = {
        "ring": ring,
        "evaluates": ctx["eval"] is not None,  # the evaluation runs the layers with `train` False
        # the random helpers, once per program (dropout layers, attention's dropout): under context parallelism a
        # mask keeps the one-device mask's entries of its places
        "random": ["random_helpers"] + ["keep_in_places"] * ring + ["dropout_tail"],
        # the operators some layer of which draws random numbers
        "draws": {op for op, uses in j.op_attrs.items() if any(OPS[op].is_random(a) for a in uses)},
    }
    out: dict[str, list[str]] = {}
    for kind, op in OPS.items():
        out.update(op.jax_parts(j.op_attrs.get(kind, []), program))
    # the loss: the mean over the unmasked targets (data.mask) or over every target
    out["cross_entropy_def"] = ["masked_cross_entropy" if ctx["data"]["mask"] else "mean_cross_entropy"]
    return out


def _train_step(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """train_step.py.j2's slots (templates/jax/train_step_parts.py.j2)."""
    j = ctx["jax"]
    ls = ctx["training"]["loss_scaling"]  # None: no loss scaling
    pp = j.pipeline  # the jax pipeline (more than one stage); ctx["pipeline"]: the spec's, maybe of one stage
    chunks = ctx["pipeline"] is not None and not pp  # a one-stage pipeline: its chunks are the step's micro-batches
    mask = bool(ctx["data"]["mask"])
    replicas, psgd = j.comm["replicas"], j.comm["powersgd"]
    ev = ctx["eval"]
    powersgd = bool(psgd)  # the replicas' gradients reduced by PowerSGD (else compressed)
    counting = bool(ev and ev["accuracy"])  # the evaluation counts the correct predictions
    return {
        # the loss scaler's update rule: torch's GradScaler (dynamic) or a fixed scale (skipped steps counted)
        "scaler_update": ["update_scaler_dynamic" if ls["dynamic"] else "update_scaler_fixed"] if ls else [],
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
        "sums": [("replica_powersgd" if powersgd else "replica_compressed") if replicas else "zero_sums"],
        # the micro-batches' loop: none for one
        "accumulation": ["one_micro_batch" if j.accum == 1 else "scan_micro_batches"],
        # a replica's means over the replicas, its batch split over `data` (ZeRO's gradients come out split),
        # and the shard_map's results; or the sums themselves
        "replica_end": ["replica_reduce_powersgd" if powersgd else "replica_reduce_compressed"] * replicas,
        "replicas_split": ["batch_split_zero" if j.zero else "batch_split"] * replicas,
        "gathered": [("shard_map_powersgd" if powersgd else "shard_map_compressed") if replicas else "summed"],
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
        "eval_step": (["eval_step_counting", "pipeline_eval_counting" if pp else "eval_counting"] if counting else
                      ["eval_step_loss", "pipeline_eval_loss" if pp else "eval_loss"]) if ev else [],
        "evaluate": ["evaluate_counting" if counting else "evaluate_loss"] * bool(ev),
    }
