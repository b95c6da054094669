"""The parts of jax's other templates (generate, config, README, state_names, ...) (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def _on(flag: Any, *names: str) -> list[str]:
    """`names` where `flag` holds, else none."""
    return list(names) if flag else []


# generate.py's slots, every one empty in a program without generate.py
GENERATE_SLOTS = (
    "generate_check_docstring", "generate_tokenizer_comment", "generate_decode_helpers",
    "generate_attention_defaults", "generate_attention_heads", "generate_attention_scores",
    "generate_attention_out_bias", "generate_pipelined_stack", "generate_full_forward", "generate_context_order",
    "generate_context_positions", "generate_forward_logits",
)


def _generate(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """generate.py's slots: a language model's (every slot empty without one: no generate.py)."""
    s, j = ctx["sampling"], ctx["jax"]
    if s is None:
        return {slot: [] for slot in GENERATE_SLOTS}
    pp = j.pipeline
    # what cached_attention takes (sampling.py) says which of its pieces it holds: grouped-query heads, biases
    # (o_bias: some layer biases only q, k and v)
    takes = {name for name, _ in s["attention_params"]}
    gqa, biased = "kv_heads" in takes, "bias" in takes
    return {
        # the module docstring's --check sentence: through the pipeline stages, or the one forward pass
        "generate_check_docstring": ["check_pipelined" if pp else "check_whole"],
        # TOKENIZER's comment says what a spec without a tokenizer encodes with
        "generate_tokenizer_comment": _on(not s["tokenizer"], "tokenizer_bytes"),
        # the functions cached_attention calls, those its layers need: q/k norms, scaled and plain rotary tables
        "generate_decode_helpers": [
            *_on(s["qk_norm"], "head_norm"),
            *_on(s["rope_scaled"], "scale_inv_freq"),
            *_on(s["rotary"], "rope_table_scaled" if s["rope_scaled"] else "rope_table", "rope_at"),
        ],
        # grouped-query attention: kv_heads defaults to the query heads
        "generate_attention_defaults": _on(gqa, "kv_heads_default"),
        # q, k, v: biased where a layer has biases, split into heads (fewer k/v heads under grouped-query),
        # normed and rotated where a layer does so
        "generate_attention_heads": [
            *_on(biased, "qkv_bias"),
            "heads_grouped" if gqa else "heads_equal",
            *_on(s["qk_norm"], "qk_head_norm"),
            *_on(s["rotary"], "rotate_at_pos"),
        ],
        # the cached keys and values repeated for grouped-query heads; the scores scaled by a layer's own scale
        # where one has it, and capped where a layer caps them
        "generate_attention_scores": [
            *_on(gqa, "repeat_kv_heads"),
            "scores_scaled" if s["score_scale"] else "scores",
            *_on(s["softcap"], "softcap_scores"),
        ],
        # the output projection's bias, where a layer has biases (o_bias asked where some biases q, k, v only)
        "generate_attention_out_bias": _on(biased, "out_bias_unless_qkv_only" if "o_bias" in takes else "out_bias"),
        # a pipelined repeat's copies run through the stages (shard_map over pipe)
        "generate_pipelined_stack": _on(pp, "pipelined_stack"),
        # --check's whole-sequence forward: refused with dropout under a pipeline, through the pipeline, or
        # train.py's forward
        "generate_full_forward": [
            ("full_forward_refused" if s["has_dropout"] else "full_forward_pipelined") if pp else "full_forward"
        ],
        # context parallelism: the forward's sequence in the balanced order of positions()
        "generate_context_order": _on(j.context, "context_order"),
        "generate_context_positions": _on(j.context, "positions_arg"),
        # the forward's logits, beside the moe layers' losses where a layer has one
        "generate_forward_logits": ["logits_beside_aux" if j.has_aux else "logits"],
    }


def _config(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """config.py's slots."""
    j, t = ctx["jax"], ctx["training"]
    pp = j.pipeline
    optimizer = t["optimizer"]["name"]
    piped_dropout = pp and any(b["has_dropout"] for b in ctx["blocks"] if b["name"] in pp["blocks"])
    return {
        # the canonical names of a pipelined stack's copies, numbered along its repeats (and their dropout keys
        # where a pipelined block has dropout)
        "config_pipelined_copies": _on(j.piped_copies, "pipelined_copies"),
        "config_pipelined_keys": _on(j.piped_copies and piped_dropout, "pipelined_keys"),
        # with repeated blocks: how their copies are stacked, how the pipeline splits the stack (one block's
        # repeats or several blocks' stacks, padding rows), what checkpoints hold
        "config_stacked_comment": _on(ctx["repeats"], *[
            "stacked_copies",
            *_on(pp, "pipe_split_groups" if pp and pp["groups"] else "pipe_split"),
            *_on(pp and pp["one_block_copies"], "pipe_one_block"),
            *_on(pp and pp["padded"], "pipe_padded"),
            "stacked_checkpoints",
        ]),
        # the batch_norm statistics (BUFFERS), or none
        "config_buffers": ["buffers_table" if ctx["buffers"] else "no_buffers"],
        # the pipeline's micro-batches: through the stages, or one after the other in a one-stage build
        "config_microbatches": _on(ctx["pipeline"], "microbatches"),
        "config_chunks_run": ["chunks_through_stages" if pp else "chunks_one_stage"],
        # the optimizer's own constants: adam's betas and eps (adamw's weight decay), sgd's momentum
        "config_optimizer": [
            *_on(optimizer in ("adam", "adamw"), "adam_constants"),
            *_on(optimizer == "adamw", "weight_decay"),
            *_on(optimizer == "sgd", "sgd_constants"),
        ],
        # the cosine schedule's floor
        "config_schedule": _on(t["schedule"]["name"] == "cosine", "min_lr_ratio"),
        # TF32 where the compute is float32; the loss scaling's constants where it scales
        "config_precision": [
            *_on(t["precision"]["compute"] == "float32", "tf32"),
            *_on(t["loss_scaling"], "loss_scale"),
        ],
        # the spec's checkpoint directory and interval, or none
        "config_checkpoints": ["checkpoints" if t["checkpoint"] else "no_checkpoints"],
    }


def _readme(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """README.md's slots."""
    j, t, ev, data = ctx["jax"], ctx["training"], ctx["eval"], ctx["data"]
    pp = j.pipeline
    return {
        # the table's pipeline row: the pipelined repeats, virtual stages, several blocks' or padded stages
        "readme_pipeline_row": _on(pp, "pipeline_row"),
        "readme_pipeline_stages": [
            *_on(pp and pp["virtual_stages"] > 1, "virtual_stages"),
            *_on(pp and pp["groups"], "stage_groups"),
            *_on(pp and not pp["groups"] and pp["padded"], "stage_padding"),
        ],
        # the metrics past every program's: tokens/s for sequences, the evaluation's loss (and accuracy)
        "readme_metrics_fields": [
            *_on(ctx["seq_len"], "tokens_per_s"),
            *_on(ev, "val_loss_after_eval"),
            *_on(ev and ev["accuracy"], "val_accuracy"),
        ],
        "readme_tensorboard_fields": _on(ev, "val_loss"),
        # a transformers model's flags: --init-params DIR, --export-hf, --logits
        "readme_hf_flags": _on(ctx["hf"], "hf_flags"),
        # --checkpoint-dir's default: the spec's directory and interval, or none
        "readme_checkpoint_default": ["checkpoint_default" if t["checkpoint"] else "no_checkpoint_default"],
        # what --data reads (per data kind), its default path, the part held out for the evaluation
        "readme_data_flag": [
            {"arrays": "data_arrays", "text": "data_text", "tokens": "data_tokens"}.get(data["kind"], "data_synthetic"),
            *_on(data["kind"] != "synthetic", "data_default"),
            *_on(ev and ev["split"], "data_held_out"),
        ],
        # --eval-only with an eval section: on the eval file, held-out samples or drawn ones; every N steps
        "readme_eval_only_flag": _on(ev, "eval_only_flag"),
        "readme_eval_samples": [("eval_file" if ev["path"] else "eval_held_out" if ev["split"] else "eval_drawn")]
        if ev else [],
        "readme_eval_every": _on(ev and ev["every"], "eval_every"),
        # --seed: synthetic evaluation samples drawn from S + 2
        "readme_seed_eval": _on(ev and data["kind"] == "synthetic", "seed_eval"),
        # the paragraphs on repeated blocks and on the pipeline
        "readme_repeated_blocks": _on(ctx["repeats"], "repeated_blocks"),
        "readme_pipeline_paragraph": _on(pp, "pipeline_paragraph"),
        # generate.py's section (a language model): the tokenizer's default, what --check runs
        "readme_sampling": _on(ctx["sampling"], "sampling_section"),
        "readme_sampling_tokenizer": _on(ctx["sampling"] and ctx["sampling"]["tokenizer"], "sampling_tokenizer"),
        "readme_sampling_check": ["check_pipelined" if pp else "check_whole"],
    }


def _state_names(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """state_names.py's slots: the names of stacked copies, where there are repeated blocks."""
    j, stacked = ctx["jax"], bool(ctx["repeats"])
    pp = j.pipeline
    return {
        "state_names_header": _on(stacked, "stacked_header"),
        # the functions of stacked names (some_copy where pipelined stacks of several blocks have padding
        # rows in front, so that a stack's first row need not be a real copy)
        "state_names_stacked": _on(stacked, "copy_name", "copies", *_on(j.piped_groups, "some_copy"), "stacked_names"),
        # copy_name: the copies of a pipelined stack numbered along its repeats (PIPELINED_COPIES), per stack
        # of several blocks (STACK_ORDERS) or of the one pipelined repeat
        "state_names_copy_name_doc": _on(j.piped_copies, "pipelined_numbering"),
        "state_names_pipelined_copy": ["pipelined_copy_grouped"] if j.piped_groups else _on(j.piped_copies, "pipelined_copy"),
        # copies: the rows of a pipelined stack in stage order (STACK_ORDER(S), padding rows -1), else in order
        "state_names_copies_doc": _on(pp, "stack_order_rows_padded" if pp and pp["padded"] else "stack_order_rows"),
        "state_names_copies_rows": [
            "rows_of_orders" if j.piped_groups else "rows_of_order" if pp else "rows_in_order"
        ],
        # state_shape: a stacked parameter's shape is one real copy's, after its rows (padding rows counted)
        "state_names_shape_doc": _on(stacked, "copies_first"),
        "state_names_shape": [
            "shape_of_some_copy" if j.piped_groups else "shape_of_first_copy",
            "stacked_shape_rows" if j.piped_padded else "stacked_shape_copies",
        ] if stacked else ["shape"],
    }


def _opt_state(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """opt_state.py's slots."""
    j = ctx["jax"]
    return {
        # the optimizer works on a float32 master copy of 16-bit parameters (MASTER_WEIGHTS), or on them
        "opt_state_header": _on(j.master_weights, "master_copy_header"),
        "opt_state_optimizer": ["master_optimizer" if j.master_weights else "optimizer"],
        "opt_state_shardings_master": _on(j.master_weights, "master_copy"),
        # ZeRO: the optimizer state (with ZERO = 2 the gradients too) split further over the batch axes; a
        # stacked parameter's on a dimension of its copies, not the copies' own
        "opt_state_zero_layout": _on(j.zero, "zero_layout_stacked" if ctx["repeats"] else "zero_layout"),
        "opt_state_zero_grads": _on(j.zero >= 2, "zero_grads"),
        "opt_state_shardings_zero": _on(j.zero, "zero_split"),
        "opt_state_zero_shardings": _on(j.zero, "zero_shardings"),
    }


def _train_program(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """The slots of main.py, params.py, optimizer.py, checkpoint.py, init_state.py, layouts.py and data.py."""
    j, t, ev = ctx["jax"], ctx["training"], ctx["eval"]
    scaled, powersgd, stacked = t["loss_scaling"], j.comm["powersgd"], ctx["repeats"]
    optimizer = t["optimizer"]["name"]
    return {
        # main: with an eval section, the evaluation's data and step (and --eval-only), when a step evaluates,
        # its figures in the step's row
        "main_eval_setup": _on(ev, "eval_setup"),
        "main_evals": ["evals" if ev else "no_evals"],
        "main_log_row": ["log_row_evaluated" if ev else "log_row"],
        # the loss scaler's skipped steps before `start`, for the console
        "main_device_info": _on(scaled, "skipped_steps"),
        # a transformers model: --export-hf and --logits (not in a pipelined build yet)
        "main_hf_exports": _on(ctx["hf"], "hf_exports_pipelined" if j.pipeline else "hf_exports"),
        # params: a transformers checkpoint's loading; a stacked parameter placed and gathered by its copies
        "params_hf": _on(ctx["hf"], "hf_loading"),
        "params_place": ["place_stacked" if stacked else "place"],
        "params_gather": ["gather_stacked" if stacked else "gather"],
        # optimizer: adamw's decay mask (of a stacked parameter: of one real copy), the optax optimizer, the
        # clipping of the gradients' global norm
        "optimizer_header": _on(t["clip_grad_norm"], "clipping"),
        "optimizer_make": [
            *_on(optimizer == "adamw", ("decay_of_some_copy" if j.piped_groups else "decay_of_first_copy")
                 if stacked else "decay", "adamw"),
            *_on(optimizer == "adam", "adam"),
            *_on(optimizer not in ("adam", "adamw"), "sgd"),
            "clipped" if t["clip_grad_norm"] else "unclipped",
        ],
        # checkpoint: the rows of each stacked array (a pipelined stack's own repeats' merged into it)
        "checkpoint_stack_rows": _on(stacked, "stack_rows_unmerged" if j.piped_copies else "stack_rows"),
        "checkpoint_rows_doc": ["rows_of_first_repeats"] if j.piped_groups else _on(j.piped_copies, "rows_of_pipelined"),
        # init_state: the loss scaler's state; PowerSGD's, fresh on resume (checkpoints leave it out)
        "init_state_scaler": _on(scaled, "initial_scaler"),
        "init_state_resume": ["resume_afresh_powersgd" if powersgd else "resume"],
        "init_state_extras": [*_on(scaled, "scaler_state"), *_on(powersgd, "powersgd_state")],
        # layouts: the loss scaler's and PowerSGD's state
        "layouts_scaler_shapes": _on(scaled, "scaler_shapes"),
        "layouts_scaler_shardings": _on(scaled, "scaler_shardings"),
        "layouts_powersgd": _on(powersgd, "powersgd_layouts"),
        # data: a step's micro-batches, or a pipeline's chunks, start where
        "data_starts": ["chunk_starts" if ctx["pipeline"] else "micro_batch_starts"],
        # train: the sections of context parallelism and of the pipeline schedule, where the program has them;
        # parallel.py's docstring says so, and whether the program reduces the replicas' gradients itself
        "train_context": _on(j.context, "context_section"),
        "train_pipeline": _on(j.pipeline, "pipeline_section"),
        "train_parallel_schedule": _on(j.pipeline, "pipeline_schedule"),
        "train_parallel_replicas": _on(j.comm["replicas"], "replicas_reduction"),
        # runtime: TF32 matmuls are a setting of float32 compute only
        "runtime_devices": _on(t["precision"]["compute"] == "float32", "tf32_flag"),
        # replicas: ZeRO's sliced reduction (each replica keeps the slice it updates); PowerSGD's matrices of
        # a stacked gradient, one per copy
        "replicas_zero_doc": _on(j.zero, "zero_slice_doc"),
        "replicas_zero_dim": _on(j.zero, "zero_slice_dim"),
        "replicas_powersgd_copies": ["copies_of_stacked" if stacked else "one_copy"],
    }


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    return {
        **_generate(ctx), **_config(ctx), **_readme(ctx), **_state_names(ctx), **_opt_state(ctx),
        **_train_program(ctx),
    }
