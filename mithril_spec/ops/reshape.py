"""reshape (to a given per-sample shape), flatten (all non-batch dimensions into one), concat (several
tensors along one dimension) and split (one piece of a tensor cut along one dimension)."""

from __future__ import annotations

import math
from typing import Annotated, Literal, Union

from pydantic import Field, StrictInt

from .. import codes
from ..spec.common import Size
from .base import LayerArgs, Op, OpError, OpResult, TensorType, expect_float


class ReshapeArgs(LayerArgs):
    op: Literal["reshape"]
    shape: list[Union[Size, StrictInt]] = Field(description="per-sample shape (without batch); one entry may be -1")


class Reshape(Op):
    kind = "reshape"
    Args = ReshapeArgs

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        dims: list[int] = []
        unknown = None
        for i, s in enumerate(args.shape):
            if s == -1:
                if unknown is not None:
                    raise OpError(codes.E030, "reshape allows at most one -1", "shape")
                unknown = i
                dims.append(1)
            else:
                dims.append(size(f"shape.{i}"))
        known = math.prod(dims)
        if unknown is not None:
            if x.numel % known:
                raise OpError(codes.E030, f"cannot reshape {x.show()} to {args.shape}: sizes do not divide", "shape")
            dims[unknown] = x.numel // known
        if math.prod(dims) != x.numel:
            raise OpError(
                codes.E030,
                f"reshape changes the element count per sample: {x.show()} has {x.numel}, "
                f"[batch, {', '.join(map(str, dims))}] has {math.prod(dims)}",
                "shape",
            )
        out = TensorType(tuple(dims), (None,) * len(dims), x.dtype)
        return OpResult(out, (), {"shape": dims})


class FlattenArgs(LayerArgs):
    op: Literal["flatten"]


class Flatten(Op):
    kind = "flatten"
    Args = FlattenArgs

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        return OpResult(TensorType((x.numel,), (None,), x.dtype), (), {})


def _dim(t: TensorType, dim: int, what: str) -> int:
    """A `dim` argument (counted without the batch dimension, negative from the end) as an index into t.shape."""
    if not t.shape:
        raise OpError(codes.E028, f"{what} needs a dimension besides the batch, got {t.show()}", "input")
    rank = len(t.shape)
    if not -rank <= dim < rank:
        raise OpError(
            codes.E030,
            f"{what} `dim: {dim}` is out of range for {t.show()}: the dimensions after batch are 0..{rank - 1} "
            f"(or -{rank}..-1)",
            "dim",
        )
    return dim % rank


class ConcatArgs(LayerArgs):
    op: Literal["concat"]
    dim: StrictInt = Field(-1, description="dimension to join along, counted without batch; negative from the end")


class Concat(Op):
    kind = "concat"
    Args = ConcatArgs
    arity = 0

    def infer(self, args, inputs, size, ctx):
        first = inputs[0]
        d = _dim(first, args.dim, "concat")
        for t in inputs:
            expect_float(t, "concat")
        rest = first.shape[:d] + first.shape[d + 1:]
        for other in inputs[1:]:
            if len(other.shape) != len(first.shape) or other.shape[:d] + other.shape[d + 1:] != rest:
                raise OpError(
                    codes.E028,
                    f"concat along dim {args.dim} needs inputs equal in every other dimension, got {first.show()} "
                    f"and {other.show()}",
                    "inputs",
                )
            if other.dtype != first.dtype:
                raise OpError(codes.E029, f"concat needs inputs of one dtype, got {first.dtype} and {other.dtype}", "inputs")
        shape = list(first.shape)
        shape[d] = sum(t.shape[d] for t in inputs)
        axes = list(first.axes)
        axes[d] = None  # pieces of differently named (or split) dimensions: the joined one is not split
        return OpResult(TensorType(tuple(shape), tuple(axes), first.dtype), (), {"dim": d, "n": len(inputs)})


class SplitArgs(LayerArgs):
    op: Literal["split"]
    dim: StrictInt = Field(-1, description="dimension to cut, counted without batch; negative from the end")
    sizes: Annotated[list[Size], Field(min_length=1)] = Field(description="sizes of the pieces, in order")
    index: StrictInt = Field(ge=0, description="which piece this layer outputs (0-based)")


class Split(Op):
    kind = "split"
    Args = SplitArgs

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        d = _dim(x, args.dim, "split")
        sizes = [size(f"sizes.{i}") for i in range(len(args.sizes))]
        if sum(sizes) != x.shape[d]:
            raise OpError(
                codes.E030,
                f"split sizes {sizes} sum to {sum(sizes)}, but dim {args.dim} of {x.show()} is {x.shape[d]}",
                "sizes",
                help=f"the pieces must add up to the whole dimension ({x.shape[d]}); size expressions help, "
                f"e.g. `sizes: [1, n - 1]`",
            )
        if args.index >= len(sizes):
            raise OpError(
                codes.E030,
                f"split `index: {args.index}` is out of range: `sizes` has {len(sizes)} piece(s) (index 0..{len(sizes) - 1})",
                "index",
                help="a split layer outputs one piece; write one split layer per piece you need",
            )
        start = sum(sizes[: args.index])
        shape = list(x.shape)
        shape[d] = sizes[args.index]
        axes = list(x.axes)
        axes[d] = None
        attrs = {"dim": d, "start": start, "stop": start + sizes[args.index]}
        return OpResult(TensorType(tuple(shape), tuple(axes), x.dtype), (), attrs)
