"""The parts of torch's ops template (the operators' macros) (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def _on(flag: Any, *names: str) -> list[str]:
    """`names` where `flag` holds, else none."""
    return list(names) if flag else []


def _dropout(t: Any, evaluates: bool) -> dict[str, list[str]]:
    """Dropout's slots (dropout_rng_def): its mask is drawn whole and each rank keeps its part, the heads of
    attention probabilities (an attention layer with dropout), the positions under sequence parallelism or
    the places under context parallelism."""
    heads, sequence = "attention_rng" in t.ops, bool(t.sequence_dropout)
    # the mask: this rank's places (context parallelism), its slice of dimension 1 (attention's `heads`
    # argument, or a local `part`: its positions under sequence parallelism), or its rows alone
    if t.context:
        mask = ["mask_places"]
    elif heads:
        mask = _on(sequence, "sequence_heads") + ["mask_heads"]
    elif sequence:
        mask = ["part_whole", "sequence_part", "mask_part"]
    else:
        mask = ["mask_whole"]
    return {
        "dropout_doc": _on(heads, "doc_dropout_heads"),
        "dropout_fields": _on(sequence, "sequence_field"),
        # forward()'s docstring on its `heads` argument; the evaluation drops nothing
        "dropout_forward": _on(t.dropout_heads, "doc_heads_argument") + _on(evaluates, "eval_identity"),
        "dropout_mask": mask,
        "dropout_methods": _on(t.context and heads, "context_keep"),
    }


def _batch_norm(t: Any, evaluates: bool) -> dict[str, list[str]]:
    """BatchNorm's slots (batch_norm_def): synchronised statistics under data parallelism (torch.sync_bn),
    context parallelism (the channels are positions, x holds this rank's), channels split over `tensor`, and
    the evaluation's use of the running statistics."""
    sync, places = bool(t.sync_bn), bool(t.context)
    return {
        "batch_norm_doc": _on(sync, "doc_sync_bn"),
        # the batch axes' group the statistics are all-reduced over
        "batch_norm_fields": _on(sync, "group_field"),
        # forward(): channels split over `tensor` run whole; the evaluation normalises with the running statistics
        "batch_norm_forward": _on(t.tp_channels, "whole_channels_call")
        + _on(evaluates, "eval_running_places" if places else "eval_running"),
        # the statistics: F.batch_norm's, unless they span the ranks (sync_bn) or the channels this rank's places
        "batch_norm_statistics": ["local_batch_norm"] if not (sync or places) else [
            "global_batch_norm",
            "doc_all_ranks_places" if sync and places else "doc_all_ranks" if sync else "doc_places",
            "moments_all_ranks" if sync else "moments",
            "normalise_places" if places else "normalise",
        ],
        "batch_norm_methods": _on(t.tp_channels, "split_channels"),
    }


def _attention(t: Any) -> dict[str, list[str]]:
    """Attention's slots (attention_def): q, k, v as three projections or one matmul (torch.separate_qkv); its
    options (qk_norm, rotary, scaled rotary, score scale, softcap) where some attention layer uses them; dropout
    on the probabilities computes the softmax itself; context parallelism runs ring attention."""
    drop, tp = "attention_rng" in t.ops, bool(t.tp_plan)
    return {
        # the docstring of the projections' form, and why dropout computes the softmax itself
        "attention_doc": ["doc_separate_qkv" if t.separate_qkv else "doc_joined_qkv"] + _on(drop, "doc_dropout"),
        "attention_rope_field": _on(t.rope_scaled, "rope_scaling_field"),
        # the scores' scale and cap, those some layer sets; the norms of q and k; the joined matmul's widths;
        # the dropout (with the head count tensor parallelism's ranks find their heads from)
        "attention_fields": _on(t.score_scale or t.softcap,
                                "scale_softcap_fields" if t.score_scale and t.softcap
                                else "softcap_field" if t.softcap else "scale_field")
        + _on(t.qk_norm, "qk_norm_fields") + _on(not t.separate_qkv, "widths_field")
        + _on(drop and tp, "heads_field") + _on(drop, "dropout_field"),
        # forward(): q, k and v projected, normed (qk_norm) and rotated (rotary embeddings)
        "attention_qkv": ["separate_qkv" if t.separate_qkv else "joined_qkv"] + _on(t.qk_norm, "qk_norm")
        + _on(t.rotary, "rotary_scaled" if t.rope_scaled else "rotary"),
        # the scores: capped and dropped ones computed here; ring attention under context parallelism (which
        # drops with the one-device mask), else the fused kernel
        "attention_scores": _on(t.softcap, "scores_capped") + _on(drop and not t.context, "scores_dropped")
        + ([("ring_dropped_heads" if tp else "ring_dropped") if drop else "ring"] if t.context
           else ["fused_scaled" if t.score_scale else "fused"]),
        "attention_methods": _on(t.softcap, "capped")
        + _on(drop and not t.context, "dropped", *_on(tp, "dropped_heads"), "dropped_return"),
    }


def _mlp(t: Any) -> dict[str, list[str]]:
    """MLP's slots (mlp_def): the forms of the activations the program's mlp layers use, swiglu (gate, up,
    down), plain ones (fc, proj, then the activation) or both (a test of self.activation); swiglu's gate is a
    field where some layer gates with gelu (torch.gelu_gate)."""
    swiglu, plain = "mlp_gated" in t.forms, "mlp_ungated" in t.forms  # (ops/mlp.py forms)
    both = swiglu and plain
    return {
        # the forms' formulas; the tanh approximation where gelu is one of them
        "mlp_doc": _on(plain, "mlp_doc_plain") + _on(both, "mlp_doc_or") + _on(swiglu, "mlp_doc_swiglu"),
        "mlp_doc_gelu": _on("mlp_tanh_gelu" in t.forms, "mlp_doc_gelu"),
        "mlp_fields": _on(t.gelu_gate, "mlp_gate_fn")
        + ["mlp_swiglu_or_plain_weights" if both else "mlp_swiglu_weights" if swiglu else "mlp_plain_weights"],
        "mlp_forward": _on(swiglu, ("mlp_swiglu_branch_gate_fn" if t.gelu_gate else "mlp_swiglu_branch") if both
                           else "mlp_swiglu_gate_fn" if t.gelu_gate else "mlp_swiglu")
        + _on(plain, "mlp_plain"),
    }


def _moe(t: Any) -> dict[str, list[str]]:
    """MoE's slots (moe_def): its experts' MLPs come in the activations the program's moe layers use, swiglu
    (gate, up, down), plain ones (fc, proj, then the activation) or both (a test of self.activation); its
    routing options (torch.forms), tensor, expert and context parallelism add their code."""
    swiglu, plain = "experts_gated" in t.forms, "experts_ungated" in t.forms  # (ops/moe.py forms)
    both = swiglu and plain
    forms, tp, ep = set(t.forms), t.tp_experts, t.ep

    def form(alone_swiglu: str, alone_plain: str, swiglu_or_plain: str) -> str:
        """The macro of the experts' MLPs' form: swiglu alone, plain alone, or swiglu tested first."""
        return swiglu_or_plain if both else alone_swiglu if swiglu else alone_plain

    return {
        # the grouped matmul dropless routing runs the experts with
        "moe_helpers": _on("dropless" in forms, "grouped_mm"),
        # the docstring's parameters: those of the forms the layers use
        "moe_doc_experts": _on(plain, "doc_plain_experts") + _on(both, "doc_or_for_swiglu")
        + _on(swiglu, "doc_swiglu_experts"),
        # the shared experts' parameters, their gate's when some layer gates them
        "moe_doc_shared": _on("shared" in forms, "doc_shared_gated" if "shared_gate" in forms else "doc_shared"),
        "moe_doc_z_loss": _on("z_loss" in forms, "doc_z_loss"),
        "moe_doc_tensor": _on(tp, "doc_tensor"),
        # __init__'s fields of the routing options
        "moe_grouped_field": _on("dropless" in forms, "grouped_field"),
        "moe_routing_fields": _on("normalize" in forms, "normalize_field") + _on("z_loss" in forms, "z_loss_field"),
        # the experts' weights in the activations' form
        "moe_experts": [form("swiglu_experts", "plain_experts", "swiglu_or_plain_experts")],
        "moe_shared": _on("shared" in forms, "shared_experts") + _on("shared_gate" in forms, "shared_gate_weights"),
        # the process groups expert_parallel() and split_tensor() set
        "moe_parallel_fields": _on(ep, "expert_group_field") + _on(tp, "tensor_group_field"),
        # tensor parallelism splits every expert's hidden features (split_tensor, its slots below)
        "moe_split_tensor": _on(tp, "moe_split_tensor"),
        "moe_split_doc": _on(plain, "split_doc_plain") + _on(both, "split_doc_or") + _on(swiglu, "split_doc_swiglu")
        + _on("shared" in forms, "split_doc_shared"),
        "moe_split_doc_whole": _on(plain, "split_doc_proj_bias") + _on("shared_gate" in forms, "split_doc_shared_gate"),
        "moe_split": [form("split_swiglu", "split_plain", "split_swiglu_or_plain")] + _on("shared" in forms, "split_shared"),
        # expert parallelism split the experts already
        "moe_split_skip": _on(ep, "split_skip_expert_parallel"),
        # forward(): context parallelism routes the whole sequence and keeps this rank's places of the output
        "moe_gather_sequence": _on(t.context, "gather_sequence"),
        "moe_return": ["return_places" if t.context else "return_whole"],
        # the z-loss needs the router's logits
        "moe_router": ["router_logits" if "z_loss" in forms else "router_probs"],
        "moe_doc_gates": _on("normalize" not in forms, "doc_gates_kept"),
        "moe_normalize": _on("normalize" in forms, "normalize_gates"),
        # dropless routing runs the chosen rows as grouped matmuls (not under expert parallelism)
        "moe_pick": ["pick_slots"] if "dropless" not in forms
        else ["pick_grouped_unless_expert_parallel" if ep else "pick_grouped_or_slots"],
        "moe_shared_forward": _on("shared" in forms, "shared_forward", "shared_mlp_tensor" if tp else "shared_mlp")
        + _on("shared_gate" in forms, "shared_gate") + _on("shared" in forms, "shared_add"),
        "moe_z_loss": _on("z_loss" in forms, "z_loss"),
        # the dropless methods (grouped_experts, grouped_mlps and its form's body)
        "moe_grouped_experts": _on("dropless" in forms, "grouped_experts"),
        "moe_grouped_mlps": _on(tp, "grouped_tensor_biased" if plain else "grouped_tensor")
        + _on(swiglu, ("grouped_swiglu_branch_tensor" if tp else "grouped_swiglu_branch") if both
              else "grouped_swiglu_tensor" if tp else "grouped_swiglu")
        + _on(plain, "grouped_plain_tensor" if tp else "grouped_plain"),
        "moe_doc_expert": _on(plain, "doc_expert_plain") + _on(both, "doc_expert_or") + _on(swiglu, "doc_expert_swiglu"),
        # run_experts(): expert parallelism sends the rows to the experts' ranks; else tensor parallelism splits
        # each expert's MLP
        "moe_run_experts": ["run_expert_parallel"] if ep else _on(tp, form("run_tensor_swiglu", "run_tensor_plain", "run_tensor_swiglu_or_plain")) + ["run_local"],
        "moe_local_experts": _on(ep, "local_experts_tensor" if tp else "local_experts"),
        "moe_local_tensor": _on(swiglu, "local_tensor_swiglu_branch" if both else "local_tensor_swiglu")
        + _on(plain, "local_tensor_plain"),
        "moe_expert_mlps": _on(swiglu, "expert_mlps_swiglu_branch" if both else "expert_mlps_swiglu")
        + _on(plain, "expert_mlps_plain"),
        # Megatron's f and g, for the experts split over `tensor`
        "moe_tensor_functions": _on(tp, "tensor_region_functions"),
    }


def _operators(t: Any, masked: bool) -> dict[str, list[str]]:
    """The other operators' slots: the helpers and forms of code the program's settings choose."""
    return {
        # a linear layer tied to an embedding table under sharded FSDP2 computes its weight gradient whole
        "linear_helpers": _on(t.tied_head, "tied_head"),
        # RMSNorm with the (offset + weight) scale where some layer sets weight_offset
        "rms_norm_class": ["rms_norm_offset" if t.rms_offset else "rms_norm"],
        # context parallelism: x holds this rank's places of the sequence, whose rows (angles) it takes
        "pos_embedding_rows": ["pos_rows_places" if t.context else "pos_rows"],
        "rope_angles": ["angles_places" if t.context else "angles"],
        # transformers' rope_scaling, where some attention layer scales its frequencies
        "rope_helpers": _on(t.rope_scaled, "scale_inv_freq"),
        "rope_scaling": _on(t.rope_scaled, "rope_scaling"),
        # the loss: a sum over the unmasked targets (a data mask) or a mean; under loss_parallel (the logits
        # split on the vocabulary) a DTensor made whole
        "cross_entropy_loss": [("cross_entropy_masked_loss_parallel" if t.vocab_parallel else "cross_entropy_masked")
                          if masked else
                          "cross_entropy_mean_loss_parallel" if t.vocab_parallel else "cross_entropy_mean"],
    }


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    t = ctx["torch"]
    evaluates = bool(ctx["eval"])
    masked = bool(ctx["data"]["mask"])
    return {**_operators(t, masked), **_dropout(t, evaluates), **_batch_norm(t, evaluates), **_attention(t), **_mlp(t), **_moe(t)}
