"""The parts of mlx's templates (lowering/parts/__init__.py says what parts are): one section, `program`.

The op helpers' pieces (templates/mlx/ops_parts.py.j2) follow the features some layer of the op uses, which
lowering/mlx_program.py `_op_defs` computes per op (`mlx.op_defs`, the helpers' `uses`): a helper holds only
the code some layer of this program runs.
"""

from __future__ import annotations

from typing import Any

from ...ops import OPS
from ...ops.attention import Attention
from ...ops.elementwise import Dropout
from ...ops.mlp import Mlp
from ...ops.moe import Moe
from ...ops.norm import BatchNorm, RmsNorm
from .choose import chosen


def _ops(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """templates/mlx/ops.py.j2's helper definitions (empty where the program has no such op)."""
    defs = {type(OPS[op]): uses for op, uses in ctx["mlx"].op_defs.items()}
    drop, bn, rms = defs.get(Dropout, {}), defs.get(BatchNorm, {}), defs.get(RmsNorm, {})
    att, mlp, moe = defs.get(Attention, {}), defs.get(Mlp, {}), defs.get(Moe, {})
    # dropout's helper takes an attention layer's heads with tensor parallelism and attention dropout
    heads = drop.get("heads") or att.get("dropout_heads")
    # the experts' MLPs of moe's routings: SwiGLU and/or plain; both branched on `activation`
    branch = moe.get("branch")
    experts = ["if_swiglu", "swiglu", "else_", "plain"] if branch else chosen(("swiglu", moe.get("swiglu")),
                                                                          ("plain", moe.get("plain")))
    return {
        # dropout_def: the helper, where a dropout layer above rate 0 calls it (else attention renders it)
        "dropout_def": chosen(("dropout_helper", drop.get("helper"))),
        # the helper's sentence on heads and its mask: for the rows alone, or for the heads too
        "dropout_docstring": chosen(("dropout_heads_doc", heads)),
        "dropout_keep": chosen(("keep_heads" if heads else "keep_rows", drop.get("helper") or att.get("dropout_helper"))),
        # batch_norm with an `eval` section: the evaluation uses the running statistics (`train` False)
        "batch_norm_docstring": chosen(("batch_norm_eval_doc", bn.get("params"))),
        "batch_norm_eval": chosen(("batch_norm_running", bn.get("params"))),
        # rms_norm: with `offset` where some layer has a weight offset
        "rms_norm_def": chosen(("rms_norm_offset" if rms.get("offset") else "rms_norm", rms)),
        # attention's helpers, docstring sentences and statements: each for a feature some layer uses
        "attention_helpers": chosen(("attention_dropout_helper", att.get("dropout_helper")),
                                   ("head_norm", att.get("qknorm")), ("scale_inv_freq", att.get("scaled")),
                                   ("rope", att.get("rotary"))),
        "rope_scaling": chosen(("rope_scale_freq", att.get("scaled"))),
        "attention_docstring": chosen(("qkv_bias_doc", att.get("qkv_only")), ("gqa_doc", att.get("gqa")),
                                     ("rotary_scaled_doc" if att.get("scaled") else "rotary_doc", att.get("rotary")),
                                     ("tp_heads_doc", att.get("tp")), ("probs_dropout_doc", att.get("drop"))),
        "attention_setup": chosen(("kv_heads_default", att.get("gqa")), ("tp_copy_x", att.get("tp"))),
        "attention_before_scores": chosen(("qk_norm", att.get("qknorm")),
                                         ("rotate_scaled" if att.get("scaled") else "rotate", att.get("rotary")),
                                         ("repeat_kv", att.get("gqa"))),
        # the scores scaled by `scale` where some layer gives one, else by 1 / sqrt(head_dim)
        "attention_scores": chosen(("scores_scaled" if att.get("scaled_scores") else "scores", att)),
        "attention_masks": chosen(("softcap", att.get("capped")), ("causal_mask", att.get("causal"))),
        # dropout on the probabilities; with tp the mask of this process's heads
        "attention_dropout": chosen(("probs_dropout_heads" if att.get("tp") else "probs_dropout", att.get("drop"))),
        "attention_output": chosen(("tp_sum_out", att.get("tp"))),
        # mlp: its forms (docstring), dense() with tp's reduce or without, SwiGLU and/or the plain MLP
        "mlp_forms_doc": chosen(("plain_form_doc", mlp.get("plain")), ("or_doc", mlp.get("branch")),
                               ("swiglu_form_doc", mlp.get("swiglu"))),
        "mlp_docstring": chosen(("gelu_doc", mlp.get("tanh_gelu"))),
        "mlp_dense": chosen(("dense_tp" if mlp.get("tp") else "dense", mlp)),
        "mlp_return": [] if not mlp else ["swiglu_return"] if not mlp["plain"] else chosen(
            ("swiglu_branch", mlp["branch"]), ("plain_return", True)),
        # moe: the routings' functions (capped: slot_experts, dropless: grouped_experts), their experts' MLPs
        "moe_helpers": chosen(("slot_experts", moe.get("capped")), ("grouped_experts", moe.get("dropless"))),
        "slot_experts_mlp": [{"swiglu": "slot_swiglu", "plain": "slot_plain"}.get(e, e) for e in experts],
        "grouped_experts_mlp": [{"swiglu": "grouped_swiglu", "plain": "grouped_plain"}.get(e, e) for e in experts],
        "moe_gates_doc": chosen(("normalize_doc", moe.get("normalize"))),
        "moe_docstring": chosen(("capped_doc", moe.get("capped")), ("dropless_doc", moe.get("dropless")),
                               ("shared_gated_doc" if moe.get("shared_gate") else "shared_doc", moe.get("shared"))),
        "moe_returns_doc": chosen(("z_loss_doc", moe.get("z_loss"))),
        "moe_gates": chosen(("normalize_gates", moe.get("normalize"))),
        # both routings: chosen by `grouped`
        "moe_routing": chosen(("route_by_grouped" if moe.get("both_routings") else
                            "route_grouped" if moe.get("dropless") else "route_slots", moe)),
        # the shared experts (gated where some layer has a shared gate), added to the routed experts' output
        "moe_shared": chosen(("shared_experts", moe.get("shared")), ("shared_gate", moe.get("shared") and moe.get("shared_gate")),
                            ("shared_add", moe.get("shared"))),
        # the router z-loss beside the load-balancing loss, where some layer weighs it
        "moe_aux": chosen(("z_loss", moe.get("z_loss"))),
        # cross_entropy: with data.mask, masked targets count 0
        "cross_entropy_loss": ["masked_loss" if ctx["data"]["mask"] else "mean_loss"],
    }


def _main(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """templates/mlx/main.py.j2 (main_parts.py.j2)."""
    tp = ctx["mlx"].tp  # tensor parallelism: each process holds slices of the parameters
    evaluates = ctx["eval"] is not None
    return {
        # this process's data-parallel rank: with tp, TENSOR processes share a batch
        "data_rank": chosen(("per_tensor_group", tp)),
        # the starting parameters and a checkpoint's arrays: this process's slices with tp, else whole
        "init_params": ["params_sliced" if tp else "params_whole"],
        "restore": ["restore_sliced" if tp else "restore_whole"],
        # --export-grads writes whole gradients: with tp every process gathers them
        "export_grads_doc": chosen(("gathered_doc", tp)),
        "export_grads_gather": chosen(("gather_grads", tp)),
        # --eval-only: the evaluation of the starting parameters (a spec with an `eval` section)
        "before_training": chosen(("eval_only", evaluates)),
        # data.mask: the step's loss factor (the mean over the global batch's unmasked targets)
        "step_args": chosen(("loss_scale_arg", ctx["data"]["mask"])),
        # the step's row: tokens per second for sequence models, the evaluation's figures
        "step_row": chosen(("tokens_per_s", ctx["seq_len"]), ("eval_row", evaluates)),
        "console_args": chosen(("eval_log_arg", evaluates)),
        # a checkpoint holds whole arrays: with tp gathered by every process, else this process's state
        "checkpoint": ["checkpoint_gathered" if tp else "checkpoint_local"],
        "gather_params": chosen(("gather_params", tp)),
        # a model with a Hugging Face mapping: --export-hf and --logits
        "hf_exports": chosen(("hf_exports", ctx["hf"])),
    }


def _train_step(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """templates/mlx/train_step.py.j2 (train_step_parts.py.j2)."""
    m = ctx["mlx"]
    ev = ctx["eval"]
    return {
        # the gradients' norm: with tp the slices' squares summed over the processes
        "global_norm": ["norm_of_slices" if m.tp else "norm_of_whole"],
        # a micro-batch's dropout key, where some layer draws a mask
        "micro_batch_key": ["dropout_key" if m.has_dropout else "no_key"],
        # a micro-batch's weight: with data.mask the step's factor makes the loss the mean over unmasked targets
        "micro_batch_weight": ["masked_weight" if ctx["data"]["mask"] else "plain_weight"],
        "clip": chosen(("clip_grads", ctx["training"]["clip_grad_norm"])),
        # predict (for --logits, a model with a Hugging Face mapping) and the evaluation (with or without accuracy)
        "after_train_step": chosen(("predict", ctx["hf"]),
                                  ("evaluate_accuracy" if ev and ev["accuracy"] else "evaluate_loss", ev)),
        "predict_args": chosen(("buffers_arg", m.has_buffers), ("predict_key_arg", m.has_dropout)),
    }


def _model(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """templates/mlx/model.py.j2 (model_parts.py.j2); each block's pieces: lowering/mlx_program.py (blk.parts)."""
    m, loss, ev = ctx["mlx"], ctx["loss"], ctx["eval"]
    targets = [] if loss["targets_is_input"] else ["targets_doc"]  # forward returns the targets unless an input
    return {
        # pool2d: the helper of the pooling layers (no op's definition holds it)
        "model_helpers": chosen(("pool2d_helper", "pool2d" in m.helpers)),
        # forward's results beyond the prediction; with moe layers it sums their losses from 0
        "forward_doc": [*targets, *chosen(("buffers_doc", m.has_buffers), ("aux_doc", m.has_aux))],
        "forward_start": chosen(("aux_init", m.has_aux)),
        # remat (training.remat full): around each repeated block, or around the whole forward pass
        "repeat_call": ["block_remat" if m.remat_blocks else "block_call"],
        "forward_call": ["forward_remat" if m.remat_forward else "forward_plain"],
        # the targets read from the batch where they are an input (loss_fn and eval_fn)
        "loss_targets": chosen(("targets_from_batch", loss["targets_is_input"])),
        "loss_return": ["return_with_aux" if m.has_aux else "return_loss"],
        # eval_fn, with an `eval` section: its docstring's clauses, its results (with eval.accuracy the hits)
        "after_loss": chosen(("eval_fn", ev)),
        "eval_results_doc": chosen(("without_aux_doc", m.has_aux), ("hits_doc", ev and ev["accuracy"])),
        "eval_model_doc": chosen(("without_dropout_doc", m.has_dropout), ("running_stats_doc", m.has_buffers)),
        "eval_return": ["return_hits" if ev and ev["accuracy"] else "return_eval_loss"],
    }


def _config(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """templates/mlx/config.py.j2 (config_parts.py.j2)."""
    t = ctx["training"]
    opt = t["optimizer"]["name"]
    return {
        # tensor parallelism: its degree and the parameters' split dimensions
        "tensor_constants": chosen(("tensor_split", ctx["mlx"].tp)),
        # batch_norm's running statistics, or none
        "buffers": ["buffers_table" if ctx["buffers"] else "no_buffers"],
        # the spec's pipeline micro-batches, run one after the other (else one)
        "microbatches": ["pipeline_microbatches" if ctx["pipeline"] else "one_microbatch"],
        # the optimizer's hyperparameters: adam's and adamw's betas and eps, adamw's weight decay, sgd's momentum;
        # its state tensors per parameter
        "optimizer_constants": [*chosen(("betas", opt in ("adam", "adamw")), ("weight_decay", opt == "adamw")),
                                "sgd_momentum" if opt == "sgd" else "adam_slots"],
        "schedule_constants": chosen(("min_lr_ratio", t["schedule"]["name"] == "cosine")),
        # the spec's checkpoints, or none by default
        "checkpoint_constants": ["checkpoint_spec" if t["checkpoint"] else "no_checkpoint"],
    }


def _readme(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """templates/mlx/README.md.j2 (readme_parts.md.j2)."""
    ev, data = ctx["eval"], ctx["data"]
    synthetic = data["kind"] == "synthetic"
    return {
        # how to run: launch.sh for several processes, train.py for one
        "run_commands": ["run_processes" if ctx["mesh"]["devices"] > 1 else "run_one"],
        # how the processes share the work: one holds everything; over `data` each the whole model; over
        # `tensor` each its slices
        "parallelism_doc": ["one_process_doc" if ctx["mesh"]["devices"] == 1 else
                            "tensor_parallel_doc" if ctx["mlx"].tp else "data_parallel_doc"],
        # the metrics beyond loss and speed: tokens per second (sequence models), the evaluation's
        "metrics_doc": chosen(("tokens_metric", ctx["seq_len"]), ("val_loss_metric", ev),
                             ("val_accuracy_metric", ev and ev["accuracy"])),
        "tensorboard_doc": chosen(("val_loss_scalar", ev)),
        "hf_flags": chosen(("hf_flags", ctx["hf"])),
        "checkpoint_default": ["checkpoint_default" if ctx["training"]["checkpoint"] else "no_checkpoint_default"],
        # --data: what it reads (per data kind), its default path, the evaluation's held-out split
        "data_doc": [f"data_{data['kind']}", *chosen(("data_default", not synthetic),
                                                   ("held_out_split", ev and ev["split"]))],
        # --eval-only (an `eval` section): the samples it evaluates, how often training evaluates
        "eval_flags": chosen(("eval_only_flag", ev)),
        "eval_source": [] if not ev else ["eval_path_source" if ev["path"] else
                                          "held_out_source" if ev["split"] else "drawn_source"],
        "eval_every": chosen(("eval_every_doc", ev and ev["every"])),
        "seed_doc": chosen(("eval_samples_seed", ev and synthetic)),
        # generate.py (a language model): how to sample, the spec's tokenizer
        "sampling": chosen(("sampling_section", ctx["sampling"])),
        "tokenizer_doc": chosen(("spec_tokenizer", ctx["sampling"] and ctx["sampling"]["tokenizer"])),
    }


def _program(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """templates/mlx/train.py.j2, optimizer.py.j2, runtime.py.j2 and generate.py.j2 (program_parts.py.j2)."""
    m, t = ctx["mlx"], ctx["training"]
    opt, schedule = t["optimizer"], t["schedule"]["name"]
    sampling = ctx["sampling"]
    return {
        # train.py: launch.sh and data parallelism in the docstring for several processes; tensor
        # parallelism's helpers (tensor.py.j2); the Hugging Face mapping (a model with one)
        # several processes: how to start them and how they share the work (over `data` or over `tensor`)
        "run_docstring": chosen(("launch_tensor_doc" if ctx["mlx"].tp else "launch_data_doc", ctx["mesh"]["devices"] > 1)),
        "model_sections": chosen(("tensor_section", m.tp)),
        "checkpoint_sections": chosen(("hf_section", ctx["hf"])),
        # the lr schedule: noam's, else the warmup then cosine's decay or the constant lr
        "lr_schedule": ["noam_lr"] if schedule == "noam" else
                       ["cosine_after" if schedule == "cosine" else "constant_after", "warmup_then_after"],
        # the optimizer: adamw (two groups: weight decay on matrices only), adam, sgd
        "make_optimizer": [{"adamw": "adamw_groups", "adam": "adam_group"}.get(opt["name"], "sgd_group")],
        # sgd without momentum keeps no state (mlx would allocate a momentum buffer)
        "init_optimizer_state": chosen(("no_sgd_state", opt["name"] == "sgd" and not opt.get("momentum"))),
        # --dry-run's per-process shapes: with tp a split dimension divided by TENSOR
        "local_shape": ["tensor_local_shape" if m.tp else "whole_shape"],
        # generate.py: without the spec's tokenizer, bytes; the logits of forward's results (with moe: the first)
        "tokenizer_comment": chosen(("no_tokenizer_doc", sampling and not sampling["tokenizer"])),
        "logits_doc": chosen(("no_dropout_doc", m.has_dropout)),
        "logits_of_results": chosen(("first_result", m.has_aux)),
    }


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    return {**_ops(ctx), **_main(ctx), **_train_step(ctx), **_model(ctx), **_config(ctx), **_readme(ctx),
            **_program(ctx)}
