"""The parts of torch's main, train, model and params templates (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any

from .choose import chosen


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    return train_parts(ctx) | main_parts(ctx) | model_parts(ctx) | params_parts(ctx)


def train_parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """train.py.j2's slots (templates/torch/train_parts.py.j2 holds the macros, in slot order)."""
    t = ctx["torch"]
    return {
        # the docstring's commands: torchrun over the mesh's ranks (and the multi-machine launchers), or python
        "usage": ["usage_ranks" if t.distributed else "usage_process"],
        # context parallelism: its attention's ring (context.py.j2), beside the model
        "model_sections": ["context_parallel"] if t.context else [],
        # precision.float8: the FP8 linear layers; several ranks: the mesh applied to the model
        "runtime_sections": chosen(("float8", ctx["training"]["precision"]["float8"]), ("parallel", t.distributed)),
        # training.offload: activations to host memory and back
        "memory_sections": ["offload"] if ctx["predicted"]["offload"] else [],
        # float16 loss scaling: the LossScaler
        "optimizer_sections": ["loss_scale"] if ctx["training"]["loss_scaling"] else [],
        # the training loop: over pipeline stages, or of the one model
        "main_section": ["pipeline_main" if t.pipeline else "main"],
    }


def main_parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """main.py.j2's slots (templates/torch/main_parts.py.j2 holds the macros, in slot order)."""
    t = ctx["torch"]
    ev = ctx["eval"]
    accuracy = bool(ev and ev["accuracy"])
    scaling = bool(ctx["training"]["loss_scaling"])  # float16 loss scaling (LossScaler)
    offload = bool(ctx["predicted"]["offload"])  # training.offload: activations to host memory
    names = [i["name"] for i in ctx["inputs"]]
    repeats = len(ctx["repeats"])

    slots = {
        # ---- one micro-batch's passes
        # the logits split over `tensor` on the vocabulary: the passes under loss_parallel's cross-entropy
        "micro_body": ["in_loss_parallel" if t.vocab_parallel else "as_is"],
        # the comment on the forward pass's contexts (autocast, activation offload: t.step_contexts)
        "forward_note": chosen(("compute_dtype_offload_note", t.autocast and offload),
                           ("compute_dtype_note", t.autocast and not offload),
                           ("offload_note", offload and not t.autocast)),
        # the forward pass inside those contexts, where there are any
        "forward": ["forward_in_contexts" if t.step_contexts else "forward"],
        # loss scaling: the backward pass of the scaled loss
        "backward": ["backward_scaled" if scaling else "backward"],
        # after optimizer.step(): the parameters rewritten from what the optimizer stepped (ZeRO slices or
        # float32 master copies), when it stepped Shards of them
        "after_step": ["write_back_slices" if t.zero else "write_back_copies"] if t.shards else [],
        # ---- evaluate (a spec with an evaluation; none without one, below)
        # its docstring: eval mode turns dropout and batch statistics off where the model has them
        "eval_mode": chosen(("without_dropout", t.micro_state)),
        # a classification loss: the accuracy too (docstring, sums, counts, metric)
        "eval_docstring": chosen(("val_accuracy_doc", accuracy)),
        "eval_sums": ["sums_losses_counts" if accuracy else "sums_losses"],
        # the evaluation computes in COMPUTE_DTYPE like the training step
        "eval_contexts": chosen(("eval_autocast", t.autocast)),
        # the loss's targets: one of the batch's inputs, or an output of the model (predict=True)
        "eval_predict": ["targets_from_batch" if ctx["loss"]["targets"] in names
                         else "targets_from_model"],
        "eval_batch": chosen(("count_correct", accuracy)),
        # several ranks: the sums over every rank
        "eval_reduce": chosen(("all_reduce_sums", t.distributed)),
        "eval_metrics": chosen(("val_accuracy", accuracy)),
        # ---- main: the model built and filled
        # several ranks: the process group and mesh (the dry run builds the mesh without them); context
        # parallelism: this rank's place on the ring
        "setup": (["setup_ranks"] + chosen(("join_context", t.context))) if t.distributed else ["setup_process"],
        # the meta model's comment: parallelised there when some parameter becomes a shard
        "meta_note": chosen(("parallelised_there", t.tp_plan or t.fsdp or t.ep)),
        # on the meta device: the parameters' storage dtype, float8 linears, then the parallelisation (the
        # experts first; experts split without parallelize: DDP replicates the rest)
        "on_meta": chosen(("store_params", t.store_params), ("to_float8", ctx["training"]["precision"]["float8"]),
                      ("expert_parallel_first", t.ep and t.parallelized), ("parallelize", t.parallelized),
                      ("expert_parallel_then_ddp", t.ep and not t.parallelized)),
        # several ranks: the checkpoint to resume from is the one most ranks hold
        "resolve_resume": ["resolve_resume_most" if t.distributed else "resolve_resume"],
        # dropout layers: their seed and key; batch_norm under data parallelism: its process group
        "after_fill": chosen(("dropout_keys", t.random), ("batch_group_flat", t.sync_bn and t.sync_bn_flat),
                         ("batch_group_axis", t.sync_bn and not t.sync_bn_flat), ("sync_batch_norm", t.sync_bn)),
        # DDP: the loop calls the replicated model (its gradients compressed with a communication hook)
        "runner": chosen(("replicate", t.dp == "ddp"), ("compress_gradients", t.dp == "ddp" and t.comm["hook"]),
                     ("runner_model", t.dp != "ddp")),
        # --compile: the repeated blocks one by one (one repeat, or several), else the whole model
        "compile": ["compile_blocks" if repeats == 1 else "compile_blocks_of_repeats" if repeats else "compile_model"],
        # the optimizer on Shards (ZeRO slices, float32 or not; float32 master copies) or on the parameters;
        # loss scaling: the scaler
        "optimizer": chosen(("optimizer_zero_master", t.shards and t.zero and t.master),
                        ("optimizer_zero", t.shards and t.zero and not t.master),
                        ("optimizer_master", t.shards and not t.zero), ("optimizer", not t.shards),
                        ("loss_scaler", scaling)),
        # an evaluation: its held-out data, and --eval-only
        "eval_start": chosen(("eval_only", ev)),
        # the forward pass's contexts (t.step_contexts) made once
        "step_objects": chosen(("autocast", t.autocast), ("activation_offload", offload)),
        # loss scaling: the console counts the skipped steps
        "console_args": chosen(("console_skipped", scaling)),
        # batches drawn ahead (torch/data.py.j2 prefetched): read laid out (sharding.inputs), or as tensors
        "before_loop": chosen(("prefetch_relaid", t.prefetch and t.input_layouts),
                          ("prefetch", t.prefetch and not t.input_layouts)),
        # loss scaling: the memory report waits for the first step that updates
        "loop_state": chosen(("memory_reported", scaling)),
        # ---- the training step
        "step_start": chosen(("offload_reset", offload)),
        # data.mask: the loss's factor for this step's unmasked targets
        "step_scale": chosen(("mask_scale", ctx["data"]["mask"])),
        # micro-step k: whether it is the last (gradients synchronised on it), its batch (drawn ahead, read
        # laid out, or read as tensors; laid-out inputs to this rank's rows), where it sits (dropout masks
        # drawn per pipeline micro-batch of a one-stage pipeline spec, or per micro-step)
        "micro_batch": chosen(("last_micro_step", t.sync_last_micro), ("next_batch", t.prefetch),
                          ("read_batch", not t.prefetch and t.input_layouts),
                          ("batch_of_tensors", not t.prefetch and not t.input_layouts),
                          ("relayout", t.input_layouts), ("micro_step_of_chunks", t.chunk_masks),
                          ("micro_step_state", t.micro_state and not t.chunk_masks)),
        # gradients synchronised on the last micro-step only: DDP no_sync before it, FSDP2's flag
        "micro_step": ["no_sync_before_last" if t.dp == "ddp" else "sync_on_last" if t.fsdp else "micro_passes"],
        # after the backward passes: the loss summed over the ranks (and the stop flag); the gradients the
        # program reduces itself (experts, context ranks, FSDP2's whole parameters), a vocab-parallel table's rows
        "after_backward": chosen(("sum_loss_and_stop", t.distributed), ("reduce_expert_grads", t.reduce_experts),
                             ("reduce_context_grads", t.context), ("reduce_whole_grads", t.whole),
                             ("keep_table_rows", t.keep_table_rows)),
        # Shards take their gradients (ZeRO-2 and more: reduce-scattered; ZeRO-1: sliced; else as float32);
        # loss scaling: the gradients unscaled, the step skipped where one is not finite
        "before_clip": chosen(("take_grads_scattered", t.shards and t.zero >= 2),
                          ("take_grads_slices", t.shards and t.zero == 1),
                          ("take_grads_float32", t.shards and not t.zero), ("unscale", scaling)),
        # loss scaling: the update only where the gradients are finite
        "step_update": ["update_if_finite" if scaling else "update_each_step"],
        # the memory report counts the Shards
        "report_args": chosen(("report_shards", t.shards)),
        # the gradients zeroed (Shards' too), then the loss summed over the ranks
        "zero_grad": chosen(("zero_grad_shards", t.shards), ("zero_grad", not t.shards),
                        ("wait_for_sum", t.distributed)),
        # the metrics' row: offloaded bytes, the loss scale, tokens per second (a sequence), the evaluation
        "row": chosen(("offloaded_bytes", offload), ("loss_scale_row", scaling), ("tokens_per_s", ctx["seq_len"]),
                  ("evaluation", ev)),
        "console_step_args": chosen(("eval_log", ev)),
        # several ranks: a signal on any stops every one
        "stop": ["stop_on_any_rank" if t.distributed else "stop_on_signal"],
        # an evaluation is not a step: the clock restarts after one
        "after_save": chosen(("restart_clock_after_eval", ev)),
        # a Hugging Face model: --export-hf and --logits (the output without the loss's targets; gathered
        # over the data shards)
        "after_export": chosen(("export_hf_and_logits", ctx["hf"]),
                           ("output_without_targets", ctx["hf"] and ctx["loss"]["predict_targets"]),
                           ("logits_to_numpy", ctx["hf"]), ("gather_logits", ctx["hf"] and t.distributed),
                           ("save_logits", ctx["hf"])),
    }
    if not ev:  # no evaluate()
        slots.update({slot: [] for slot in slots if slot.startswith("eval_")})
    return slots


def model_parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """model.py.j2's slots (templates/torch/model_parts.py.j2 holds the macros, in slot order)."""
    t = ctx["torch"]
    remat = ctx["training"]["remat"]
    # remat without repeated blocks: the whole model's forward pass is one checkpointed function
    whole = remat != "none" and not ctx["blocks"]
    # what asks the model for its output instead of the loss: --logits (a Hugging Face model), the
    # evaluation, generate.py --check (a language model)
    # (each as the first, and as a later one joined with " and ")
    uses = [(first, later) for first, later, used in (
        ("logits_use", "", ctx["hf"]), ("evaluation_use", "and_evaluation_use", ctx["eval"]),
        ("check_use", "and_check_use", ctx["sampling"])) if used]
    return {
        # the micro-batch's place (dropout masks, batch statistics read it); the helpers of rotary
        # embeddings and of per-head q / k norms
        "model_helpers": chosen(("micro_step", t.micro_state), ("rope", t.rotary), ("head_norm", t.qk_norm)),
        # selective remat: the policy that keeps the weight matmuls' outputs
        "remat_policy": ["selective_remat"] if remat == "selective" else [],
        # the loss as a function: pipeline stages, a layer's own loss and the evaluation call it
        "loss_fn": ["loss_fn"] if t.pipeline or t.aux_loss or ctx["eval"] else [],
        # a layer's own loss (moe's load balancing) adds to the model's
        "model_docstring": ["plus_aux_losses"] if t.aux_loss else [],
        "forward_params": ["predict_param"] if uses else [],
        "forward_open": ["layers_fn"] if whole else [],
        "forward_close": (["checkpoint_layers_selective" if remat == "selective" else "checkpoint_layers"]
                          if whole else []),
        "predict": ["predict_for", uses[0][0], *(later for _, later in uses[1:]), "predict_output"] if uses else [],
        "model_loss": ["loss_plus_aux" if t.aux_loss else "loss_of_prediction"],
    }


def params_parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """params.py.j2's slots (templates/torch/model_parts.py.j2 holds the macros, in slot order)."""
    t = ctx["torch"]
    pipelined = bool(t.pipeline)  # the model is one pipeline stage
    return {
        # a Hugging Face model: its parameter names and files (common/hf.py.j2)
        "hf_params": ["hf_params"] if ctx["hf"] else [],
        # parameters stored in another dtype than float32: store_params casts the meta model
        "store_params": ["store_params"] if t.store_params else [],
        # fill_model: buffers filled too where the model has them; a pipeline stage holds some parameters
        # of PARAMS, a whole model every one
        "fill_docstring": (["buffers_from_init"] if t.has_buffers else []) + (["one_stage"] if pipelined else []),
        "fill_check": ["stage_params_known" if pipelined else "model_params_equal"],
        # buffers from their init: this rank's slice of those split over `tensor` (batch_norm's channels)
        "fill_buffers": ["buffers_loop", "buffer_slices" if t.tp_channels else "whole_buffers"] if t.has_buffers else [],
        # a Hugging Face model: export_params writes --export-hf too
        "export_docstring": ["export_hf_doc"] if ctx["hf"] else [],
    }
