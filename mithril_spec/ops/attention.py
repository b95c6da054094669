"""attention: multi-head self-attention over [batch, seq, dim], optionally causal, grouped-query
(kv_heads < heads), rotary, and with dropout on the attention probabilities. Separate q/k/v/o projections so
that tensor parallelism splits heads."""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional, Union

from pydantic import Field

from .. import codes
from ..spec.common import Size, Strict
from .base import MASK_BYTES, LayerArgs, Op, OpError, OpResult, ParamDef, TensorType, expect_float, given


class LinearRopeScaling(Strict):
    """Position interpolation: every rotary frequency divided by `factor` (transformers' `linear`)."""

    type: Literal["linear"]
    factor: float = Field(gt=0, description="the frequencies are divided by it")


class Llama3RopeScaling(Strict):
    """Llama 3.1's frequency-dependent scaling (transformers' `llama3`): wavelengths above
    original_max_position_embeddings / low_freq_factor are divided by `factor`, those below
    original_max_position_embeddings / high_freq_factor kept, and the ones between interpolated smoothly."""

    type: Literal["llama3"]
    factor: float = Field(gt=0)
    low_freq_factor: float = Field(gt=0)
    high_freq_factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(gt=0)


RopeScaling = Annotated[Union[LinearRopeScaling, Llama3RopeScaling], Field(discriminator="type")]
# the rope_scaling kinds -> their fields (besides `type`), in order: transformers' rope_type and its fields
ROPE_SCALING_FIELDS = {m.model_fields["type"].annotation.__args__[0]: tuple(f for f in m.model_fields if f != "type")
                       for m in (LinearRopeScaling, Llama3RopeScaling)}


def rope_inv_freq(base: float, head_dim: int, scaling: dict | None = None) -> list[float]:
    """The rotary inverse frequencies, as the programs compute them (float64): base ** (-2i / head_dim) for
    i < head_dim / 2, then scaled as transformers scales them (ROPE_INIT_FUNCTIONS: `linear`, `llama3`)."""
    inv = [base ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    if not scaling:
        return inv
    if scaling["type"] == "linear":
        return [f / scaling["factor"] for f in inv]
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        scaled = f / factor if wavelen > old / low else f
        if not wavelen < old / high and not wavelen > old / low:  # medium frequencies: smoothed
            smooth = (old / wavelen - low) / (high - low)
            scaled = (1 - smooth) * scaled / factor + smooth * scaled
        out.append(scaled)
    return out


class AttentionArgs(LayerArgs):
    op: Literal["attention"]
    heads: Size
    kv_heads: Optional[Size] = Field(None, description="key/value heads for grouped-query attention; default: heads")
    head_dim: Optional[Size] = Field(None, description="default: dim / heads")
    causal: bool = False
    rotary: bool = False
    rotary_base: float = Field(10000.0, gt=1)
    rope_scaling: Optional[RopeScaling] = Field(
        None, description="scaled rotary frequencies (needs rotary): {type: linear, factor} or {type: llama3, "
        "factor, low_freq_factor, high_freq_factor, original_max_position_embeddings}, as transformers computes them")
    scale: Optional[float] = Field(
        None, gt=0, description="multiplies the scores q k^T; default 1 / sqrt(head_dim) (Gemma 2: "
        "query_pre_attn_scalar ** -0.5)")
    softcap: Optional[float] = Field(
        None, gt=0, description="caps the scaled scores at +-softcap: softcap * tanh(scores / softcap), before the "
        "mask (Gemma 2's attn_logit_softcapping); the targets then compute the probabilities themselves")
    qk_norm: bool = Field(
        False, description="an RMS norm over each head of q and of k (weights q_norm.weight, k_norm.weight "
        "[head_dim], shared by the heads) before the rotary embeddings, as Qwen3")
    qk_norm_eps: float = Field(1e-6, gt=0, description="the q/k norms' epsilon")
    bias: Union[bool, Literal["qkv"]] = Field(
        False, description="biases on the q, k, v and o projections (true), on q, k and v only (qkv, as Qwen2), or none")
    dropout: float = Field(
        0.0, ge=0, lt=1, description="dropout rate on the attention probabilities (softmax output) in training; "
        "none in evaluation and sampling")


class Attention(Op):
    kind = "attention"
    Args = AttentionArgs
    has_params = True
    tensor_parallel = "pair"
    kv_cache = True
    context_parallel = "ring"  # key/value blocks passed around the context axis (ring attention)
    random_tensor_parallel = True  # the programs draw the dropout mask of every head and keep their own
    random_sequence_parallel = True  # (the probabilities span the gathered sequence: as tensor parallelism)
    random_context_parallel = True  # ring attention drops each block by its entries of the one-device mask
    handled_dims = {"q.weight": (1,), "k.weight": (1,), "v.weight": (1,), "o.weight": (0,),
                    "q.bias": (0,), "k.bias": (0,), "v.bias": (0,)}  # fmt: skip
    torch_transposed = frozenset({"q.weight", "k.weight", "v.weight", "o.weight"})
    float8_weights = frozenset({"q.weight", "k.weight", "v.weight", "o.weight"})

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, "attention")
        if len(x.shape) != 2:
            raise OpError(codes.E028, f"attention expects [batch, seq, dim], got {x.show()}", "input")
        seq, d = x.shape
        heads = size("heads")
        kv = size("kv_heads") if args.kv_heads is not None else heads
        if heads % kv:
            raise OpError(codes.E030, f"kv_heads ({kv}) must divide heads ({heads})", "kv_heads")
        if args.head_dim is not None:
            hd = size("head_dim")
        else:
            if d % heads:
                raise OpError(codes.E030, f"heads ({heads}) must divide the model width ({d}), or set head_dim", "heads")
            hd = d // heads
        if args.rotary and hd % 2:
            raise OpError(codes.E030, f"rotary embeddings need an even head_dim, got {hd}", "rotary")
        if (args.softcap or args.scale) and args.dropout:
            raise OpError(codes.E030, "scale and softcap do not combine with attention dropout", "dropout")
        if args.rope_scaling is not None and not args.rotary:
            raise OpError(codes.E030, "rope_scaling scales rotary embeddings: set rotary: true", "rope_scaling")
        if isinstance(args.rope_scaling, Llama3RopeScaling) and (
                args.rope_scaling.high_freq_factor <= args.rope_scaling.low_freq_factor):
            raise OpError(codes.E030, "rope_scaling: high_freq_factor must be above low_freq_factor", "rope_scaling")
        emb = x.axes[-1]
        q_out, kv_out = heads * hd, kv * hd
        params = [
            ParamDef("q.weight", (d, q_out), (emb, "heads"), units=(d, heads)),
            ParamDef("k.weight", (d, kv_out), (emb, "kv_heads"), units=(d, kv)),
            ParamDef("v.weight", (d, kv_out), (emb, "kv_heads"), units=(d, kv)),
            ParamDef("o.weight", (q_out, d), ("heads", emb), units=(heads, d)),
        ]
        if args.bias:
            params[3:3] = [
                ParamDef("q.bias", (q_out,), ("heads",), init="zeros", units=(heads,)),
                ParamDef("k.bias", (kv_out,), ("kv_heads",), init="zeros", units=(kv,)),
                ParamDef("v.bias", (kv_out,), ("kv_heads",), init="zeros", units=(kv,)),
            ]
            if args.bias is True:
                params.append(ParamDef("o.bias", (d,), (emb,), init="zeros"))
        if args.qk_norm:  # one weight per head dimension, shared by every head: whole on every rank
            params += [ParamDef("q_norm.weight", (hd,), (None,), init="ones"),
                       ParamDef("k_norm.weight", (hd,), (None,), init="ones")]
        proj = 2 * seq * d * (2 * q_out + 2 * kv_out) + (5 * seq * (q_out + kv_out) if args.qk_norm else 0)
        scores = 2 * 2 * seq * seq * heads * hd  # q@k^T and p@v
        attrs = {
            "dim": d, "seq": seq, "heads": heads, "kv_heads": kv, "head_dim": hd, "causal": args.causal,
            "rotary": args.rotary, "rotary_base": args.rotary_base,
            "rope_scaling": args.rope_scaling.model_dump() if args.rope_scaling is not None else None,
            "bias": bool(args.bias), "o_bias": args.bias is True,
            "dropout": args.dropout, "qk_norm": args.qk_norm, "qk_norm_eps": args.qk_norm_eps,
            "scale": args.scale, "softcap": args.softcap,
        }
        return OpResult(TensorType(x.shape, x.axes, x.dtype), tuple(params), attrs, flops=proj + scores)

    @staticmethod
    def _features(a):
        """(name, value, on) of the optional features every target's attention takes, in signature order: rotary
        frequencies and their scaling, q/k norms, the score scale and cap, biases (o_bias=False: on q, k and v
        only)."""
        return (("rotary_base", a["rotary_base"], a["rotary"]), ("rope_scaling", a["rope_scaling"], a["rope_scaling"]),
                ("qk_norm", a["qk_norm_eps"], a["qk_norm"]), ("scale", a["scale"], a["scale"]),
                ("softcap", a["softcap"], a["softcap"]), ("bias", True, a["bias"]),
                ("o_bias", False, a["bias"] and not a["o_bias"]))

    def torch_args(self, attrs, decode=False, split=False):
        # the module's dropout, or the decode's split heads
        return given((*self._features(attrs), ("dropout", attrs["dropout"], attrs["dropout"] and not decode),
                      ("split", True, split)))

    def helper_keywords(self, attrs):
        # the helper's key/value heads and causality are optional too
        return given((("kv_heads", attrs["kv_heads"], attrs["kv_heads"] != attrs["heads"]),
                      ("causal", True, attrs["causal"]), *self._features(attrs)))

    def helper_params(self, uses):
        """The helper's optional parameters (name, default) that some layer of `uses` (their attrs) passes, in
        signature order; `bias` always."""
        def some(key):
            return any(f[0] == key and f[2] for a in uses for f in self._features(a))
        return given((("kv_heads", None, any(a["kv_heads"] != a["heads"] for a in uses)),
                      ("causal", False, any(a["causal"] for a in uses)),
                      *((k, None, some(k)) for k in ("rotary_base", "rope_scaling", "qk_norm", "scale", "softcap")),
                      ("bias", False, True), ("o_bias", True, some("o_bias"))))

    def jax_params(self, uses):
        dropout = any(a["dropout"] for a in uses)
        return [*self.helper_params(uses), ("parts", 1),
                *given((("dropout_rate", 0.0, dropout), ("key", None, dropout)))]

    def jax_keywords(self, layer):
        a = layer["attrs"]
        return self.helper_keywords(a) + given((("parts", a["fused_parts"], (a["fused_parts"] or 1) != 1),))

    def decode_features(self, attrs):
        out = {"kv_attention"}
        if attrs["bias"]:
            out.add("qkv_bias")
            if not attrs["o_bias"]:
                out.add("o_bias_off")
        return frozenset(out)

    def decodes(self, attrs):
        return attrs["causal"]  # a position reads only the keys and values of the positions before it

    def is_random(self, attrs):
        return attrs.get("dropout", 0) > 0

    def jax_parts(self, uses, program):
        ring = program["ring"]  # the sequence held in positions() order, split over `context`
        rotary, scaled = any(a["rotary"] for a in uses), any(a["rope_scaling"] for a in uses)
        qknorm, drop = any(a["qk_norm"] for a in uses), any(a["dropout"] for a in uses)
        grouped = any(a["kv_heads"] != a["heads"] for a in uses)
        causal = any(a["causal"] for a in uses)
        qkv_bias = any(a["bias"] and not a["o_bias"] for a in uses)
        return {
            # the random helpers (unless a dropout layer brings them), the q/k head norms, the rotary embedding
            # (its scaled frequencies; its angles at the places' positions under context parallelism)
            "attention_helpers": program["random"] * (drop and "dropout" not in program["draws"])
            + ["head_norm"] * qknorm + ["scale_inv_freq"] * scaled
            + (["rope_scaled" if scaled else "rope", "angles_in_places" if ring else "angles", "rotate"]
               if rotary else []),
            # the docstring's sentences on the features some layer uses
            "attention_doc": ["qkv_bias_doc"] * qkv_bias + ["grouped_query_doc"] * grouped
            + [("rotary_scaled_doc" if scaled else "rotary_doc")] * rotary + ["dropout_doc"] * drop,
            # grouped-query attention: kv_heads defaults to heads
            "attention_kv_heads": ["kv_heads_default"] * grouped,
            # q, k, v split into heads (fewer key/value heads with grouped-query), their norms, their rotation
            "attention_heads": ["split_heads_grouped" if grouped else "split_heads"] + ["qk_norm"] * qknorm
            + [("rotate_scaled" if scaled else "rotate_qk")] * rotary,
            # the scores, softmax and weighted values: ring attention over `context` (its dropout mask drawn
            # whole), or on one place (the key/value heads repeated, scaled or capped scores, the causal mask,
            # dropout)
            "attention_core": (["ring_keep", "ring_causal_dropout" if causal else "ring_dropout"] if drop
                               else ["ring_causal" if causal else "ring"]) if ring else
            ["repeat_kv"] * grouped + ["scores_scaled" if any(a["scale"] for a in uses) else "scores"]
            + ["softcap"] * any(a["softcap"] for a in uses) + ["causal_mask"] * causal + ["probs"]
            + ["probs_dropout"] * drop + ["heads_out"],
            # the output projection's bias: o_bias decides where some layer has q/k/v biases without it
            "attention_out": ["out_bias_optional" if qkv_bias else "out_bias"],
        }

    def pipeline_limit(self, attrs):
        return "attention with dropout above rate 0 (masks per micro-batch and stage)" if self.is_random(attrs) else None

    def fused_kernel(self, attrs):
        # with dropout or a softcap every target computes the probabilities itself
        return not self.is_random(attrs) and not attrs.get("softcap")

    def context_role(self, attrs):
        if attrs.get("softcap") or attrs.get("scale"):
            return None  # ring attention scales its blocks by 1 / sqrt(head_dim), uncapped
        return super().context_role(attrs)

    def input_projections(self, attrs):
        return ("q.weight", "k.weight", "v.weight")

    def score_flops(self, attrs):
        return 2 * 2 * attrs["seq"] * attrs["seq"] * attrs["heads"] * attrs["head_dim"]  # q @ k^T and p @ v

    def costs(self, c):
        """Korthikanti et al.: the input, q, k, v, the softmax output [b, heads, s, s] (with dropout also its
        mask and the dropped-out probabilities), the output projection's input. A fused kernel (the target's
        `fused_attention` capability: torch's F.scaled_dot_product_attention, used at rate 0) stores no
        probabilities, only the softmax's log-sum-exp (fp32, one per query and head) besides q, k, v and its
        output, which is the output projection's input (measured: docs/cost-model.md).

        Over `context` (degree n, ring attention) a rank holds seq / n queries, keys and values; it receives
        the n - 1 other ranks' key and value blocks one after the other (c.ring) and keeps them for the backward
        pass, and computes the probabilities of its queries against all seq keys itself (no fused kernel); with
        dropout also their mask and the dropped-out probabilities, as on one device."""
        a = c.attrs
        T = c.tp.get("q.weight", frozenset())  # heads split over these axes (tensor parallel)
        c.div_axes |= T
        t = c.deg(T)
        c.save_input()
        n = c.context
        seq = c.x.shape[0]
        q = c.b * (seq // n) * a["heads"] * a["head_dim"] // t
        kv = c.b * (seq // n) * a["kv_heads"] * a["head_dim"] // c.deg(c.tp.get("k.weight", frozenset()))
        probs = c.b * a["heads"] * (seq // n) * seq // t
        cb = c.compute_bytes
        c.save("q", q * cb)
        c.save("k", kv * cb)
        c.save("v", kv * cb)
        if n > 1:
            c.ring(2 * kv * cb, "key/value")
            c.save("ring_kv", (n - 1) * 2 * kv * cb)  # the blocks received from the other ranks
            c.save("probs", probs * cb, scores=True)
            if a.get("dropout", 0):  # the one-device mask's entries of the rank's queries
                c.save("dropout_mask", probs * MASK_BYTES, scores=True)
                c.save("dropout_out", probs * cb, scores=True)
        elif a.get("dropout", 0):
            c.save("probs", probs * cb, scores=True)
            c.save("dropout_mask", probs * MASK_BYTES, scores=True)
            c.save("dropout_out", probs * cb, scores=True)
        elif c.fused_attention:
            c.save("logsumexp", c.b * a["heads"] * seq // t * 4, scores=True)
        else:
            c.save("probs", probs * cb, scores=True)
        c.save("o_in", q * cb)
        c.add_score_flops(self.score_flops(a) * c.b / t / n)
        if T:
            c.tp_pair(T, c.input_gradients(self.input_projections(a)))
