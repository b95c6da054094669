"""The whole spec."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, PositiveInt, StrictInt

from ..targets import DEFAULT_TARGETS, TARGET_NAMES
from .common import Ident, Strict
from .communication import Communication
from .data import Data, Eval, Synthetic
from .hardware import Hardware
from .hf import HfSource
from .model import Model
from .pipeline import Pipeline
from .sharding import Mesh, Sharding
from .training import Training


class Spec(Strict):
    version: StrictInt = Field(description="spec language version; always 1")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)
    extends: Optional[str] = Field(None, description="base spec merged under this one (relative path)")
    description: Optional[str] = None
    targets: list[Literal[TARGET_NAMES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(DEFAULT_TARGETS), min_length=1,
        description="targets this spec is built for (default: " + ", ".join(DEFAULT_TARGETS) + ")",
    )
    dims: dict[Ident, Annotated[StrictInt, Field(ge=1)]] = Field(default_factory=dict, description="named sizes")
    model: Model
    mesh: Optional[Mesh] = Field(None, description="axis -> size; axes: pipe, data, fsdp, expert, context, tensor")
    meshes: Optional[dict[Ident, Mesh]] = Field(None, description="named meshes; the first is the default")
    devices: Optional[PositiveInt] = Field(None, description="device count the mesh must use")
    sharding: Sharding = Sharding()
    pipeline: Optional[Pipeline] = Field(None, description="pipeline parallelism over the `pipe` mesh axis")
    training: Training
    communication: Communication = Field(
        Communication(), description="gradient compression, collective algorithm, bucket size, overlap, prefetch"
    )
    data: Data = Synthetic(kind="synthetic")
    eval: Optional[Eval] = Field(None, description="held-out evaluation: its data, how often, how many batches")
    hf: Optional[HfSource] = Field(None, description="the Hugging Face model this spec was imported from")
    hardware: Optional[list[Hardware]] = Field(
        None, description="device profiles for `plan --hardware NAME` (besides the built-in ones)"
    )
