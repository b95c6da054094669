"""Shape-preserving operators: activations, softmax, dropout, and add/mul of several tensors."""

from __future__ import annotations

import math
from typing import Literal, Optional

from pydantic import Field

from .. import codes
from .base import MASK_BYTES, LayerArgs, Op, OpError, OpResult, SavesInputs, expect_float


class _Unary(SavesInputs):
    flops_per_element = 1
    elementwise = True
    per_position = True

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, self.kind)
        return OpResult(x, (), self.attrs(args), flops=self.flops_per_element * x.numel)

    def attrs(self, args):
        return {}


def _unary(kind: str, flops: int, doc: str):
    args_cls = type(
        f"{kind.title()}Args",
        (LayerArgs,),
        {"__annotations__": {"op": Literal[kind]}, "__doc__": doc, "__module__": __name__},
    )
    return type(kind.title(), (_Unary,), {"kind": kind, "Args": args_cls, "flops_per_element": flops})


Relu = _unary("relu", 1, "max(x, 0)")
Silu = _unary("silu", 4, "x * sigmoid(x)")
class TanhArgs(LayerArgs):
    """tanh(x), or with `cap`: cap * tanh(x / cap) (soft-capping, as Gemma 2's final logits)."""

    op: Literal["tanh"]
    cap: Optional[float] = Field(None, gt=0, description="cap * tanh(x / cap): values soft-capped at +-cap")


class Tanh(_Unary):
    kind = "tanh"
    Args = TanhArgs
    flops_per_element = 4

    def attrs(self, args):
        return {"cap": args.cap}


Sigmoid = _unary("sigmoid", 4, "1 / (1 + exp(-x))")


class GeluArgs(LayerArgs):
    op: Literal["gelu"]
    approximate: Literal["tanh", "none"] = "tanh"


class Gelu(_Unary):
    kind = "gelu"
    Args = GeluArgs
    flops_per_element = 8

    def attrs(self, args):
        return {"approximate": args.approximate}


class SoftmaxArgs(LayerArgs):
    op: Literal["softmax"]


class Softmax(_Unary):
    kind = "softmax"
    Args = SoftmaxArgs
    flops_per_element = 5
    elementwise = False  # normalises over the last dimension

    def costs(self, c):
        c.save("out", c.nbytes(c.out, c.out_axes))  # its backward needs the output, not the input


class DropoutArgs(LayerArgs):
    op: Literal["dropout"]
    rate: float = Field(0.1, ge=0, lt=1)


class Dropout(_Unary):
    kind = "dropout"
    Args = DropoutArgs
    random_sequence_parallel = True  # each rank keeps its positions of the whole sequence's mask
    random_context_parallel = True  # (over `context` too: its places' entries of the one-device mask)

    def attrs(self, args):
        return {"rate": args.rate}

    def is_random(self, attrs):
        return attrs["rate"] > 0

    def jax_parts(self, uses, program):
        # the random helpers, where some layer draws (rate > 0)
        return {"dropout_def": program["random"] if any(self.is_random(a) for a in uses) else []}

    def costs(self, c):
        c.save("mask", math.ceil(c.b * c.out.numel / c.deg(c.out_axes)) * MASK_BYTES)

    def pipeline_limit(self, attrs):
        return "dropout with a rate above 0 (masks per micro-batch and stage)" if attrs["rate"] > 0 else None


class _Nary(Op):
    arity = 0
    per_position = True

    def infer(self, args, inputs, size, ctx):
        first = inputs[0]
        for other in inputs[1:]:
            if other.shape != first.shape:
                raise OpError(
                    codes.E028,
                    f"{self.kind} needs inputs of one shape, got {first.show()} and {other.show()}",
                    "inputs",
                )
        for t in inputs:
            expect_float(t, self.kind)
        return OpResult(first, (), {"n": len(inputs)}, flops=(len(inputs) - 1) * first.numel)


class AddArgs(LayerArgs):
    op: Literal["add"]


class MulArgs(LayerArgs):
    op: Literal["mul"]


class Add(_Nary):
    kind = "add"
    Args = AddArgs


class Mul(_Nary):
    kind = "mul"
    Args = MulArgs

    def costs(self, c):
        c.save_inputs()  # each input's gradient needs the others
