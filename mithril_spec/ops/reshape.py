"""reshape (to a given per-sample shape) and flatten (all non-batch dimensions into one)."""

from __future__ import annotations

import math
from typing import Literal, Union

from pydantic import Field, StrictInt

from ..spec.common import Size
from .base import LayerArgs, Op, OpError, OpResult, TensorType


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
                    raise OpError("E030", "reshape allows at most one -1", "shape")
                unknown = i
                dims.append(1)
            else:
                dims.append(size(f"shape.{i}"))
        known = math.prod(dims)
        if unknown is not None:
            if x.numel % known:
                raise OpError("E030", f"cannot reshape {x.show()} to {args.shape}: sizes do not divide", "shape")
            dims[unknown] = x.numel // known
        if math.prod(dims) != x.numel:
            raise OpError(
                "E030",
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
