"""The parts of torch's parallel, pipeline_main and pipeline_stages templates (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any

from .choose import chosen


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    t = ctx["torch"]
    pp = t.pipeline
    ls = bool(ctx["training"]["loss_scaling"])
    ev = ctx["eval"]
    repeats = any(layer["op"] == "repeat" for layer in ctx["layers"])
    c = t.comm
    own = set(t.tp_plan.values())
    own_experts, own_channels = bool(own & {"experts", "experts_sp"}), "gather" in own
    return {
        # ---- parallel.py.j2
        # parallelize's docstring: a pipeline stage is parallelised on its own; tensor parallelism comes first
        "parallelize_doc": chosen(("stage_doc", bool(pp)), ("tp_doc", bool(t.tp_plan))),
        # tensor parallelism (a TP_PLAN): the plan applied (a stage: its own layers' entries), then the layers
        # that split their own parameters (moe experts, batch_norm channels: the comment names which), then
        # dropout told the sequence positions of this rank
        "tensor_parallel": (["tp_styles", "apply_tp_plan_stage" if pp else "apply_tp_plan"]
                            + ([("own_both" if own_channels else "own_experts") if own_experts else "own_channels",
                                "split_own"] if own_experts or own_channels else [])
                            + chosen(("sequence_dropout", bool(t.sequence_dropout)))) if t.tp_plan else [],
        # FSDP2: MixedPrecisionPolicy imported where compute is mixed or gradients are compressed; the plan's
        # shard dimensions (shard_placement_fn) where it shards; whole parameters and experts left to their own
        # reductions; the precision policy; one group per repeated block (a stage: the blocks it holds) and the
        # root; gloo collectives on CPU; the blocks' all-gather prefetch (communication.prefetch)
        "fully_shard": (chosen(("after_tensor_parallel", bool(t.tp_plan)))
                        + ["fsdp_import_mp" if t.mixed or c["dtype"] else "fsdp_import",
                           "shard_placement" if t.sharded else "fsdp_kw"]
                        + chosen(({"data": "ignore_whole_data", "fsdp": "ignore_whole_fsdp"}[t.shard_axis], t.whole), ("ignore_experts", t.ep))
                        + ([("mp_mixed_compressed" if c["dtype"] else "mp_mixed") if t.mixed else "mp_compressed"]
                           if t.mixed or c["dtype"] else [])
                        + ["shard_blocks_stage" if pp else "shard_blocks"]
                        + (["gloo_prefetch" if c["prefetch"] else "gloo"] if t.sharded else [])
                        + (["prefetch_stage" if pp else "prefetch"] if c["prefetch"] else [])) if t.fsdp else [],
        # DDP: the experts left out of its reducer (reduce_expert_grads reduces them)
        "ddp_ignore": chosen(("ddp_ignore_experts", t.ep)),
        # DDP's process group: the batch axes flattened where there are several, else the one axis's
        "ddp_group": (["ddp_flat" if t.ddp_flat else "ddp_axis"] if t.dp == "ddp" else []),
        # keep_table_rows: a stage's tables may be absent (getattr), else they are the model's
        "table_rows": (["table_rows_stage" if pp else "table_rows"] if t.keep_table_rows else []),
        # expert_parallel: sub-meshes of axes in layout order (EXPERT_LAYOUTS over several axes); the all-to-all
        # group over several mesh axes (a group per mesh column) or the `expert` axis's; each expert parameter's mesh
        "expert_mesh_of": chosen(("mesh_of", t.ep and t.expert_layouts)),
        "ep_group": (["ep_group_columns" if t.expert_flat else "ep_group_axis"] if t.ep else []),
        "expert_mesh": (["expert_mesh_of" if t.expert_layouts else "expert_mesh"] if t.ep else []),
        # reduce_expert_grads: the experts' gradients (moe experts split over `expert`), or every gradient
        # averaged over `expert` (the axis splits the batch only); FSDP2 averaged the others over its axes only
        "reduce_doc": (["reduce_doc_experts" if t.ep else "reduce_doc_batch"] if t.reduce_experts else []),
        "reduce_grads": ((["expert_grads_fsdp" if t.fsdp else "expert_grads"] if t.ep else ["batch_grads"])
                         if t.reduce_experts else []),
        # ---- pipeline_stages.py.j2
        # moe layers in a pipeline: AUX_LOSS and CarryAuxLoss, which starts their gradient at a stage's output
        "stage_module_head": chosen(("carry_aux_loss", bool(pp) and t.aux_loss)),
        # tables tied across stages: TIED, their groups, and the reduction of their copies' gradients
        "stage_module_tail": chosen(("tied_tables", bool(pp and pp["tied"]))),
        # ---- pipeline_main.py.j2 (the pipelined training loop; lists are empty without a pipeline)
        # the PipelineStage subclasses: MaskedStage tells dropout / batch_norm the micro-batch it runs, AuxStage
        # sums the moe layers' load-balancing losses
        "stage_classes": chosen(("masked_stage", t.micro_state), ("aux_stage", t.aux_loss)) if pp else [],
        # each stage on the meta device: its parameters stored as the program keeps them, experts laid out
        # before parallelize (which leaves them alone), then tensor / data parallelism
        "build_stage": chosen(("store_params", t.store_params), ("expert_parallel", t.ep), ("parallelize", t.parallelized)) if pp else [],
        # tied tables across stages: their process groups, created by every rank
        "after_dry_run": chosen(("tie_groups", bool(pp and pp["tied"]))),
        # after the parameters are filled: dropout keys by module name (random layers); batch_norm's group over
        # the batch axes (flattened when there are several)
        "after_fill": (chosen(("dropout_keys", t.random))
                       + (["batch_group_flat" if t.sync_bn_flat else "batch_group_axis", "batch_norm_group"]
                          if t.sync_bn else [])) if pp else [],
        # --compile: in place per repeated block (canonical FQNs), else per stage
        "compile": (["compile_blocks" if repeats else "compile_stages"]) if pp else [],
        # make_optimizer also returns the float32 master copies (Shards) where it steps on them
        "make_optimizer": (["make_optimizer_shards" if t.shards else "make_optimizer"]) if pp else [],
        # before the resume: the tied tables' copies (counted once by the norm), read from the Shards' leaves
        # where the optimizer steps on them; the loss scaler
        "before_resume": ((["tied_copies_shards" if t.shards else "tied_copies"] if pp["tied"] else [])
                          + chosen(("loss_scaler", ls))) if pp else [],
        # the autocast context the forward passes run under (mixed compute)
        "before_read": chosen(("autocast", bool(pp) and t.autocast)),
        # the evaluation: batch_norm's running statistics held (micro-batch id -1) where it keeps micro-batch
        # state; the accuracy's counts and value where the evaluation reports it
        "eval_begin": chosen(("eval_micro_ids", bool(pp and ev) and t.micro_state)),
        "eval_batch": chosen(("accuracy_sums", bool(pp and ev and ev["accuracy"]))),
        "eval_end": chosen(("val_accuracy", bool(pp and ev and ev["accuracy"]))),
        # loss scaling: the memory report waits for the first update that is not skipped
        "before_loop": chosen(("report_once", bool(pp) and ls)),
        # moe: the factor of the load-balancing losses' gradient (times the loss scale with loss scaling)
        "step_begin": (["aux_loss_grad_scaled" if ls else "aux_loss_grad"] if bool(pp) and t.aux_loss else []),
        # dropout / batch_norm: the micro-step's mask draw and batch_norm ids (MaskedStage reads them)
        "micro_step_begin": chosen(("micro_step_ids", bool(pp) and t.micro_state)),
        # the schedule's step under loss_parallel (vocab-parallel logits) and / or autocast
        "schedule_step": ([("step_loss_parallel_autocast" if t.autocast else "step_loss_parallel") if t.vocab_parallel
                           else "step_autocast" if t.autocast else "step_plain"] if pp else []),
        # the last stage's losses: unscaled with loss scaling
        "add_loss": (["loss_sum_scaled" if ls else "loss_sum"] if pp else []),
        # after the backward pass: the gradients FSDP2 / DDP do not reduce (experts, whole parameters, vocab
        # tables' rows, tied copies), then the float32 gradients and the loss scale's unscaling
        "after_backward": (chosen(("reduce_expert_grads", t.reduce_experts), ("reduce_whole_grads", t.whole), ("keep_table_rows", t.keep_table_rows), ("reduce_tied_grads", bool(pp["tied"])), ("take_grads", t.shards))
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
        "row": chosen(("loss_scale_row", bool(pp) and ls), ("tokens_row", bool(pp) and bool(ctx["seq_len"])), ("eval_row", bool(pp) and bool(ev))),
        # an evaluation outside a save: its time is not the next step's
        "after_save": chosen(("eval_tick", bool(pp) and bool(ev))),
        # a Hugging Face model: --export_hf
        "after_export": chosen(("export_hf", bool(pp) and bool(ctx["hf"]))),
    }
