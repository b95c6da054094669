"""The operator registry: `OPS[kind]` gives the operator for a layer's `op`."""

from __future__ import annotations

from .attention import Attention
from .base import LayerArgs, Op, OpError, OpResult, ParamDef, TensorType
from .conv import AvgPool2d, Conv1d, Conv2d, MaxPool2d
from .elementwise import Add, Dropout, Gelu, Mul, Relu, Sigmoid, Silu, Softmax, Tanh
from .embedding import Embedding, PosEmbedding
from .linear import Linear
from .loss import LOSSES, CrossEntropy, Loss, Mse
from .mlp import Mlp
from .moe import Moe
from .norm import BatchNorm, LayerNorm, RmsNorm
from .reshape import Concat, Flatten, Reshape, Split

_ALL: list[type[Op]] = [
    Linear, Relu, Gelu, Silu, Tanh, Sigmoid, Softmax, Dropout, Add, Mul, Reshape, Flatten, Concat, Split,
    Conv1d, Conv2d, MaxPool2d, AvgPool2d, BatchNorm, LayerNorm, RmsNorm, Embedding, PosEmbedding,
    Attention, Mlp, Moe,
]  # fmt: skip

OPS: dict[str, Op] = {cls.kind: cls() for cls in _ALL}

__all__ = ["OPS", "LOSSES", "Loss", "Op", "OpError", "OpResult", "ParamDef", "TensorType", "LayerArgs", "CrossEntropy", "Mse"]
