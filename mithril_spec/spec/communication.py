"""The `communication` section: how the gradients and parameters travel between devices (compression,
collective algorithm, bucket size, overlap, prefetch). Every field is optional: left out, the framework's
own default runs and the plan costs it (docs/spec.md "communication")."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, PositiveInt

from .common import Strict

# the dtype a cast compression sends, by its name
CAST_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


class PowerSGD(Strict):
    """Low-rank gradient compression (Vogels et al. 2019; torch's PowerSGD DDP communication hook)."""

    name: Literal["powersgd"]
    rank: PositiveInt = Field(1, description="rank of the approximation: each [n, m] gradient matrix travels as "
                              "[n, rank] and [m, rank] factors")
    start_step: Annotated[int, Field(ge=2)] = Field(
        1000, description="optimizer step from which gradients are compressed; the steps before it all-reduce "
        "them whole (PyTorch's start_powerSGD_iter; at least 2, as error feedback needs)")


Compression = Literal["none", "fp16", "bf16"] | PowerSGD


class Communication(Strict):
    compression: Compression = Field(
        "none", description="data-parallel gradient compression: `none`, `fp16` or `bf16` (gradients cast to that "
        "dtype for their reduction and back), or `{name: powersgd, rank: R}` (low-rank factors)")
    algorithm: Literal["auto", "ring", "tree"] = Field(
        "auto", description="collective algorithm (NCCL_ALGO): `ring`, `tree` (double binary tree) or `auto` (the "
        "library picks; the plan costs the cheaper of the two)")
    bucket_mb: PositiveFloat | None = Field(
        None, description="gradients reduced together, in MiB: DDP's bucket_cap_mb, XLA's collective combine "
        "thresholds (default: the framework's, 25 MiB in DDP)")
    overlap: bool | None = Field(
        None, description="overlap data-parallel communication with compute (XLA's latency-hiding scheduler; "
        "DDP and FSDP2 always do); the plan hides it behind compute when true (the default)")
    prefetch: PositiveInt | None = Field(
        None, description="fsdp: blocks whose parameters are all-gathered ahead of the one computing, forward "
        "and backward (FSDP2's set_modules_to_forward_prefetch / set_modules_to_backward_prefetch; default 1)")

    @property
    def cast_dtype(self) -> str | None:
        """The dtype a cast compression reduces in (None: no cast compression)."""
        return CAST_DTYPES.get(self.compression) if isinstance(self.compression, str) else None

    @property
    def powersgd(self) -> PowerSGD | None:
        return self.compression if isinstance(self.compression, PowerSGD) else None

    @property
    def compression_name(self) -> str:
        return self.compression if isinstance(self.compression, str) else self.compression.name
