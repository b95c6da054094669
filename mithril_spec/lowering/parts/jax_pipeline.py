"""The parts of jax's pipeline template (lowering/parts/__init__.py says what parts are).

templates/jax/pipeline.py.j2 renders a build with more than one pipeline stage: the layers before the pipelined
block (pre_forward, pre_in_order), those after it (post_loss, post_eval, post_predict), a stage's copies
(pipeline_stage), the circular schedule (circular_pipeline: gpipe, interleaved, and the 1f1b build's evaluation)
and 1f1b (pipeline_1f1b). What each takes and returns past its fixed arguments is data of `jax.pipeline`
(lowering/jax_program.py `_pipeline_roles`); the pieces of code and prose only some pipelines hold are named here.
In the docstrings, `pre`, `block` and `post` are the layers before, in and after the pipelined block.
"""

from __future__ import annotations

from typing import Any

from .choose import chosen


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    pp = ctx["jax"].pipeline
    if pp is None:
        return {}
    ev = ctx["eval"]
    scaled = bool(ctx["training"]["loss_scaling"])
    dropout = ctx["jax"].has_dropout
    zero = bool(ctx["jax"].zero)
    groups = pp["groups"]
    pre_aux, post_aux, block_aux = pp["pre_aux"], pp["post_aux"], pp["block_aux"]
    pre_buffers, block_buffers, post_buffers = pp["pre_buffers"], pp["block_buffers"], pp["post_buffers"]
    block_dropout, post_train = pp["block_dropout"], pp["post_train"]
    by_copy = pp["padded"] or pp["copies"]  # a stage looks its rows' copies up (stage_copies)

    # the header's second line: how the spec places the copies (nothing to say of the planner's even split)
    if groups:
        placement = ["placed_groups"]
    elif pp["even"]:
        placement = []
    else:
        placement = ["placed_padded" if pp["padded"] else "placed"]

    return {
        # ---- pre_forward: the buffers its batch_norm layers moved, moe's losses (docstring, accumulator)
        "pre_doc_buffers": chosen(("pre_doc_buffers", pre_buffers)),
        "pre_doc_aux": chosen(("pre_doc_aux", pre_aux)),
        "pre_start": chosen(("aux_init", pre_aux)),
        # per model input read before / after the block (pp.pre_inputs, pp.post_inputs): integers as they come,
        # the others cast to the compute dtype
        "pre_reads": ["read" if i["is_int"] else "read_cast" for i in pp["pre_inputs"]],
        "post_reads": ["read" if i["is_int"] else "read_cast" for i in pp["post_inputs"]],
        # per layer (pp.pre, pp.post): its output pinned to its layout (before the block: wherever the
        # operator constrains its output too)
        "pre_layers": ["pinned_layer" if layer["constrain"] else "layer" for layer in pp["pre"]],
        "post_layers": ["pinned_layer" if layer["pin"] else "layer" for layer in pp["post"]],
        # ---- pre_in_order (batch_norm before the block): the moe losses it returns too, the dropout key that
        # each micro-batch's step takes with it
        "in_order_doc_aux": chosen(("in_order_doc_aux", pre_aux)),
        "in_order_step": ["step_keyed" if dropout else "step"],
        "in_order_return": ["return_x_aux" if pre_aux else "return_x"],
        "in_order_scanned": ["batch_keys" if dropout else "batch"],
        # ---- post_loss: `train` True where a layer after the block runs differently in the evaluation; moe's
        # losses join its loss; the targets read from the batch where they are a model input
        "post_doc": chosen(("post_doc_aux", post_aux)) + chosen(("post_doc_buffers", post_buffers)),
        "post_start": chosen(("train_true", post_train)) + chosen(("aux_init", post_aux)),
        "post_end": chosen(("read_targets", ctx["loss"]["targets_is_input"])),
        "post_returns": chosen(("plus_aux_loss", post_aux)) + chosen(("and_buffers", post_buffers)),
        # ---- the header comment: the planner's even split of one repeat, or the spec's placement (stages of
        # several blocks; padded stages)
        "header_copies": ["copies_even" if pp["even"] else "copies_placed"],
        # the pipe ranks times their stages each, where a rank runs several (interleaved)
        "virtual_ranks": chosen(("virtual_ranks", pp["virtual_stages"] > 1)),
        "header_placement": placement,
        # ---- the constants: PER_STAGE and the stacked rows' copies, per stack (several blocks), computed from
        # PIPE, VIRTUAL_STAGES and PER_STAGE (the even split) or written out
        "per_stage": ["per_stage_groups" if groups else "per_stage_even" if pp["even"] else "per_stage_placed"],
        "stack_order": ["stack_orders_groups" if groups else "stack_order_even" if pp["even"]
                        else "stack_order_placed"],
        "order_doc": chosen(("of_copies", pp["copies"])) + chosen(("or_padding", pp["padded"])),
        "order_doc_padding": chosen(("padding_after", pp["padded"])),
        "stage_copies_doc": chosen(("minus_one_padding", pp["padded"])),
        # ---- pipeline_stage: how a copy's dropout key is told apart (its repeat's name and index, or its
        # index from the stage's first copy); the buffers and losses it returns; its rows, padding or copies
        "stage_doc_keys": chosen(("doc_keys_named" if groups else "doc_keys_by_copy" if by_copy
                              else "doc_keys_by_stage", block_dropout)),
        "stage_doc": chosen(("doc_stage_buffers", block_buffers)) + chosen(("doc_stage_aux", block_aux)),
        # a stage of several blocks: its index among its rank's stages (interleaved)
        "virtual_stage": chosen(("its_stage", pp["virtual_stages"] > 1)),
        # a stage of several blocks: the load-balancing losses of its copies, summed and returned
        "group_stage_start": chosen(("stage_aux_init", block_aux)),
        "group_stage_out": ["varying_x_aux" if block_aux else "varying_x"],
        # ZeRO: the stacked rows pinned to their layouts before the stages' branches (else a deadlock)
        "before_switch": chosen(("pin_stacked_rows", zero)),
        # a stage of one block: its PER_STAGE rows are copies, or padding too; the buffer rows its copies move;
        # the copies of its rows (stage_copies), else its first copy where the dropout keys need it
        "stage_doc_rows": ["doc_rows_padded" if pp["padded"] else "doc_rows"],
        "stage_start": (chosen(("buffer_rows", block_buffers))
                        + (["copies_note_padded" if pp["padded"] else "copies_note"] if by_copy
                           else chosen(("stage_index", block_dropout)))),
        "stage_run": ["run_moving_buffers" if block_buffers else "run_returning"],
        # the copies of the stage's rows (stage_copies), or the stage's first copy (its dropout keys' index)
        "stage_call_rows": ["copies_of_rows"] if by_copy else chosen(("first_copy", block_dropout)),
        # ---- circular_pipeline: what it runs for (the 1f1b build's evaluation, generate.py --check); the
        # load-balancing losses and batch_norm's buffers its loop carries (idle ticks masked)
        "circular_doc_use": ([("doc_evaluation_and_check" if pp["predicts"] else "doc_evaluation")]
                             if pp["schedule"] == "1f1b" else ["doc_schedule"]),
        "circular_doc": chosen(("doc_circular_aux", block_aux)) + chosen(("doc_circular_buffers", block_buffers)),
        "circular_start": chosen(("circular_aux_init", block_aux)),
        "tick_start": chosen(("real_tick", pp["masks_idle"])),
        "tick_keys": chosen(("keys_j", block_dropout)),
        "tick_end": chosen(("add_stage_aux", block_aux)) + chosen(("move_real_sb", block_buffers)),
        "circular_end": chosen(("sum_aux", block_aux)),
        # rank 0's finished micro-batches: a share per rank where the pipe ranks divide them, else all to all
        "circular_share": ["share_scattered" if pp["share_outputs"] else "share_all"],
        # ---- pipeline_value_and_grad of the circular schedules
        "loop_doc_scale": chosen(("doc_scaled_loss", scaled)),
        # the micro-batches' dropout keys: described, or dropped where the model draws none
        "step_key": ["keys_note" if dropout else "del_key"],
        # the loss: the buffers moved in turn; the layers before the block micro-batch after micro-batch
        # (pre_in_order: batch_norm) or vmapped, with or without their dropout keys and moe losses
        "loss_pre": (chosen(("buffers_b", pp["buffers"]))
                     + [("loss_pre_in_order_aux" if pre_aux else "loss_pre_in_order") if pre_buffers
                        else "loss_pre_keyed" if dropout else "loss_pre"]),
        # shard_map's out_specs: the outputs alone, or a tuple with the moved buffers and the losses
        "circular_out_specs": ["out_specs_tuple" if len(pp["circular_out_specs"]) > 1 else "out_specs_one"],
        # the stacked buffers that the circular loop moves, passed in and merged back
        "loss_run": ["loss_run_buffers" if block_buffers else "loss_run"],
        # the head: micro-batch after micro-batch where it moves batch_norm's statistics, else vmapped
        "loss_head": ["head_in_order" if post_buffers else "head_shared" if pp["share_outputs"] else "head_all"],
        # the loss: moe's load-balancing losses added (before the block, and the stages')
        "loss_return": ["loss_with_aux" if pp["aux"] else "loss_mean"],
        "loss_terms": chosen(("plus_pre_aux", pre_aux)) + chosen(("plus_stage_aux", block_aux)),
        # the gradients: from the loss scale (jax.vjp), with the moved buffers as aux, or plain
        "loop_grads": ["grads_scaled" if scaled else "grads_moving_buffers" if pp["buffers"] else "grads"],
        # ---- pipeline_1f1b: moe's losses and batch_norm's moved buffers (the copies' `sb`, the head's) carried,
        # passed to the stage and the head, and returned; the head's gradient from the loss scale; ZeRO's pin
        "f1b_doc": (chosen(("doc_f1b_aux", block_aux))
                    + (["doc_stats_copies_and_head" if block_buffers and post_buffers else
                        "doc_stats_copies" if block_buffers else "doc_stats_head"] if pp["moves_stats"] else [])),
        "f1b_carry": chosen(("carry_sb", block_buffers)) + chosen(("carry_head_buffers", post_buffers)),
        "head_pullback": ["head_pullback_scaled" if scaled else "head_pullback"] + chosen(("pin_head_grads", zero)),
        "f1b_stage_args": chosen(("carried_sb", block_buffers)) + chosen(("key_jf", block_dropout)),
        "head_args": chosen(("carried_head_buffers", post_buffers)) + chosen(("key_jf", dropout)),
        "recompute_keys": chosen(("key_jb", block_dropout)),
        "stage_pullback": ["pullback_with_aux" if block_aux else "pullback_dy"],
        "aux_scale": chosen(("times_scale", scaled)),  # a load-balancing loss's gradient: times the loss scale
        "tick_loss": chosen(("plus_stage_aux_share", block_aux)),
        "f1b_moved": chosen(("moved_sb", block_buffers)) + chosen(("moved_head_buffers", post_buffers)),
        "f1b_end": chosen(("last_rank_head_buffers", post_buffers)),
        "f1b_returns": chosen(("carried_sb", block_buffers)),
        # ---- pipeline_value_and_grad of 1f1b: the layers before the block (as loss_pre) under jax.vjp; the
        # buffers the pipeline moves split off and merged back; moe's losses before the block in the gradients
        "f1b_step_doc_scale": chosen(("doc_scaled_grads", scaled)),
        "f1b_pre": [{(True, False): "vjp_in_order", (True, True): "vjp_in_order_aux",
                     (False, False): "vjp_keyed" if dropout else "vjp",
                     (False, True): "vjp_keyed_aux" if dropout else "vjp_aux"}[(bool(pre_buffers), bool(pre_aux))]],
        "f1b_split_buffers": chosen(("split_sb", block_buffers)) + chosen(("split_head_buffers", post_buffers)),
        "f1b_merge_buffers": chosen(("merge_buffers", pp["moves_stats"])),
        "pre_grads": ["pre_grads_with_aux" if pre_aux else "pre_grads"],
        # ---- post_eval, pipeline_eval: `train` False where a layer runs differently then; moe's losses left
        # out; the hits where the loss has class targets (accuracy)
        "eval_doc": (chosen(("doc_without_aux", post_aux)) + chosen(("doc_hits", ev and ev["accuracy"]))) if ev else [],
        "eval_doc_train": chosen(("doc_eval_train", post_train)),
        "eval_start": chosen(("train_false", post_train)) + chosen(("aux_init", post_aux)),
        "eval_end": chosen(("drop_aux_loss", post_aux)) + chosen(("read_targets", ctx["loss"]["targets_is_input"])),
        "eval_return": ["return_loss_hits" if ev and ev["accuracy"] else "return_loss"],
        # pipeline_eval: without batch_norm, no buffers; dropout keys the layers take (and draw nothing from);
        # the outputs of pre_forward it drops; the circular loop with `train` False; the head per rank's share
        "eval_doc_modes": chosen(("doc_eval_modes", pp["eval_modes"])),
        "eval_doc_hits": chosen(("doc_eval_hits", ev and ev["accuracy"])),
        "eval_buffers": chosen(("del_buffers", not pp["buffers"])),
        "eval_keys": chosen(("eval_keys", dropout)),
        "eval_pre": ["eval_pre_dropping" if pp["eval_pre_dropped"] else "eval_pre"],
        "eval_loop": chosen(("eval_loop", pp["block_train"])),
        "eval_sb": chosen(("eval_sb", block_buffers)),
        "eval_ys_rest": chosen(("drop_rest", len(pp["circular_out_specs"]) > 1)),
        "eval_head": ["eval_head_shared" if pp["share_outputs"] else "eval_head_all"],
        # ---- pipeline_predict
        "predict_head": ["predict_shared" if pp["share_outputs"] else "predict_all"],
    }
