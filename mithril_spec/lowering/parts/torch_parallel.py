"""The parts of torch's parallel, pipeline_main and pipeline_stages templates (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def _when(*pairs: tuple[bool, str]) -> list[str]:
    """The macro names whose condition holds, in order."""
    return [name for cond, name in pairs if cond]


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    t = ctx["torch"]
    pp = t.pipeline
    ls = bool(ctx["training"]["loss_scaling"])
    ev = ctx["eval"]
    repeats = any(layer["op"] == "repeat" for layer in ctx["layers"])
    return {
        # ---- pipeline_main.py.j2 (the pipelined training loop; lists are empty without a pipeline)
        # the PipelineStage subclasses: MaskedStage tells dropout / batch_norm the micro-batch it runs, AuxStage
        # sums the moe layers' load-balancing losses
        "stage_classes": _when((t.micro_state, "masked_stage"), (t.aux_loss, "aux_stage")) if pp else [],
        # each stage on the meta device: its parameters stored as the program keeps them, experts laid out
        # before parallelize (which leaves them alone), then tensor / data parallelism
        "build_stage": _when((t.store_params, "store_params"), (t.ep, "expert_parallel"),
                             (t.parallelized, "parallelize")) if pp else [],
        # tied tables across stages: their process groups, created by every rank
        "after_dry_run": _when((bool(pp and pp["tied"]), "tie_groups")),
        # after the parameters are filled: dropout keys by module name (random layers); batch_norm's group over
        # the batch axes (flattened when there are several)
        "after_fill": (_when((t.random, "dropout_keys"))
                       + (["batch_group_flat" if t.sync_bn_flat else "batch_group_axis", "batch_norm_group"]
                          if t.sync_bn else [])) if pp else [],
        # --compile: in place per repeated block (canonical FQNs), else per stage
        "compile": (["compile_blocks" if repeats else "compile_stages"]) if pp else [],
        # make_optimizer also returns the float32 master copies (Shards) where it steps on them
        "make_optimizer": (["make_optimizer_shards" if t.shards else "make_optimizer"]) if pp else [],
        # before the resume: the tied tables' copies (counted once by the norm), read from the Shards' leaves
        # where the optimizer steps on them; the loss scaler
        "before_resume": ((["tied_copies_shards" if t.shards else "tied_copies"] if pp["tied"] else [])
                          + _when((ls, "loss_scaler"))) if pp else [],
        # the autocast context the forward passes run under (mixed compute)
        "before_read": _when((bool(pp) and t.autocast, "autocast")),
        # loss scaling: the memory report waits for the first update that is not skipped
        "before_loop": _when((bool(pp) and ls, "report_once")),
        # moe: the factor of the load-balancing losses' gradient (times the loss scale with loss scaling)
        "step_begin": (["aux_loss_grad_scaled" if ls else "aux_loss_grad"] if bool(pp) and t.aux_loss else []),
        # dropout / batch_norm: the micro-step's mask draw and batch_norm ids (MaskedStage reads them)
        "micro_step_begin": _when((bool(pp) and t.micro_state, "micro_step_ids")),
        # the schedule's step under loss_parallel (vocab-parallel logits) and / or autocast
        "schedule_step": ([("step_loss_parallel_autocast" if t.autocast else "step_loss_parallel") if t.vocab_parallel
                           else "step_autocast" if t.autocast else "step_plain"] if pp else []),
        # the last stage's losses: unscaled with loss scaling
        "add_loss": (["loss_sum_scaled" if ls else "loss_sum"] if pp else []),
        # after the backward pass: the gradients FSDP2 / DDP do not reduce (experts, whole parameters, vocab
        # tables' rows, tied copies), then the float32 gradients and the loss scale's unscaling
        "after_backward": (_when((t.reduce_experts, "reduce_expert_grads"), (t.whole, "reduce_whole_grads"),
                                 (t.keep_table_rows, "keep_table_rows"), (bool(pp["tied"]), "reduce_tied_grads"),
                                 (t.shards, "take_grads"))
                           + ([("unscale_shards" if t.shards else "unscale")] if ls else [])) if pp else [],
        # the update: skipped on a non-finite gradient with loss scaling (then the scheduler waits, and the memory
        # report waits for the first update made); after optimizer.step(), the parameters written back from the
        # float32 copies (Shards)
        "optimizer_step": (["optimizer_step_finite" if ls else "optimizer_step"] if pp else []),
        "after_step": (["write_back_finite" if ls else "write_back"] if pp and t.shards else []),
        "scheduler_step": (["scheduler_step_finite" if ls else "scheduler_step"] if pp else []),
        # the gradients cleared (the Shards' too); the load-balancing losses added to the logged loss
        "after_update": ([("zero_grad_shards" if t.shards else "zero_grad"),
                          ("aux_loss_sum" if t.aux_loss else "loss_sum_comment")] if pp else []),
        # the metrics row's optional columns
        "row": _when((bool(pp) and ls, "loss_scale_row"), (bool(pp) and bool(ctx["seq_len"]), "tokens_row"),
                     (bool(pp) and bool(ev), "eval_row")),
        # an evaluation outside a save: its time is not the next step's
        "after_save": _when((bool(pp) and bool(ev), "eval_tick")),
        # a Hugging Face model: --export_hf
        "after_export": _when((bool(pp) and bool(ctx["hf"]), "export_hf")),
    }
