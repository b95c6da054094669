"""`mithril-spec import hf PATH`: a Hugging Face transformers `config.json` -> a spec.

One function per family reads the config and writes the spec's layers under the names of the
transformers modules (so that `layers.3.self_attn.q.weight` is `model.layers.3.self_attn.q_proj.weight`,
transposed; `hf_names` gives the whole correspondence). A config field this cannot express exactly is an
E070 diagnostic at the field (never a silent approximation); one that changes training but not the model
(dropout) is a W010 warning. The config's own text is the diagnostics' source, so they point into it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, Callable

from . import codes
from .diagnostics import Diagnostic, DiagnosticError
from .ops.attention import ROPE_SCALING_FIELDS as _ROPE_SCALING  # the kinds that import: the attention's
from .source import Document, load_text

DEFAULT_SEQ_CAP = 2048  # seq defaults to max_position_embeddings, at most this


@dataclasses.dataclass
class Imported:
    spec: str  # the spec's YAML text
    family: str
    diagnostics: list[Diagnostic]  # warnings (errors raise DiagnosticError)


class _Config:
    """The config's values with their positions, and the diagnostics found reading them."""

    def __init__(self, doc: Document):
        self.doc, self.data = doc, doc.data
        self.diags: list[Diagnostic] = []
        self.read: set[str] = set()
        self.defaults = DEFAULTS.get(self.data.get("model_type"), {})

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value; where the config lacks it, the family's transformers default (DEFAULTS), else
        `default`."""
        self.read.add(key)
        return self.data.get(key, self.defaults.get(key, default))

    def number(self, key: str, default: Any = None, *, integer: bool = False, none: bool = False,
               zero: bool = False) -> Any:
        """`get`, checked: a positive number (an integer with `integer`; 0 too with `zero`; null with `none`).
        Anything else is E071 at the field, and `default` stands in for it so that reading goes on."""
        value = self.get(key, default)
        if value is None and none:
            return None
        kinds = int if integer else (int, float)
        if isinstance(value, kinds) and not isinstance(value, bool) and (value > 0 or (zero and value == 0)):
            return value
        what = f"a {'non-negative' if zero else 'positive'} {'integer' if integer else 'number'}"
        self.wrong(key, f"`{key}` must be {what}{' or null' if none else ''}, got {value!r}")
        return default

    def flag(self, key: str, default: bool) -> bool:
        """`get`, checked: true or false (E071 at the field otherwise: a string "false" is not false)."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.wrong(key, f"`{key}` must be true or false, got {value!r}")
            return default
        return value

    def wrong(self, key: str, message: str) -> None:
        """E071 at the field `key` (at the config's top where it lacks it: a family default read wrongly)."""
        self.diags.append(Diagnostic(codes.E071, message, self.doc.pos((key,) if key in self.data else ()),
                                     help="check the config"))

    def need(self, key: str) -> Any:
        self.read.add(key)
        if key not in self.data:
            self.diags.append(Diagnostic(codes.E071, f"the config has no `{key}`", self.doc.pos(()),
                                         help=f"a {self.data.get('model_type')} config.json names `{key}`"))
            return 1
        value = self.data[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            self.wrong(key, f"`{key}` must be a positive integer, got {value!r}")
            return 1
        return value

    def refuse(self, key: str, why: str, help: str, path: tuple = ()) -> None:
        """E070 at `key` (or at `path` inside it: a field of a nested object such as rope_parameters)."""
        where = ".".join((key, *map(str, path)))
        self.diags.append(Diagnostic(codes.E070, f"`{where}`: {why}", self.doc.pos((key, *path)), help=help))

    def unread(self) -> None:
        """E070 for every field the family did not read that may change the computation: the import honours
        each field it reads or refuses it, and never drops an unknown one silently."""
        for key in self.data:
            if key not in self.read and key not in HARMLESS and not key.startswith("_"):
                self.refuse(key, "this field is not read by the import of a "
                            f"{self.data.get('model_type')} model: it may change the model",
                            "remove the field if it does not change the computation (or report it: "
                            "docs/fine-tuning.md lists the fields each family reads)")

    def only(self, key: str, allowed: tuple, why: str, help: str, default: Any = None) -> Any:
        value = self.get(key, default)
        if value not in allowed:
            self.refuse(key, f"{value!r} is not supported: {why}", help)
        return value

    def no_dropout(self, *keys: str) -> None:
        for key in keys:
            rate = self.get(key, 0.0)
            if isinstance(rate, (int, float)) and rate > 0:
                self.diags.append(Diagnostic(
                    codes.W010, f"`{key}: {rate}` is not imported: the spec trains without this dropout",
                    self.doc.pos((key,)), severity="warning",
                    help="add dropout layers to the spec where you want them (attention layers take a `dropout` "
                    "rate for their probabilities)"))


# transformers' defaults (its config classes') for fields a config.json may lack, where they are not the generic
# ones the families fall back to (num_key_value_heads: num_attention_heads, head_dim: hidden_size //
# num_attention_heads, rope_theta 10000, rms_norm_eps 1e-6, untied embeddings): a config without the field is
# the model transformers builds from it. tests/test_hf_import.py checks them against the installed transformers.
DEFAULTS: dict[str, dict[str, Any]] = {
    "mistral": {"num_key_value_heads": 8, "sliding_window": 4096},
    "qwen2": {"num_key_value_heads": 32},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128},
    "gemma": {"num_key_value_heads": 16, "head_dim": 256, "tie_word_embeddings": True, "pad_token_id": 0},
    "gemma2": {"num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": True, "sliding_window": 4096,
               "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
               "pad_token_id": 0},
    "mixtral": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1e6},
    "qwen2_moe": {"num_key_value_heads": 16},
    "qwen3_moe": {"num_key_value_heads": 4},
    "phi3": {"rms_norm_eps": 1e-5, "pad_token_id": 32000},
    "internlm3": {"num_key_value_heads": 2, "head_dim": 128, "rms_norm_eps": 1e-5, "pad_token_id": 2},
    "seed_oss": {"num_key_value_heads": 8, "head_dim": 128, "attention_bias": True, "attention_dropout": 0.1,
                 "residual_dropout": 0.1, "pad_token_id": 1},
    "bert": {"pad_token_id": 0},
    "ministral": {"num_key_value_heads": 8, "sliding_window": 4096},
    "starcoder2": {"num_key_value_heads": 2},
}

# Fields of any transformers config that do not change the model's computation (token ids, generation
# defaults, initialisation, bookkeeping). Every other field must be read by the family's function (pad_token_id is
# read: transformers' token embeddings do not train its row, _padding).
HARMLESS = frozenset({
    "architectures", "transformers_version", "torch_dtype", "dtype", "model_type", "bos_token_id", "eos_token_id",
    "sep_token_id", "cls_token_id", "mask_token_id", "decoder_start_token_id", "initializer_range",
    "initializer_factor", "use_cache", "output_attentions", "output_hidden_states", "return_dict", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward", "tokenizer_class", "task_specific_params",
    "finetuning_task", "prefix", "pruned_heads", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "is_encoder_decoder", "tie_encoder_decoder", "cross_attention_hidden_size",
    "id2label", "label2id", "num_labels", "gradient_checkpointing",
})


def _rope(c: _Config) -> tuple[float, dict | None]:
    """(rope theta, scaling) from either config layout: transformers 5's `rope_parameters` {rope_type,
    rope_theta, factor, ...}, or transformers 4's top-level `rope_theta` and `rope_scaling` {rope_type (or
    type), factor, ...}. Scaling kinds the import cannot express are E070 at their field."""
    params = c.get("rope_parameters")
    legacy = c.get("rope_scaling")
    theta = c.get("rope_theta", 10000.0)
    if c.get("partial_rotary_factor", 1.0) != 1.0:
        c.refuse("partial_rotary_factor", "rotary embeddings on part of each head are not in the spec language",
                 "only full rotary embeddings import")
    if params is not None:
        if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
            c.refuse("rope_parameters", "rope settings per attention kind are not imported",
                     "give one rope_parameters object")
            return theta, None
        key, fields = "rope_parameters", dict(params)
        theta = fields.pop("rope_theta", theta)
        if legacy is not None and legacy != params:
            c.refuse("rope_scaling", "the config holds both rope_parameters and a different rope_scaling",
                     "keep one of them")
    elif legacy is not None:
        if not isinstance(legacy, dict):
            c.refuse("rope_scaling", f"{legacy!r} is not a rope scaling object", "give {rope_type: ..., ...}")
            return theta, None
        key, fields = "rope_scaling", dict(legacy)
        fields.pop("rope_theta", None)
    else:
        key, fields = "rope_theta", {}
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 1:
        path = ("rope_theta",) if key != "rope_theta" else ()
        c.refuse(key, f"{'rope_theta ' if path else ''}{theta!r} must be a number above 1", "check the config", path)
        return 10000.0, None
    if not fields and key == "rope_theta":
        return float(theta), None
    kind = fields.pop("rope_type", fields.pop("type", "default"))
    if "partial_rotary_factor" in fields and fields.pop("partial_rotary_factor") != 1.0:
        c.refuse(key, "rotary embeddings on part of each head are not in the spec language",
                 "only full rotary embeddings import", ("partial_rotary_factor",))
    if kind == "default":
        for extra in fields:
            c.refuse(key, "a field of a rope without scaling that the import does not read",
                     "remove it", (extra,))
        return float(theta), None
    if kind not in _ROPE_SCALING:
        kinds = " or ".join(_ROPE_SCALING)
        c.refuse(key, f"rope_type {kind!r} is not supported: the spec's rope_scaling is {kinds}",
                 f"remove the rope scaling (positions up to the original context), or use {kinds}")
        return float(theta), None
    scaling: dict[str, Any] = {"type": kind}
    if "original_max_position_embeddings" in _ROPE_SCALING[kind] and "original_max_position_embeddings" not in fields:
        # transformers falls back to max_position_embeddings
        fields["original_max_position_embeddings"] = c.get("max_position_embeddings")
    for field in _ROPE_SCALING[kind]:
        value = fields.pop(field, None)
        integer = field == "original_max_position_embeddings"
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0
                or (integer and not float(value).is_integer())):
            c.refuse(key, f"{field} must be a positive {'integer' if integer else 'number'}, got {value!r}",
                     f"give {field} for rope_type {kind}", (field,))
            return float(theta), None
        scaling[field] = int(value) if integer else float(value)
    for extra in fields:
        c.refuse(key, f"a field of rope_type {kind} that the import does not read", "remove it", (extra,))
    if "high_freq_factor" in scaling and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        c.refuse(key, "high_freq_factor must be above low_freq_factor", "check the config", ("high_freq_factor",))
    return float(theta), scaling


def _padding(c: _Config, vocab: int) -> str:
    """`, padding_idx: N` for the token embedding of a family whose transformers model builds it as
    nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id): the lookups of that id do not train its row
    (a negative id counts from the end, as torch reads it). None: every row trains. An id outside the table
    (transformers cannot build the model with it) is W010: the spec trains every row."""
    pad = c.get("pad_token_id")
    if pad is None:
        return ""
    if not isinstance(pad, int) or isinstance(pad, bool):
        c.wrong("pad_token_id", f"`pad_token_id` must be an integer or null, got {pad!r}")
        return ""
    if not -vocab <= pad < vocab:
        c.diags.append(Diagnostic(
            codes.W010, f"`pad_token_id: {pad}` is not a token of the vocabulary ({vocab}): the spec's embedding "
            "trains every row", c.doc.pos(("pad_token_id",) if "pad_token_id" in c.data else ()), severity="warning",
            help="set pad_token_id to the tokenizer's padding token (transformers builds no model with this one)"))
        return ""
    return f", padding_idx: {pad % vocab}"


def _num(v: float) -> str:
    return json.dumps(float(v)) if not float(v).is_integer() or abs(v) >= 1e16 else f"{float(v):.1f}"


def _flow(d: dict) -> str:
    """A flat mapping in YAML flow style, floats with their point."""
    return "{" + ", ".join(f"{k}: {_num(v) if isinstance(v, float) else v}" for k, v in d.items()) + "}"


def _sanitize(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "imported"
    return name if name[0].isalnum() else "m" + name


# ---------------------------------------------------------------- families


def _attention_dims(c: _Config, seq: int) -> tuple[dict, int]:
    """The dims of a Llama-like decoder, and the heads' size (num_key_value_heads and head_dim: null or
    absent without a family default is num_attention_heads and hidden_size / num_attention_heads)."""
    d, heads = c.need("hidden_size"), c.need("num_attention_heads")
    kv = c.number("num_key_value_heads", integer=True, none=True) or heads
    if heads % kv:
        c.wrong("num_key_value_heads", f"`num_key_value_heads` ({kv}) must divide num_attention_heads ({heads})")
    dims = {"vocab": c.need("vocab_size"), "seq": seq, "d": d, "heads": heads, "kv_heads": kv,
            "ff": c.need("intermediate_size"), "layers": c.need("num_hidden_layers")}
    return dims, c.number("head_dim", integer=True, none=True) or d // heads


def _layer_types(c: _Config, layers: int) -> list | None:
    """`layer_types`: null, or one attention kind (a string) per layer (E071 otherwise)."""
    types = c.get("layer_types")
    if types is not None and (not isinstance(types, list) or len(types) != layers
                              or not all(isinstance(t, str) for t in types)):
        c.wrong("layer_types", f"`layer_types` must list one attention kind per layer ({layers}), got {types!r}")
        return None
    return types


def _windows(c: _Config, seq: int, layers: int, default: int | None) -> None:
    """`layer_types` of full_attention and sliding_attention layers (Gemma 2, Ministral; absent: every layer
    may slide), the latter with `sliding_window` (`default` where absent): exact when the window is at least
    the sequence, where it cuts nothing."""
    window = c.number("sliding_window", default, integer=True, none=True)
    types = _layer_types(c, layers)
    if (types is None or "sliding_attention" in types) and window is not None and window < seq:
        c.refuse("sliding_window", f"a window of {window} tokens is shorter than the sequence ({seq}): sliding-"
                 "window attention is not in the spec language", f"import with --seq {window} or less")
    if types is not None and any(t not in ("full_attention", "sliding_attention") for t in types):
        c.refuse("layer_types", "only full and sliding-window attention layers import", "check the config")


def _alias(c: _Config, key: str, other: str) -> str:
    """The one of two names of a field (a config class's attribute_map) that the config gives (`key` where it
    gives neither); both, with different values, are E070 at `key`."""
    c.get(other)
    if key in c.data and other in c.data and c.data[key] != c.data[other]:
        c.refuse(key, f"it names the field `{other}` too, with another value", f"remove one of {key} and {other}")
    return other if other in c.data and key not in c.data else key


def _llama(c: _Config, seq: int) -> tuple[dict, list[str], str]:
    """Llama and its variants (Mistral, Ministral, Qwen2, Qwen3, Phi-3, InternLM3, Seed-OSS): rms_norm,
    grouped-query attention with rotary embeddings (transformers' rotate-half convention is the spec's),
    swiglu; Qwen3's RMS norms on each head of q and k are the attention's qk_norm. Phi-3's fused qkv_proj and
    gate_up_proj are names (_PHI3): the model is Llama's."""
    kind = c.get("model_type")
    dims, head_dim = _attention_dims(c, seq)
    d, heads = dims["d"], dims["heads"]
    gemma = kind == "gemma"  # Gemma: GeGLU, (1 + weight) norms, embeddings scaled by sqrt(hidden_size)
    if gemma:
        # ("gelu": the first Gemma releases' name of the tanh gelu, which transformers reads as such)
        c.only("hidden_act", ("gelu_pytorch_tanh", "gelu_new", "gelu"), "Gemma's GeGLU gate imports with the tanh "
               "gelu", "use gelu_pytorch_tanh", "gelu_pytorch_tanh")
        c.only("hidden_activation", (None, "gelu_pytorch_tanh", "gelu_new"), "Gemma's GeGLU gate imports with "
               "the tanh gelu", "use gelu_pytorch_tanh")
        c.only("use_bidirectional_attention", (None, False), "the imported attention is causal", "remove it")
    else:
        c.only("hidden_act", ("silu",), "the spec's swiglu uses silu", "only silu-gated MLPs import", "silu")
    # (InternLM3's attribute_map: its qkv_bias is attention_bias, its bias mlp_bias)
    attention_bias, mlp_bias = "attention_bias", "mlp_bias"
    if kind == "internlm3":
        attention_bias, mlp_bias = _alias(c, "qkv_bias", "attention_bias"), _alias(c, "bias", "mlp_bias")
    if kind == "phi3":  # Phi3Config has neither: its projections never have biases (transformers ignores them)
        c.get("attention_bias")
        c.get("mlp_bias")
        c.get("original_max_position_embeddings")  # (longrope's, refused by _rope)
        c.get("embd_pdrop")  # (transformers' Phi-3 has no dropout on the embeddings)
        # (Phi-3's first releases name their remote code, the model transformers has since built in: the one
        # from_pretrained builds without trust_remote_code, and the one imported)
        c.get("auto_map")
        c.no_dropout("resid_pdrop")
    else:
        c.only(mlp_bias, (False,), "the spec's swiglu has no biases", "only bias-free MLPs import", False)
    c.get("pretraining_tp")  # a way to split the same matmuls: the model is the same
    eps = c.number("rms_norm_eps", 1e-6)
    theta, scaling = _rope(c)
    if kind == "phi3" and scaling:
        c.refuse("rope_scaling" if "rope_scaling" in c.data else "rope_parameters", "Phi-3 takes only longrope "
                 "scaling (Phi3Config refuses the others), which the spec's rope_scaling lacks",
                 "remove the rope scaling (positions up to the original context)")
    ffn = "{op: mlp, name: mlp, hidden: ff, activation: swiglu" + (", gate_activation: gelu}" if gemma else "}")
    if kind in MOE_FAMILIES:
        ffn = _moe(c, kind, dims)
    if kind == "qwen2_moe":  # Qwen2's attention: biases on q, k and v (transformers 5's qkv_bias)
        bias = "qkv" if c.flag("qkv_bias", True) else "false"
        if c.flag("use_sliding_window", False):
            c.refuse("use_sliding_window", "sliding-window attention is not in the spec language",
                     "set use_sliding_window to false (full attention)")
        c.get("max_window_layers")  # the layers with sliding windows: none without use_sliding_window
        c.get("sliding_window")  # (read by transformers only with use_sliding_window)
    elif kind in ("qwen2", "qwen3", "qwen3_moe"):
        # Qwen2's q, k and v projections have biases, its o projection none; Qwen3's all four or none
        bias = "qkv" if kind == "qwen2" else "true" if c.flag("attention_bias", False) else "false"
        if c.flag("use_sliding_window", False):
            c.refuse("use_sliding_window", "sliding-window attention is not in the spec language",
                     "set use_sliding_window to false (full attention)")
        c.get("max_window_layers")  # the layers with sliding windows: none without use_sliding_window
        c.get("sliding_window")  # (read by transformers only with use_sliding_window)
    elif kind == "ministral":  # Mistral with layer_types: its sliding_window only on the sliding_attention layers
        bias = "false"
        _windows(c, seq, dims["layers"], None)
    else:
        # Llama's bias is on q, k, v and o; Seed-OSS's on q, k and v (attention_bias) and o (attention_out_bias)
        qkv = kind != "phi3" and c.flag(attention_bias, False)
        out = c.flag("attention_out_bias", False) if kind == "seed_oss" else qkv
        bias = "true" if qkv and out else "qkv" if qkv else "false"
        if out and not qkv:
            c.refuse("attention_out_bias", "a bias on the o projection alone is not in the spec language (the "
                     "attention's bias is on q, k, v and o, or on q, k and v)", "import a model with "
                     "attention_bias true too, or attention_out_bias false")
        window = c.number("sliding_window", integer=True, none=True)
        if window is not None and window < seq:
            c.refuse("sliding_window", f"a window of {window} tokens is shorter than the sequence ({seq}): sliding-"
                     "window attention is not in the spec language", f"import with --seq {window} or less")
    if kind != "ministral":
        types = _layer_types(c, dims["layers"])
        if types is not None and any(t != "full_attention" for t in types):
            c.refuse("layer_types", "layers other than full_attention (sliding windows) are not in the spec "
                     "language", "import a model whose layers all use full attention")
    c.no_dropout("attention_dropout")
    if kind == "seed_oss":
        c.no_dropout("residual_dropout")
    tie = c.flag("tie_word_embeddings", gemma)
    attn = (f"{{op: attention, name: self_attn, heads: heads, kv_heads: kv_heads, causal: true, rotary: true, "
            f"rotary_base: {_num(theta)}, bias: {bias}" + (f", head_dim: {head_dim}" if head_dim * heads != d else "")
            + (f", rope_scaling: {_flow(scaling)}" if scaling else "")
            + (f", qk_norm: true, qk_norm_eps: {_num(eps)}" if kind in ("qwen3", "qwen3_moe") else "") + "}")
    norm = f"eps: {_num(eps)}" + (", weight_offset: 1.0" if gemma else "")  # Gemma: x / rms(x) * (1 + weight)
    block = [
        f"{{op: rms_norm, name: input_layernorm, {norm}}}",
        attn,
        "{op: add, name: res1, inputs: [block_input, self_attn]}",
        f"{{op: rms_norm, name: post_attention_layernorm, {norm}}}",
        ffn,
        f"{{op: add, name: res2, inputs: [res1, {'block_sparse_moe' if kind == 'mixtral' else 'mlp'}]}}",
    ]
    layers = [
        "{op: embedding, name: embed_tokens, vocab: vocab, dim: d, input: tokens" + _padding(c, dims["vocab"])
        + (f", scale: {json.dumps(float(d) ** 0.5)}}}" if gemma else "}"),
        "{repeat: layers, block: decoder, name: layers}",
        f"{{op: rms_norm, name: norm, {norm}}}",
        "{op: linear, name: lm_head, dimension: vocab, bias: false" + (", tie: embed_tokens}" if tie else "}"),
    ]
    return dims, [("decoder", block)], layers


MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")


def _moe(c: _Config, kind: str, dims: dict) -> str:
    """The moe layer of Mixtral (`block_sparse_moe`: SwiGLU experts w1, w3, w2, top-k gates renormalised),
    Qwen2-MoE (`mlp`: SwiGLU experts, gates renormalised with norm_topk_prob, one shared SwiGLU expert scaled
    by a sigmoid gate) or Qwen3-MoE (Qwen2-MoE's without the shared expert), all dropless (transformers computes every routed token). transformers adds its
    load-balancing loss only with output_router_logits, a loss the moe operator's is not: refused."""
    if kind == "mixtral":
        dims["experts"] = c.need("num_local_experts")
        jitter = c.number("router_jitter_noise", 0.0, zero=True)
        if jitter:
            c.refuse("router_jitter_noise", f"{jitter!r}: multiplicative noise on the router's input in training "
                     "is not in the moe operator", "set router_jitter_noise to 0")
        layer = "{op: moe, name: block_sparse_moe, experts: experts, top_k: top_k, hidden: ff, activation: swiglu, " \
                "normalize_gates: true, dropless: true, aux_loss_weight: 0.0}"
    else:
        # (transformers 5's Qwen3-MoE config names the experts' count num_local_experts, transformers 4's num_experts)
        v5 = kind == "qwen3_moe" and "num_local_experts" in c.data
        dims["experts"] = c.need("num_local_experts" if v5 else "num_experts")
        dims.pop("ff")  # intermediate_size: the dense MLP layers' (none imported: see below)
        dims["moe_ff"] = c.need("moe_intermediate_size")
        if kind == "qwen2_moe":
            dims["shared_ff"] = c.need("shared_expert_intermediate_size")
        step = c.number("decoder_sparse_step", 1, integer=True)
        if step != 1:
            c.refuse("decoder_sparse_step", f"{step!r}: dense MLP layers between the moe layers are not imported "
                     "(every layer of the imported model is alike)", "import a model with decoder_sparse_step 1")
        dense = c.get("mlp_only_layers") or []
        if dense:
            c.refuse("mlp_only_layers", f"{dense!r}: dense MLP layers among the moe layers are not imported (every "
                     "layer of the imported model is alike)", "import a model with no mlp_only_layers")
        norm = c.flag("norm_topk_prob", False)
        shared = ", shared_experts: 1, shared_hidden: shared_ff, shared_gate: true" if kind == "qwen2_moe" else ""
        layer = ("{op: moe, name: mlp, experts: experts, top_k: top_k, hidden: moe_ff, activation: swiglu, "
                 f"normalize_gates: {'true' if norm else 'false'}, dropless: true{shared}, aux_loss_weight: 0.0}}")
    dims["top_k"] = c.need("num_experts_per_tok")
    if dims["top_k"] > dims["experts"]:
        c.refuse("num_experts_per_tok", f"{dims['top_k']} experts per token of {dims['experts']}",
                 "check the config")
    if c.flag("output_router_logits", False):
        c.refuse("output_router_logits", "transformers' load-balancing loss (over every top-k choice, over the "
                 "tokens of all layers together) is not the moe operator's (first choices, per layer and sample)",
                 "set output_router_logits to false: the imported model trains without a load-balancing loss "
                 "(add aux_loss_weight to its moe layers for the operator's own)")
    c.get("router_aux_loss_coef")  # (transformers' loss weight: only with output_router_logits)
    return layer


def _gemma2(c: _Config, seq: int):
    """Gemma 2: Gemma's GeGLU, (1 + weight) RMS norms and scaled embeddings, with a norm before and after
    each sub-layer, attention scores scaled by query_pre_attn_scalar ** -0.5 and soft-capped, alternating
    sliding-window layers (exact when the window is at least the sequence) and soft-capped final logits."""
    dims, head_dim = _attention_dims(c, seq)
    d, heads = dims["d"], dims["heads"]
    c.only("hidden_activation", (None, "gelu_pytorch_tanh", "gelu_new"), "Gemma's GeGLU gate imports with the "
           "tanh gelu", "use gelu_pytorch_tanh")
    c.only("hidden_act", (None, "gelu_pytorch_tanh", "gelu_new"), "Gemma's GeGLU gate imports with the tanh gelu",
           "use gelu_pytorch_tanh")
    c.only("use_bidirectional_attention", (None, False), "the imported attention is causal", "remove it")
    c.only("mlp_bias", (False,), "the spec's swiglu has no biases", "only bias-free MLPs import", False)
    eps = c.number("rms_norm_eps", 1e-6)
    theta, scaling = _rope(c)
    bias = "true" if c.flag("attention_bias", False) else "false"
    # (absent fields take Gemma2Config's defaults, DEFAULTS, as transformers reads the config)
    scalar = c.number("query_pre_attn_scalar", 256)
    cap = c.number("attn_logit_softcapping", 50.0, none=True)
    final_cap = c.number("final_logit_softcapping", 30.0, none=True)
    _windows(c, seq, dims["layers"], 4096)
    c.no_dropout("attention_dropout")
    tie = c.flag("tie_word_embeddings", True)
    c.get("cache_implementation")  # how generate() caches keys and values: the same model
    attn = (f"{{op: attention, name: self_attn, heads: heads, kv_heads: kv_heads, causal: true, rotary: true, "
            f"rotary_base: {_num(theta)}, bias: {bias}, scale: {json.dumps(float(scalar) ** -0.5)}"
            + (f", softcap: {_num(cap)}" if cap else "") + (f", head_dim: {head_dim}" if head_dim * heads != d else "")
            + (f", rope_scaling: {_flow(scaling)}" if scaling else "") + "}")
    norm = f"eps: {_num(eps)}, weight_offset: 1.0"  # x / rms(x) * (1 + weight)
    block = [
        f"{{op: rms_norm, name: input_layernorm, {norm}}}",
        attn,
        f"{{op: rms_norm, name: post_attention_layernorm, {norm}}}",
        "{op: add, name: res1, inputs: [block_input, post_attention_layernorm]}",
        f"{{op: rms_norm, name: pre_feedforward_layernorm, {norm}}}",
        "{op: mlp, name: mlp, hidden: ff, activation: swiglu, gate_activation: gelu}",
        f"{{op: rms_norm, name: post_feedforward_layernorm, {norm}}}",
        "{op: add, name: res2, inputs: [res1, post_feedforward_layernorm]}",
    ]
    layers = [
        (f"{{op: embedding, name: embed_tokens, vocab: vocab, dim: d, input: tokens{_padding(c, dims['vocab'])}, "
         f"scale: {json.dumps(d ** 0.5)}}}"),
        "{repeat: layers, block: decoder, name: layers}",
        f"{{op: rms_norm, name: norm, {norm}}}",
        "{op: linear, name: lm_head, dimension: vocab, bias: false" + (", tie: embed_tokens}" if tie else "}"),
    ]
    if final_cap:
        layers.append(f"{{op: tanh, name: {_FINAL_CAP}, cap: {_num(final_cap)}}}  # soft-capped logits")
    return dims, [("decoder", block)], layers


_FINAL_CAP = "final_logit_softcapping"  # the layer of soft-capped logits (Gemma 2), which the loss reads


def _gpt2(c: _Config, seq: int):
    """GPT-2: learned positions, pre-norm blocks with biased attention and a gelu (tanh) MLP, tied head."""
    d = c.need("n_embd")
    dims = {"vocab": c.need("vocab_size"), "seq": seq, "positions": c.need("n_positions"), "d": d,
            "heads": c.need("n_head"), "ff": c.number("n_inner", integer=True, none=True) or 4 * d,
            "layers": c.need("n_layer")}
    c.only("activation_function", ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"),
           "the spec's mlp gelu is the tanh approximation", "only tanh-approximated gelu imports", "gelu_new")
    c.get("n_ctx")  # older configs' copy of n_positions
    c.get("pad_token_id")  # (GPT-2's wte has no padding_idx: every row trains)
    c.only("scale_attn_weights", (True,), "scores are always scaled by 1/sqrt(head_dim)", "set it to true", True)
    c.only("scale_attn_by_inverse_layer_idx", (False,), "per-layer score scaling is not in the spec language",
           "set it to false", False)
    c.get("reorder_and_upcast_attn")  # numerics of the same model: scores are float32 in the spec anyway
    c.only("tie_word_embeddings", (True,), "GPT-2's head is the token embedding (its checkpoints have no lm_head)",
           "set it to true", True)
    c.only("add_cross_attention", (False,), "cross-attention is not in the spec language", "remove it", False)
    for key in ("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                "summary_first_dropout"):
        c.get(key)  # GPT2DoubleHeadsModel's multiple-choice head: not part of GPT2LMHeadModel
    c.no_dropout("resid_pdrop", "embd_pdrop", "attn_pdrop")
    eps = c.number("layer_norm_epsilon", 1e-5)
    block = [
        f"{{op: layer_norm, name: ln_1, eps: {_num(eps)}}}",
        "{op: attention, name: attn, heads: heads, causal: true, bias: true}",
        "{op: add, name: res1, inputs: [block_input, attn]}",
        f"{{op: layer_norm, name: ln_2, eps: {_num(eps)}}}",
        "{op: mlp, name: mlp, hidden: ff, activation: gelu, bias: true}",
        "{op: add, name: res2, inputs: [res1, mlp]}",
    ]
    layers = [
        "{op: embedding, name: wte, vocab: vocab, dim: d, input: tokens}",
        "{op: pos_embedding, name: wpe, max_len: positions}",
        "{repeat: layers, block: block, name: h}",
        f"{{op: layer_norm, name: ln_f, eps: {_num(eps)}}}",
        "{op: linear, name: lm_head, dimension: vocab, bias: false, tie: wte}",
    ]
    return dims, [("block", block)], layers


def _starcoder2(c: _Config, seq: int):
    """StarCoder2: Mistral's attention (grouped-query, rotary, a sliding window: exact when it is at least the
    sequence) with biases on q, k, v and o (use_bias), layer norms with biases, a gelu (tanh) MLP c_fc, c_proj
    with biases (use_bias), tied embeddings."""
    dims, head_dim = _attention_dims(c, seq)
    c.only("hidden_act", ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"), "the spec's mlp gelu is the tanh "
           "approximation", "only tanh-approximated gelu imports", "gelu_pytorch_tanh")
    bias = "true" if c.flag("use_bias", True) else "false"
    eps = c.number("norm_epsilon", 1e-5)
    theta, scaling = _rope(c)
    window = c.number("sliding_window", integer=True, none=True)
    if window is not None and window < seq:
        c.refuse("sliding_window", f"a window of {window} tokens is shorter than the sequence ({seq}): sliding-"
                 "window attention is not in the spec language", f"import with --seq {window} or less")
    c.no_dropout("attention_dropout", "residual_dropout", "embedding_dropout")
    tie = c.flag("tie_word_embeddings", True)
    attn = (f"{{op: attention, name: self_attn, heads: heads, kv_heads: kv_heads, causal: true, rotary: true, "
            f"rotary_base: {_num(theta)}, bias: {bias}"
            + (f", head_dim: {head_dim}" if head_dim * dims["heads"] != dims["d"] else "")
            + (f", rope_scaling: {_flow(scaling)}" if scaling else "") + "}")
    block = [
        f"{{op: layer_norm, name: input_layernorm, eps: {_num(eps)}}}",
        attn,
        "{op: add, name: res1, inputs: [block_input, self_attn]}",
        f"{{op: layer_norm, name: post_attention_layernorm, eps: {_num(eps)}}}",
        f"{{op: mlp, name: mlp, hidden: ff, activation: gelu, bias: {bias}}}",
        "{op: add, name: res2, inputs: [res1, mlp]}",
    ]
    layers = [
        f"{{op: embedding, name: embed_tokens, vocab: vocab, dim: d, input: tokens{_padding(c, dims['vocab'])}}}",
        "{repeat: layers, block: decoder, name: layers}",
        f"{{op: layer_norm, name: norm, eps: {_num(eps)}}}",
        "{op: linear, name: lm_head, dimension: vocab, bias: false" + (", tie: embed_tokens}" if tie else "}"),
    ]
    return dims, [("decoder", block)], layers


# transformers' hidden_act -> the spec's gelu `approximate` (transformers names the exact form "gelu")
_BERT_ACTS = dict(zip(("gelu", "gelu_new", "gelu_pytorch_tanh"), ("none", "tanh", "tanh")))


def _bert(c: _Config, seq: int):
    """BERT for sequence classification: word, position and token-type embeddings, post-norm blocks, a
    pooler over the first position, a classifier."""
    act = c.only("hidden_act", tuple(_BERT_ACTS), "the spec's gelu is exact or tanh", "use gelu", "gelu")
    c.only("position_embedding_type", ("absolute",), "only learned absolute positions are in the spec language",
           "use absolute positions", "absolute")
    c.only("is_decoder", (False,), "a BERT decoder is not imported", "import the encoder", False)
    c.only("add_cross_attention", (False,), "cross-attention is not in the spec language", "remove it", False)
    c.no_dropout("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")
    archs = c.get("architectures") or ["BertForSequenceClassification"]
    if archs[0] not in ("BertForSequenceClassification", "BertModel"):
        c.refuse("architectures", f"{archs[0]} is not imported (BertForSequenceClassification is)",
                 "import the encoder with a classification head")
    labels = c.number("num_labels", integer=True, none=True) or len(c.get("id2label") or {}) or 2
    c.only("problem_type", (None, "single_label_classification"), "the spec's loss is cross-entropy over labels",
           "import a single-label classifier")
    c.get("tie_word_embeddings")  # BERT for classification has no language-model head to tie
    c.get("use_cache")
    eps = c.number("layer_norm_eps", 1e-12)
    approx = _BERT_ACTS.get(act, "none")
    dims = {"vocab": c.need("vocab_size"), "seq": seq, "positions": c.need("max_position_embeddings"),
            "types": c.need("type_vocab_size"), "d": c.need("hidden_size"), "heads": c.need("num_attention_heads"),
            "ff": c.need("intermediate_size"), "layers": c.need("num_hidden_layers"), "labels": labels}
    block = [
        "{op: attention, name: attention, heads: heads, bias: true}",
        "{op: add, name: res1, inputs: [block_input, attention]}",
        f"{{op: layer_norm, name: attention_norm, eps: {_num(eps)}}}",
        "{op: linear, name: intermediate, dimension: ff, axis: mlp}",
        f"{{op: gelu, name: act, approximate: {approx}}}",
        "{op: linear, name: output, dimension: d}",
        "{op: add, name: res2, inputs: [attention_norm, output]}",
        f"{{op: layer_norm, name: output_norm, eps: {_num(eps)}}}",
    ]
    layers = [
        f"{{op: embedding, name: word_embeddings, vocab: vocab, dim: d, input: tokens{_padding(c, dims['vocab'])}}}",
        "{op: pos_embedding, name: position_embeddings, max_len: positions}",
        "{op: embedding, name: token_type_embeddings, vocab: types, dim: d, input: token_type_ids}",
        "{op: add, name: embeddings, inputs: [position_embeddings, token_type_embeddings]}",
        f"{{op: layer_norm, name: embeddings_norm, eps: {_num(eps)}}}",
        "{repeat: layers, block: layer, name: layer}",
        "{op: split, name: first, dim: 0, sizes: [1, seq - 1], index: 0}  # the [CLS] position",
        "{op: reshape, name: cls, shape: [d]}",
        "{op: linear, name: pooler, dimension: d}",
        "{op: tanh, name: pooled}",
        "{op: linear, name: classifier, dimension: labels}",
    ]
    return dims, [("layer", block)], layers


FAMILIES: dict[str, Callable] = {"llama": _llama, "mistral": _llama, "qwen2": _llama, "qwen3": _llama,
                                 "gemma": _llama, "gemma2": _gemma2, "gpt2": _gpt2, "bert": _bert,
                                 "mixtral": _llama, "qwen2_moe": _llama, "qwen3_moe": _llama, "phi3": _llama,
                                 "internlm3": _llama, "seed_oss": _llama, "ministral": _llama,
                                 "starcoder2": _starcoder2}
# Families close to those that import, and what the spec language lacks for them (E070 at model_type)
NOT_YET = {
    "gemma3_text": "its q/k norms are RMS norms with (1 + weight) (the attention's qk_norm has no weight offset), "
    "and its sliding-window and full-attention layers use different rotary bases (rope_local_base_freq), which "
    "the copies of one repeated block cannot (gemma and gemma2 import)",
    "helium": "its rotary embeddings rotate interleaved pairs of features (x[2i], x[2i+1]); the spec's attention "
    "rotates halves (x[i], x[i + head_dim/2]), as Llama's",
    "smollm3": "its layers without rotary embeddings among layers with them (no_rope_layers, NoPE every "
    "no_rope_layer_interval layers) are not expressible: the copies of one repeated block are alike",
    "olmo2": "its q/k RMS norms over the whole q and k projections (all heads together) are not in the attention "
    "operator, whose qk_norm normalises each head",
    "granite": "its residual_multiplier (sub-layer outputs scaled before the residual add) and logits_scaling (the "
    "logits divided) need a layer that multiplies by a constant, which the spec language lacks",
}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "gpt2": "GPT2LMHeadModel",
                 "bert": "BertForSequenceClassification", "phi3": "Phi3ForCausalLM",
                 "internlm3": "LlamaForCausalLM",  # (transformers builds InternLM3 as Llama)
                 "seed_oss": "SeedOssForCausalLM", "ministral": "MinistralForCausalLM",
                 "starcoder2": "Starcoder2ForCausalLM"}


# ---------------------------------------------------------------- checkpoint names
# Per family: (canonical name pattern, transformers name, transposed, fused). `transposed`: the
# transformers tensor is the canonical one transposed (nn.Linear's [out, in]; only 2-D weights). `fused`: the
# group of canonical names stacked along the last dimension of one transformers tensor (GPT-2's c_attn).
_QKV = ("q", "k", "v")
_LLAMA = (
    (r"embed_tokens\.weight", "model.embed_tokens.weight", False, None),
    (r"layers\.(\d+)\.(input_layernorm|post_attention_layernorm|pre_feedforward_layernorm|post_feedforward_layernorm)"
     r"\.weight", "model.layers.{0}.{1}.weight", False, None),
    (r"layers\.(\d+)\.self_attn\.([qkvo])\.(weight|bias)", "model.layers.{0}.self_attn.{1}_proj.{2}", True, None),
    (r"layers\.(\d+)\.self_attn\.([qk]_norm)\.weight", "model.layers.{0}.self_attn.{1}.weight", False, None),  # qwen3
    (r"layers\.(\d+)\.mlp\.(gate|up|down)\.weight", "model.layers.{0}.mlp.{1}_proj.weight", True, None),
    (r"norm\.weight", "model.norm.weight", False, None),
    (r"lm_head\.weight", "lm_head.weight", True, None),
)
# Phi-3: q, k and v in one qkv_proj (the heads' rows, then the key/value heads' twice: parts of unequal sizes,
# hf_context's), gate and up in one gate_up_proj (gate first)
_PHI3 = (  # (the first rule that matches a name gives it: o_proj and down_proj are Llama's)
    (r"layers\.(\d+)\.self_attn\.([qkv])\.weight", "model.layers.{0}.self_attn.qkv_proj.weight", True, _QKV),
    (r"layers\.(\d+)\.mlp\.(gate|up)\.weight", "model.layers.{0}.mlp.gate_up_proj.weight", True, ("gate", "up")),
) + _LLAMA
_STARCODER2 = (  # (biases on its norms and MLP; the rest is Llama's)
    (r"layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.(weight|bias)", "model.layers.{0}.{1}.{2}", False,
     None),
    (r"layers\.(\d+)\.mlp\.(fc|proj)\.(weight|bias)", "model.layers.{0}.mlp.c_{1}.{2}", True, None),
    (r"norm\.(weight|bias)", "model.norm.{0}", False, None),
) + _LLAMA
_GPT2 = (  # GPT-2's Conv1D weights are [in, out]: the canonical layout
    (r"(wte|wpe)\.weight", "transformer.{0}.weight", False, None),
    (r"(h\.\d+\.ln_[12]|ln_f)\.(weight|bias)", "transformer.{0}.{1}", False, None),
    (r"h\.(\d+)\.attn\.([qkv])\.(weight|bias)", "transformer.h.{0}.attn.c_attn.{2}", False, _QKV),
    (r"h\.(\d+)\.attn\.o\.(weight|bias)", "transformer.h.{0}.attn.c_proj.{1}", False, None),
    (r"h\.(\d+)\.mlp\.(fc|proj)\.(weight|bias)", "transformer.h.{0}.mlp.c_{1}.{2}", False, None),
)
_BERT_QKV = {"q": "query", "k": "key", "v": "value"}
_BERT = (
    (r"(word_embeddings|position_embeddings|token_type_embeddings)\.weight", "bert.embeddings.{0}.weight", False,
     None),
    (r"embeddings_norm\.(weight|bias)", "bert.embeddings.LayerNorm.{0}", False, None),
    (r"layer\.(\d+)\.attention\.([qkv])\.(weight|bias)", "bert.encoder.layer.{0}.attention.self.{1}.{2}", True, None),
    (r"layer\.(\d+)\.attention\.o\.(weight|bias)", "bert.encoder.layer.{0}.attention.output.dense.{1}", True, None),
    (r"layer\.(\d+)\.attention_norm\.(weight|bias)", "bert.encoder.layer.{0}.attention.output.LayerNorm.{1}", False,
     None),
    (r"layer\.(\d+)\.(intermediate|output)\.(weight|bias)", "bert.encoder.layer.{0}.{1}.dense.{2}", True, None),
    (r"layer\.(\d+)\.output_norm\.(weight|bias)", "bert.encoder.layer.{0}.output.LayerNorm.{1}", False, None),
    (r"pooler\.(weight|bias)", "bert.pooler.dense.{0}", True, None),
    (r"classifier\.(weight|bias)", "classifier.{0}", True, None),
)
# A moe layer's experts [E, ...]: `*` in the transformers name stands for the expert index (one tensor per
# expert, each transposed: the checkpoints of transformers 4, and what transformers 5 writes)
_MIXTRAL = _LLAMA + (
    (r"layers\.(\d+)\.block_sparse_moe\.router\.weight", "model.layers.{0}.block_sparse_moe.gate.weight", True, None),
    (r"layers\.(\d+)\.block_sparse_moe\.experts\.gate\.weight", "model.layers.{0}.block_sparse_moe.experts.*.w1.weight",
     True, None),
    (r"layers\.(\d+)\.block_sparse_moe\.experts\.up\.weight", "model.layers.{0}.block_sparse_moe.experts.*.w3.weight",
     True, None),
    (r"layers\.(\d+)\.block_sparse_moe\.experts\.down\.weight", "model.layers.{0}.block_sparse_moe.experts.*.w2.weight",
     True, None),
)
_QWEN2_MOE = _LLAMA + (
    (r"layers\.(\d+)\.mlp\.router\.weight", "model.layers.{0}.mlp.gate.weight", True, None),
    (r"layers\.(\d+)\.mlp\.experts\.(gate|up|down)\.weight", "model.layers.{0}.mlp.experts.*.{1}_proj.weight", True, None),
    (r"layers\.(\d+)\.mlp\.shared\.(gate|up|down)\.weight", "model.layers.{0}.mlp.shared_expert.{1}_proj.weight", True,
     None),
    (r"layers\.(\d+)\.mlp\.shared_gate\.weight", "model.layers.{0}.mlp.shared_expert_gate.weight", True, None),
)
NAME_RULES = {"llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA, "qwen3": _LLAMA, "gemma": _LLAMA, "gemma2": _LLAMA,
              "gpt2": _GPT2, "bert": _BERT, "mixtral": _MIXTRAL, "qwen2_moe": _QWEN2_MOE,
              "qwen3_moe": _QWEN2_MOE, "phi3": _PHI3, "internlm3": _LLAMA, "seed_oss": _LLAMA, "ministral": _LLAMA,
              "starcoder2": _STARCODER2}
# The names in transformers 5's own layout (its modules' state dict), read where a checkpoint lacks the names
# above: a layer's experts fused, [E, 2 * hidden, d] gate and up joined (parts 0 and 1 of 2, each expert's
# matrix transposed) and [E, d, hidden] down; Mixtral's block_sparse_moe is `mlp` there
_GATE_UP = "model.layers.{0}.mlp.experts.gate_up_proj"
_FUSED_EXPERTS = (
    (r"layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.gate\.weight", _GATE_UP, True, ("gate", "up")),
    (r"layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.up\.weight", _GATE_UP, True, ("gate", "up")),
    (r"layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.down\.weight", "model.layers.{0}.mlp.experts.down_proj", True,
     None),
)
ALT_RULES = {
    "mixtral": ((r"layers\.(\d+)\.block_sparse_moe\.router\.weight", "model.layers.{0}.mlp.gate.weight", True, None),
                *_FUSED_EXPERTS),
    "qwen2_moe": _FUSED_EXPERTS,
    "qwen3_moe": _FUSED_EXPERTS,
}
PREFIXES = {"llama": "model.", "mistral": "model.", "qwen2": "model.", "qwen3": "model.", "gemma": "model.",
            "gemma2": "model.", "gpt2": "transformer.", "bert": "bert.", "mixtral": "model.", "qwen2_moe": "model.",
            "qwen3_moe": "model.", "phi3": "model.", "internlm3": "model.", "seed_oss": "model.", "ministral": "model.",
            "starcoder2": "model."}


def hf_name(model_type: str, name: str, ndim: int) -> tuple[str, bool, int, int] | None:
    """(transformers name, transposed, part, parts) of canonical parameter `name` (of `ndim` dimensions), or
    None when the family has no such parameter: the canonical tensor is part `part` of `parts` equal parts
    of the transformers tensor's last dimension, after transposing it when `transposed`."""
    return _match(NAME_RULES[model_type], model_type, name, ndim)


def hf_alt_name(model_type: str, name: str, ndim: int) -> tuple[str, bool, int, int] | None:
    """Like hf_name, the name in transformers 5's own layout where it differs (ALT_RULES: fused experts)."""
    return _match(ALT_RULES.get(model_type, ()), model_type, name, ndim)


def _match(rules, model_type: str, name: str, ndim: int) -> tuple[str, bool, int, int] | None:
    for pattern, template, transposed, fused in rules:
        m = re.fullmatch(pattern, name)
        if m:
            groups = [(_BERT_QKV.get(g, g) if model_type == "bert" else g) for g in m.groups()]
            if fused and template == _GATE_UP:  # (which of gate and up: the canonical name's)
                part, parts = (0 if ".experts.gate." in name else 1), 2
            else:
                part, parts = (fused.index(m.group(2)), len(fused)) if fused else (0, 1)
            # (per expert or fused, a moe layer's experts are stored as matrices each transposed)
            each = "*" in template or template in (_GATE_UP, "model.layers.{0}.mlp.experts.down_proj")
            return template.format(*groups), transposed and (ndim == 2 or each), part, parts
    return None


def check_hf(spec, doc: Document, graph) -> list[Diagnostic]:
    """E072 for every parameter of a spec with an `hf` section that has no name in that model's checkpoints
    (a layer renamed or added after the import): its programs could neither load nor export it."""
    out = []
    for p in graph.params:
        if hf_name(spec.hf.model_type, p.name, len(p.shape)) is None:
            out.append(Diagnostic(
                codes.E072, f"`{p.name}` has no name in a {spec.hf.model_type} checkpoint", doc.pos(("hf", "model_type")),
                help="keep the imported layer names (they are the transformers modules'), or remove the `hf` section "
                "to train the model without its checkpoints"))
            if len(out) == 5:
                break
    return out


def hf_context(plan) -> dict[str, Any] | None:
    """What the programs of a spec with an `hf` section need (templates/common/hf.py.j2): the transformers
    name of every parameter outside the repeated blocks (`names`), and of every block parameter as the text
    before and after its copy index (`block_names`: repeat -> name in the block -> [before, after,
    transposed, part, parts]), the names' prefix of the base model, the config written back on export."""
    hf = plan.spec.hf
    if hf is None:
        return None
    mark = str(10 ** 12 + 7)  # a copy index no model has: where the real one goes in a block parameter's name

    def rows(find):
        """(names, block_names) by `find` (hf_name or hf_alt_name), each parameter's [.., part, parts] with
        the parts' relative sizes where a fused tensor's parts differ in size (their canonical tensors' last
        dimensions: Phi-3's qkv_proj with fewer key/value heads than heads)."""
        names, block_names, fused = {}, {}, {}
        for p in plan.top_params:
            if found := find(hf.model_type, p.name, len(p.param.shape)):
                names[p.name] = row = list(found)
                fused.setdefault(row[0], []).append((row, p.param.shape[-1]))
        for r in plan.repeats:
            for b in r.params:
                if found := find(hf.model_type, f"{r.name}.{mark}.{b.local}", len(b.first.param.shape)):
                    key, *rest = found
                    row = block_names.setdefault(r.name, {})[b.local] = [*key.split(mark), *rest]
                    fused.setdefault((r.name, key), []).append((row, b.first.param.shape[-1]))
        for members in fused.values():
            sizes = {row[-2]: size for row, size in members}
            if len(members) > 1 and len(sizes) == members[0][0][-1] and len(set(sizes.values())) > 1:
                unit = math.gcd(*sizes.values())
                for row, _ in members:
                    row[-1] = [sizes[i] // unit for i in range(len(sizes))]
        return names, block_names

    names, block_names = rows(hf_name)
    alt_names, alt_block_names = rows(hf_alt_name)
    config = {**hf.config, "architectures": [hf.architecture], "model_type": hf.model_type}
    return {"model_type": hf.model_type, "architecture": hf.architecture, "config": config, "names": names,
            "block_names": block_names, "prefix": PREFIXES[hf.model_type],
            # transformers 5's names where they differ (a moe layer's fused experts): none for most families
            "alt_names": alt_names, "alt_block_names": alt_block_names, "experts": bool(alt_names or alt_block_names)}


def _inputs(family: str, logits: str = "lm_head") -> tuple[list[str], str]:
    if family == "bert":
        return (["tokens: {shape: [batch, seq], dtype: int32}", "token_type_ids: {shape: [batch, seq], dtype: int32}",
                 "labels: {shape: [batch], dtype: int32}"], "{op: cross_entropy, logits: classifier, targets: labels}")
    return (["tokens: {shape: [batch, seq], dtype: int32}", "targets: {shape: [batch, seq], dtype: int32}"],
            f"{{op: cross_entropy, logits: {logits}, targets: targets}}")


def config_path(path: Path) -> Path:
    return path / "config.json" if path.is_dir() else path


def import_hf(path: Path, name: str | None = None, seq: int | None = None, mesh: dict[str, int] | None = None
              ) -> Imported:
    """The spec for the transformers model at `path` (a model directory or its config.json). Raises
    DiagnosticError for what cannot be imported exactly."""
    cfg_file = config_path(path)
    doc = load_text(cfg_file.read_text(encoding="utf-8"), str(cfg_file))
    if not isinstance(doc.data, dict):
        raise DiagnosticError([Diagnostic(codes.E071, "a config.json holds a JSON object", doc.pos(()),
                                          help="give a transformers model directory or its config.json")])
    c = _Config(doc)
    kind = c.get("model_type")
    if kind in NOT_YET:
        raise DiagnosticError([Diagnostic(
            codes.E070, f"model_type {kind!r} is not imported yet: {NOT_YET[kind]}", doc.pos(("model_type",)),
            help=f"families that import: {', '.join(sorted(FAMILIES))}")])
    if kind not in FAMILIES:
        what = f"model_type {kind!r} cannot be imported" if "model_type" in doc.data else "the config has no model_type"
        raise DiagnosticError([Diagnostic(
            codes.E071, what, doc.pos(("model_type",) if "model_type" in doc.data else ()),
            help=f"families that import: {', '.join(sorted(FAMILIES))}")])
    max_pos = (c.number("max_position_embeddings", integer=True, none=True)
               or c.number("n_positions", integer=True, none=True) or DEFAULT_SEQ_CAP)
    seq = seq or min(max_pos, DEFAULT_SEQ_CAP)
    dims, blocks, layers = FAMILIES[kind](c, seq)
    c.unread()
    errors = [d for d in c.diags if d.severity == "error"]
    if errors:
        raise DiagnosticError(c.diags)
    name = _sanitize(name or (path.name if path.is_dir() else path.parent.name))
    capped = any(f"name: {_FINAL_CAP}" in x for x in layers)
    inputs, loss = _inputs(kind, _FINAL_CAP if capped else "lm_head")
    lines = [
        f"# Imported by `mithril-spec import hf` from {cfg_file} ({kind}).",
        "# Layer names follow the transformers modules (docs/fine-tuning.md in mithril-spec).",
        "version: 1",
        f"name: {json.dumps(name)}",
        "dims: {" + ", ".join(f"{k}: {v}" for k, v in dims.items()) + "}",
        "",
        "model:",
        "  inputs:",
        *(f"    {i}" for i in inputs),
        "  blocks:",
    ]
    for block, items in blocks:
        lines += [f"    {block}:", *(f"      - {item}" for item in items)]
    lines += ["  layers:", *(f"    - {item}" for item in layers), f"  loss: {loss}", ""]
    lines += ["mesh: {" + ", ".join(f"{a}: {n}" for a, n in (mesh or {"data": 1}).items()) + "}", ""]
    config = {k: v for k, v in sorted(doc.data.items()) if not k.startswith("_")}
    lines += [
        "# the model this spec came from: the programs read its checkpoints (--init-params DIR) and write them",
        "# back (--export-hf DIR) under its names",
        "hf:",
        f"  model_type: {kind}",
        f"  architecture: {ARCHITECTURES[kind]}",
        f"  config: {json.dumps(config, sort_keys=True)}",
        "",
    ]
    lines += [
        "sharding:",
        "  rules: {batch: [data, fsdp], embed: fsdp, heads: tensor, kv_heads: tensor, mlp: tensor}",
        "",
        "training:  # fine-tuning defaults: change them to your task",
        "  batch_size: 8",
        "  steps: 100",
        "  optimizer: {name: adamw, lr: 2.0e-5, weight_decay: 0.0}",
        "  schedule: {name: cosine, warmup_steps: 10}",
        "  clip_grad_norm: 1.0",
        "  precision: {params: float32, compute: float32}",
        "  seed: 0",
        "",
        "data: {kind: synthetic}  # or {kind: arrays, path: DIR}: one .npy per input",
        "",
    ]
    return Imported("\n".join(lines), kind, c.diags)
