"""The `pipeline` section: pipeline parallelism over the `pipe` mesh axis."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from .common import Strict


class Pipeline(Strict):
    """Stages live on the `pipe` mesh axis (pipe x virtual_stages stages in all). Layers are split into
    stages by their explicit `stage:` fields, or else the repeated blocks are split evenly, with the layers
    before them on the first stage and the layers after them on the last."""

    microbatches: PositiveInt = Field(description="micro-batches each optimizer step is split into")
    schedule: Literal["gpipe", "1f1b", "interleaved"] = "gpipe"
    virtual_stages: PositiveInt = Field(1, description="stages per pipe rank (interleaved schedule only)")
