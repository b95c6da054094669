"""linear: y = x @ weight + bias over the last dimension; optionally tied to an embedding."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from .. import codes
from ..spec.common import Ident, Size
from .base import LayerArgs, Op, OpError, OpResult, ParamDef, TensorType, expect_float


class LinearArgs(LayerArgs):
    op: Literal["linear"]
    dimension: Size = Field(description="output features")
    bias: bool = True
    tie: Optional[Ident] = Field(None, description="embedding layer whose table this layer reuses (transposed)")
    axis: Optional[Ident] = Field(None, description="logical axis name of the output features")


class Linear(Op):
    kind = "linear"
    Args = LinearArgs
    has_params = True
    per_position = True
    tensor_parallel = "matmul"
    handled_dims = {"weight": (0, 1), "bias": (0,)}
    torch_transposed = frozenset({"weight"})
    float8_weights = frozenset({"weight"})

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, "linear")
        if not x.shape:
            raise OpError(codes.E028, f"linear needs at least one feature dimension, got {x.show()}", "input")
        d_in, d_out = x.shape[-1], size("dimension")
        in_axis = x.axes[-1]
        out_axis = args.axis
        params: tuple[ParamDef, ...]
        attrs = {"in_features": d_in, "out_features": d_out, "bias": args.bias, "tie": None}
        if args.tie is not None:
            table = ctx.tied_table(args.tie)  # (param full name, shape, axes) or raises OpError
            name, shape, axes = table
            if shape != (d_out, d_in):
                raise OpError(
                    codes.E028,
                    f"linear tied to `{args.tie}` computes [.., {d_in}] -> [.., {d_out}], but the embedding "
                    f"table is {list(shape)} (needs [{d_out}, {d_in}])",
                    "tie",
                    help="the tied layer's `dimension` must equal the embedding's vocab, its input width the embedding dim",
                )
            if args.bias:
                raise OpError(codes.E030, "a tied linear layer has no parameters of its own: set `bias: false`", "bias")
            out_axis = out_axis or axes[0]
            attrs["tie"] = name
            params = ()
        else:
            params = (ParamDef("weight", (d_in, d_out), (in_axis, out_axis)),)
            if args.bias:
                params += (ParamDef("bias", (d_out,), (out_axis,), init="zeros"),)
        out = TensorType(x.shape[:-1] + (d_out,), x.axes[:-1] + (out_axis,), x.dtype)
        return OpResult(out, params, attrs, flops=2 * x.numel * d_out)

    def costs(self, c):
        if c.attrs.get("tie"):  # the embedding's table [vocab, dim], used transposed
            table = c.global_param(c.attrs["tie"])
            T_out = frozenset(a for a in table.spec[0] if a not in c.batch)
            T_in = frozenset(a for a in table.spec[1] if a not in c.batch)
        else:
            w, spec = c.tp.get("weight", frozenset()), c.param("weight").spec  # [in, out]
            T_in = frozenset(a for a in spec[0] if a in w)
            T_out = frozenset(a for a in spec[1] if a in w)
        c.div_axes |= T_in | T_out
        feat = len(c.x.shape) - 1
        c.save_input(div_axes=c.in_axes | T_in)
        c.matmul(T_in, T_out, c.act_axes(c.x, (feat,)), c.act_axes(c.out, (len(c.out.shape) - 1,)))
