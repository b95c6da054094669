"""conv1d over [batch, channels, length] (NCL) inputs; conv2d, max_pool2d, avg_pool2d over
[batch, channels, height, width] (NCHW) inputs."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, StrictInt

from .. import codes
from ..spec.common import Ident, Size
from .base import LayerArgs, Op, OpError, OpResult, ParamDef, TensorType, expect_float, expect_rank

Pair = Union[Size, Annotated[list[Size], Field(min_length=2, max_length=2)]]


def _pair(args, size, field: str) -> tuple[int, int]:
    v = getattr(args, field)
    if isinstance(v, (tuple, list)):
        return size(f"{field}.0"), size(f"{field}.1")
    n = size(field)
    return n, n


def _out_hw(h: int, w: int, k, s, p, what: str) -> tuple[int, int]:
    oh = (h + 2 * p[0] - k[0]) // s[0] + 1
    ow = (w + 2 * p[1] - k[1]) // s[1] + 1
    if h + 2 * p[0] < k[0] or w + 2 * p[1] < k[1]:
        raise OpError(codes.E030, f"{what} kernel {list(k)} is larger than its padded input {h}x{w}", "kernel_size")
    return oh, ow


def _padding(args, size) -> tuple[int, int]:
    if args.padding == "same":
        k = _pair(args, size, "kernel_size")
        if k[0] % 2 == 0 or k[1] % 2 == 0:
            raise OpError(codes.E030, "padding `same` needs an odd kernel size", "padding")
        return k[0] // 2, k[1] // 2
    if args.padding == "valid":
        return 0, 0
    if isinstance(args.padding, (tuple, list)):
        return args.padding[0], args.padding[1]
    return args.padding, args.padding


class Conv2dArgs(LayerArgs):
    op: Literal["conv2d"]
    filters: Size = Field(description="output channels")
    kernel_size: Pair
    stride: Pair = 1
    padding: Union[Literal["same", "valid"], StrictInt, Annotated[list[StrictInt], Field(min_length=2, max_length=2)]] = 0
    bias: bool = True
    axis: Optional[Ident] = Field(None, description="logical axis name of the output channels")


class _Conv(Op):
    """A convolution: weight [filters, channels, *kernel] (the torch layout), bias [filters]."""

    handled_dims = {"weight": (0, 1), "bias": (0,)}
    has_params = True

    def costs(self, c):
        w, spec = c.tp.get("weight", frozenset()), c.param("weight").spec  # [filters, channels, *kernel]
        T_in = frozenset(a for a in spec[1] if a in w)
        T_out = frozenset(a for a in spec[0] if a in w)
        c.div_axes |= T_in | T_out
        c.save_input(div_axes=c.in_axes | T_in)
        c.matmul(T_in, T_out, c.act_axes(c.x, (0,)), c.act_axes(c.out, (0,)))


class Conv1dArgs(LayerArgs):
    op: Literal["conv1d"]
    filters: Size = Field(description="output channels")
    kernel_size: Size
    stride: Size = 1
    padding: Union[Literal["same", "valid"], StrictInt] = 0
    bias: bool = True
    axis: Optional[Ident] = Field(None, description="logical axis name of the output channels")


class Conv1d(_Conv):
    kind = "conv1d"
    Args = Conv1dArgs

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, "conv1d")
        expect_rank(x, 2, "conv1d", "[batch, channels, length]")
        c, length = x.shape
        f, k, s = size("filters"), size("kernel_size"), size("stride")
        if args.padding == "same":
            if k % 2 == 0:
                raise OpError(codes.E030, "padding `same` needs an odd kernel size", "padding")
            p = k // 2
        else:
            p = 0 if args.padding == "valid" else args.padding
        if p < 0:
            raise OpError(codes.E013, "padding must not be negative", "padding")
        if length + 2 * p < k:
            raise OpError(codes.E030, f"conv1d kernel {k} is larger than its padded input {length + 2 * p}", "kernel_size")
        out_len = (length + 2 * p - k) // s + 1
        params = (ParamDef("weight", (f, c, k), (args.axis, x.axes[0], None)),)
        if args.bias:
            params += (ParamDef("bias", (f,), (args.axis,), init="zeros"),)
        out = TensorType((f, out_len), (args.axis, None), x.dtype)
        attrs = {"in_channels": c, "filters": f, "kernel_size": k, "stride": s, "padding": p, "bias": args.bias}
        return OpResult(out, params, attrs, flops=2 * c * k * f * out_len)


class Conv2d(_Conv):
    kind = "conv2d"
    Args = Conv2dArgs

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, "conv2d")
        expect_rank(x, 3, "conv2d", "[batch, channels, height, width]")
        c, h, w = x.shape
        f = size("filters")
        k, s, p = _pair(args, size, "kernel_size"), _pair(args, size, "stride"), _padding(args, size)
        if min(p) < 0:
            raise OpError(codes.E013, "padding must not be negative", "padding")
        oh, ow = _out_hw(h, w, k, s, p, "conv2d")
        params = (ParamDef("weight", (f, c, k[0], k[1]), (args.axis, x.axes[0], None, None)),)
        if args.bias:
            params += (ParamDef("bias", (f,), (args.axis,), init="zeros"),)
        out = TensorType((f, oh, ow), (args.axis, None, None), x.dtype)
        attrs = {"in_channels": c, "filters": f, "kernel_size": list(k), "stride": list(s), "padding": list(p),
                 "bias": args.bias}
        return OpResult(out, params, attrs, flops=2 * c * k[0] * k[1] * f * oh * ow)


class _PoolArgs(LayerArgs):
    kernel_size: Pair
    stride: Optional[Pair] = Field(None, description="default: the kernel size")
    padding: StrictInt = Field(0, ge=0)


class MaxPool2dArgs(_PoolArgs):
    op: Literal["max_pool2d"]


class AvgPool2dArgs(_PoolArgs):
    op: Literal["avg_pool2d"]


class _Pool(Op):
    def helpers(self, attrs):
        return frozenset({"pool2d"})

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, self.kind)
        expect_rank(x, 3, self.kind, "[batch, channels, height, width]")
        c, h, w = x.shape
        k = _pair(args, size, "kernel_size")
        s = _pair(args, size, "stride") if args.stride is not None else k
        p = (args.padding, args.padding)
        if p[0] * 2 > k[0] or p[1] * 2 > k[1]:
            raise OpError(codes.E030, "pool padding must be at most half the kernel size", "padding")
        oh, ow = _out_hw(h, w, k, s, p, self.kind)
        out = TensorType((c, oh, ow), x.axes, x.dtype)
        return OpResult(out, (), {"kernel_size": list(k), "stride": list(s), "padding": list(p)},
                        flops=c * oh * ow * k[0] * k[1])


class MaxPool2d(_Pool):
    def costs(self, c):
        c.save_inputs()  # the backward pass routes gradients to each window's maximum

    kind = "max_pool2d"
    Args = MaxPool2dArgs


class AvgPool2d(_Pool):
    kind = "avg_pool2d"
    Args = AvgPool2dArgs
