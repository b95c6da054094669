"""The parts of jax's other templates (generate, config, README, state_names, ...) (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def _on(flag: Any, *names: str) -> list[str]:
    """`names` where `flag` holds, else none."""
    return list(names) if flag else []


def _generate(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """generate.py's slots (a language model's; none rendered without one)."""
    s, j = ctx["sampling"], ctx["jax"]
    if s is None:
        return {}
    pp = j.pipeline
    uses = j.op_attrs.get("attention", [])
    gqa = any(a["kv_heads"] != a["heads"] for a in uses)
    biased = [a for a in uses if a["bias"]]
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
        "generate_attention_out_bias": _on(
            biased, "out_bias_unless_qkv_only" if any(not a["o_bias"] for a in biased) else "out_bias"
        ),
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


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    return {**_generate(ctx)}
