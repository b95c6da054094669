"""The `training` section: batch, steps, optimizer, schedule, precision, remat, checkpoints, offload."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

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


# A loss scale must be a float32 number (the programs keep it as one): at most 2^127.
MAX_LOSS_SCALE = 2.0**127


class Scaler(Strict):
    """The dynamic loss scaler's settings (torch.amp.GradScaler's rule and defaults)."""

    init_scale: Annotated[float, Field(gt=0, le=MAX_LOSS_SCALE)] = Field(
        2.0**16, description="the loss scale of the first step"
    )
    growth_factor: Annotated[float, Field(gt=1, le=MAX_LOSS_SCALE)] = Field(
        2.0, description="the scale is multiplied by it after `growth_interval` steps in a row with finite gradients"
    )
    backoff_factor: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.5, description="the scale is multiplied by it after a step with non-finite gradients (which is skipped)"
    )
    growth_interval: PositiveInt = Field(2000, description="finite steps in a row before the scale grows")


LossScale = Literal["dynamic", "none"] | Annotated[float, Field(gt=0, le=MAX_LOSS_SCALE)]


class Precision(Strict):
    params: Dtype = "float32"
    compute: Dtype = "float32"
    master_weights: bool = Field(
        False,
        description="keep a float32 master copy of 16-bit parameters in the optimizer state (mixed-precision "
        "training); the optimizer moments are then float32 too",
    )
    tf32: bool = Field(
        True,
        description="on GPUs, float32 matmuls and convolutions in TensorFloat-32 (inputs rounded to a 10-bit "
        "mantissa, float32 accumulation; several times faster on Ampere and Hopper); false: full float32. "
        "No effect on CPUs, nor on 16-bit compute",
    )
    float8: bool = Field(
        False,
        description="the torch target only: train the linear layers (`linear`, and the q/k/v/o projections of "
        "`attention` and the projections of `mlp`) in FP8 through torchao.float8 (`convert_to_float8_training`, "
        "dynamic tensorwise scaling); a layer whose in or out features are not multiples of 16 stays in the "
        "compute dtype, as do tied linear layers and moe layers. Needs a device with FP8 matmuls (compute "
        "capability 8.9 or above: H100, H200); elsewhere the program emulates them (docs/spec.md \"Precision\")",
    )
    loss_scale: LossScale | None = Field(
        None,
        description="float16 compute only: `dynamic` (the default there: the scale adapts, steps with non-finite "
        "gradients are skipped), a fixed positive number (such steps are skipped too), or `none` (no scaling)",
    )
    scaler: Scaler | None = Field(
        None, description="the dynamic loss scale's settings (`loss_scale: dynamic`, float16 compute only)"
    )

    @field_validator("loss_scale", mode="wrap")
    @classmethod
    def _loss_scale(cls, value, handler: ValidatorFunctionWrapHandler, info: ValidationInfo):
        try:
            value = handler(value)
        except ValidationError:  # one message for the union (not one per member)
            raise ValueError("expected `dynamic`, `none` or a number > 0 and <= 2^127") from None
        compute = info.data.get("compute")
        if value not in (None, "none") and compute not in (None, "float16"):
            raise ValueError(f"loss scaling is for float16 compute, and `precision.compute` is {compute}: "
                             "leave `loss_scale` out (or write `none`)")
        return value

    @field_validator("scaler")
    @classmethod
    def _scaler_needs_dynamic(cls, value, info: ValidationInfo):
        if value is None or "compute" not in info.data or "loss_scale" not in info.data:
            return value  # (or an error in one of those already)
        if info.data["compute"] != "float16":
            raise ValueError(f"the loss scaler is for float16 compute, and `precision.compute` is "
                             f"{info.data['compute']}: leave `scaler` out")
        if info.data["loss_scale"] not in (None, "dynamic"):
            raise ValueError(f"`scaler` sets a dynamic loss scale, and `loss_scale` is "
                             f"{info.data['loss_scale']!r}: write `loss_scale: dynamic` or leave `scaler` out")
        return value

    def loss_scaling(self) -> dict | None:
        """What the generated programs run: None (no loss scaling), or `dynamic` (bool) and the scaler's
        settings (a fixed scale: `init_scale` only matters, it never changes)."""
        if self.compute != "float16" or self.loss_scale == "none":
            return None
        if self.loss_scale in (None, "dynamic"):
            return {"dynamic": True, **(self.scaler or Scaler()).model_dump()}
        return {"dynamic": False, **Scaler(init_scale=float(self.loss_scale)).model_dump()}


class Checkpoint(Strict):
    dir: Annotated[str, Field(min_length=1, max_length=4096)] = "checkpoints"
    every: PositiveInt = 100


class Offload(Strict):
    """Activations moved to host memory between the forward and the backward pass (Mithril's
    `activation_offload` / `offload_threshold`)."""

    activations: bool = Field(
        False, description="move the tensors the forward pass saves for the backward pass to host memory, and back "
        "for the backward pass"
    )
    threshold: Annotated[int, Field(ge=0, le=2**62)] = Field(
        1_000_000, description="only saved tensors of at least this many elements (per device) move; smaller "
        "ones stay on the device"
    )


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
    offload: Offload | None = Field(
        None, description="activation offload: `{activations: true, threshold: N}` (docs/spec.md \"Activation offload\")"
    )

    def offload_threshold(self) -> int | None:
        """Saved tensors of at least this many elements go to host memory; None: no activation offload."""
        return self.offload.threshold if self.offload is not None and self.offload.activations else None
