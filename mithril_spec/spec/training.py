"""The `training` section: batch, steps, optimizer, schedule, precision, remat, checkpoints."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from .common import Strict

Dtype = Literal["float32", "bfloat16", "float16"]


class AdamW(Strict):
    name: Literal["adamw"]
    lr: PositiveFloat
    betas: Annotated[list[Annotated[float, Field(ge=0, lt=1)]], Field(min_length=2, max_length=2)] = [0.9, 0.999]
    eps: PositiveFloat = 1e-8
    weight_decay: Annotated[float, Field(ge=0)] = 0.01


class Adam(Strict):
    name: Literal["adam"]
    lr: PositiveFloat
    betas: Annotated[list[Annotated[float, Field(ge=0, lt=1)]], Field(min_length=2, max_length=2)] = [0.9, 0.999]
    eps: PositiveFloat = 1e-8


class SGD(Strict):
    name: Literal["sgd"]
    lr: PositiveFloat
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
    nesterov: bool = False


Optimizer = Annotated[Union[AdamW, Adam, SGD], Field(discriminator="name")]


class Schedule(Strict):
    name: Literal["constant", "cosine", "linear-warmup", "noam"] = "constant"
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.0

    @model_validator(mode="after")
    def _noam_needs_warmup(self):
        if self.name == "noam" and self.warmup_steps < 1:
            raise ValueError("the noam schedule needs warmup_steps >= 1 (its formula divides by it)")
        return self


class Precision(Strict):
    params: Dtype = "float32"
    compute: Dtype = "float32"
    master_weights: bool = Field(
        False,
        description="keep a float32 master copy of 16-bit parameters in the optimizer state (mixed-precision "
        "training); the optimizer moments are then float32 too",
    )


class Checkpoint(Strict):
    dir: Annotated[str, Field(min_length=1, max_length=4096)] = "checkpoints"
    every: PositiveInt = 100


class Training(Strict):
    batch_size: PositiveInt = Field(description="global batch size (samples per optimizer step)")
    grad_accum: PositiveInt = 1
    steps: PositiveInt
    optimizer: Optimizer
    schedule: Schedule = Schedule()
    clip_grad_norm: PositiveFloat | None = None
    precision: Precision = Precision()
    remat: Literal["none", "selective", "full"] = "none"
    zero: Literal[0, 1, 2] = Field(
        0,
        description="ZeRO stage over the data-parallel axes: 1 shards the optimizer state, 2 also the gradients "
        "(stage 3, the parameters too, is the `fsdp` mesh axis)",
    )
    seed: Annotated[int, Field(ge=0, lt=2**31)] = 0
    checkpoint: Checkpoint | None = None
