"""The `model` section: typed inputs, reusable blocks, the sequential layer list and the loss."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag

from ..ops import OPS, CrossEntropy, Mse
from .common import Ident, Size, Strict


class Input(Strict):
    shape: list[Size] = Field(description="`batch` first, then sizes or dim names, e.g. [batch, seq]")
    dtype: Literal["float32", "bfloat16", "float16", "int32", "int64"] = "float32"
    axes: Optional[list[Optional[Ident]]] = Field(None, description="logical axis names, one per dimension")


class Repeat(Strict):
    """`{repeat: N, block: NAME, name: NAME}`: N copies of a block, each feeding the next."""

    repeat: Size
    block: Ident
    name: Ident
    input: Optional[Ident] = None
    stage: Optional[int] = Field(None, ge=0)
    device: Optional[int] = Field(None, ge=0, description="the device along the `pipe` axis of every copy")


def _layer_tag(v: Any) -> Optional[str]:
    if isinstance(v, dict):
        return "repeat" if "repeat" in v else v.get("op")
    return "repeat" if isinstance(v, Repeat) else getattr(v, "op", None)


Layer = Annotated[
    Union[tuple(Annotated[op.Args, Tag(kind)] for kind, op in OPS.items()) + (Annotated[Repeat, Tag("repeat")],)],
    Discriminator(_layer_tag),
]

Loss = Annotated[Union[CrossEntropy, Mse], Field(discriminator="op")]


class Model(Strict):
    inputs: dict[Ident, Input] = Field(min_length=1)
    blocks: dict[Ident, list[Layer]] = Field(default_factory=dict)
    layers: list[Layer] = Field(min_length=1)
    loss: Loss
