"""mlp: the transformer feed-forward block, fc -> activation -> proj, or SwiGLU (gate, up, down)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from .. import codes
from ..spec.common import Size
from .base import LayerArgs, Op, OpError, OpResult, ParamDef, expect_features, expect_float, given

SILU_GATE = "silu"  # swiglu's own gate (gate_activation's default)
GELU = "gelu"  # the plain MLP's gelu activation: the tanh approximation (GPT-2's), as the helpers say


class MlpArgs(LayerArgs):
    op: Literal["mlp"]
    hidden: Size
    activation: Literal["gelu", "relu", "silu", "swiglu"] = "gelu"
    bias: Optional[bool] = Field(None, description="default: true, false for swiglu")
    gate_activation: Literal["silu", "gelu"] = Field(
        "silu", description="swiglu's gate: silu, or gelu (the tanh approximation: GeGLU, as Gemma)")


class Mlp(Op):
    kind = "mlp"
    Args = MlpArgs
    jax_function = True
    has_params = True
    context_parallel = "position"  # acts on each position alone
    tensor_parallel = "pair"
    handled_dims = {"fc.weight": (1,), "gate.weight": (1,), "up.weight": (1,), "proj.weight": (0,),
                    "down.weight": (0,), "fc.bias": (0,), "gate.bias": (0,), "up.bias": (0,)}  # fmt: skip
    torch_transposed = frozenset({"fc.weight", "gate.weight", "up.weight", "proj.weight", "down.weight"})
    float8_weights = frozenset({"fc.weight", "gate.weight", "up.weight", "proj.weight", "down.weight"})

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, "mlp")
        expect_features(x, "mlp")
        d, h, emb = x.shape[-1], size("hidden"), x.axes[-1]
        tokens = x.numel // d
        if args.gate_activation != "silu" and args.activation != "swiglu":
            raise OpError(codes.E030, "gate_activation is the gate of a swiglu mlp: set activation: swiglu",
                          "gate_activation")
        if args.activation == "swiglu":
            bias = bool(args.bias)
            names = (("gate", (d, h), (emb, "mlp")), ("up", (d, h), (emb, "mlp")), ("down", (h, d), ("mlp", emb)))
            flops = 2 * tokens * 3 * d * h + 4 * tokens * h
        else:
            bias = True if args.bias is None else args.bias
            names = (("fc", (d, h), (emb, "mlp")), ("proj", (h, d), ("mlp", emb)))
            flops = 2 * tokens * 2 * d * h + 8 * tokens * h
        params: list[ParamDef] = []
        for n, shape, axes in names:
            params.append(ParamDef(f"{n}.weight", shape, axes))
            if bias:
                params.append(ParamDef(f"{n}.bias", (shape[1],), (axes[1],), init="zeros"))
        return OpResult(x, tuple(params), {"dim": d, "hidden": h, "activation": args.activation, "bias": bias,
                                          "gate_activation": args.gate_activation},
                        flops=flops)

    def decodes(self, attrs):
        return True  # per position

    def forms(self, attrs):
        # the torch MLP's forms (lowering/parts/torch_ops.py): gated (swiglu) or ungated, and the tanh gelu's
        return frozenset({"mlp_gated" if attrs["activation"] == "swiglu" else "mlp_ungated"}
                         | ({"mlp_tanh_gelu"} if attrs["activation"] == "gelu" else set()))

    def helper_keywords(self, attrs):
        # a gate other than silu (GeGLU)
        return given((("gate_act", attrs["gate_activation"], attrs["gate_activation"] != SILU_GATE),))

    def torch_args(self, attrs, decode=False, split=False):
        # the decode's split hidden features first
        return given((("split", True, split),)) + self.helper_keywords(attrs)

    def jax_params(self, uses):
        return given((("parts", 1, any(a["activation"] == "swiglu" for a in uses)),
                      ("gate_act", SILU_GATE, any(a["gate_activation"] != SILU_GATE for a in uses))))

    def jax_keywords(self, layer):
        a = layer["attrs"]
        parts = ("parts", a["fused_parts"], a["activation"] == "swiglu" and (a["fused_parts"] or 1) != 1)
        return given((parts,)) + self.helper_keywords(a)

    def jax_parts(self, uses, program):
        forms = ffn_forms(uses)
        return {
            # the docstring names the forms some layer uses (and gelu's approximation where some layer uses it)
            "mlp_doc": [{"swiglu": "mlp_doc_swiglu", "both": "mlp_doc_both", "plain": "mlp_doc_plain"}[forms]] + ["gelu_doc"] * any(a["activation"] == "gelu" for a in uses),
            # swiglu alone, or the plain form with swiglu chosen by `activation` where both are used
            "mlp_body": {"swiglu": ["swiglu"], "both": ["swiglu_chosen", "fc_act_proj"],
                         "plain": ["fc_act_proj"]}[forms],
        }

    def decode_features(self, attrs):
        out = {"dense_mlp", "gated" if attrs["activation"] == "swiglu" else "ungated"}
        if attrs["gate_activation"] != SILU_GATE:
            out.add("gate_activation")
        return frozenset(out)

    def input_projections(self, attrs):
        return ("gate.weight", "up.weight") if attrs["activation"] == "swiglu" else ("fc.weight",)

    def costs(self, c):
        swiglu = c.attrs["activation"] == "swiglu"
        T = c.tp.get("gate.weight" if swiglu else "fc.weight", frozenset())  # hidden split (tensor parallel)
        c.div_axes |= T
        c.save_input()
        # (the positions split over `context` too: context parallelism)
        hid = c.b * (c.x.numel // c.x.shape[-1]) // c.context * c.attrs["hidden"] // c.deg(T)
        for j in range(3 if swiglu else 2):  # the hidden pre- and post-activation (and swiglu's product)
            c.save(f"hidden{j}", hid * c.compute_bytes)
        if T:
            c.tp_pair(T, c.input_gradients(self.input_projections(c.attrs)))


def ffn_forms(uses) -> str:
    """The feed-forward forms the layers (`uses`: their attrs, each with an `activation`) use: `plain`
    (proj(act(fc(x)))), `swiglu` (down(silu(gate(x)) * up(x))), or `both` (chosen by `activation`)."""
    acts = {a["activation"] for a in uses}
    return "both" if len(acts) > 1 and "swiglu" in acts else "swiglu" if "swiglu" in acts else "plain"
