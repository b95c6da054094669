"""Gradient compression (`communication.compression`): the bytes a parameter's gradient sends in its
data-parallel reduction (docs/cost-model.md "Compression").

- `fp16` / `bf16`: every element in 2 bytes (a gradient already that narrow is unchanged);
- `powersgd` with rank r: a gradient viewed as a matrix [n, m] (n its first dimension, m the rest) travels
  as the factors P [n, r'] and Q [m, r'] (r' = min(n, m, r)), when that is worth it, `(n + m) r' * 2 < n m`
  (PyTorch's min_compression_rate 2); otherwise, vectors (biases, norm weights) included, whole.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..sizes import DTYPE_BYTES

if TYPE_CHECKING:
    from ...spec.communication import Communication

MIN_COMPRESSION_RATE = 2  # PowerSGDState's default: compress a matrix only if that sends under half


def powersgd_elements(shape: tuple[int, ...], rank: int) -> int:
    """Elements one gradient of `shape` sends under PowerSGD of `rank`."""
    numel = math.prod(shape)
    rows = shape[0] if shape else 1
    cols = numel // rows if rows else 0
    r = min(rows, cols, rank)
    small = (rows + cols) * r
    return small if small * MIN_COMPRESSION_RATE < numel else numel


def gradient_bytes(comm: Communication, shape: tuple[int, ...], dtype_bytes: int) -> int:
    """Bytes the data-parallel reduction of one gradient of `shape` (elements of `dtype_bytes`) sends."""
    cast = comm.cast_dtype
    if cast is not None:
        return math.prod(shape) * min(dtype_bytes, DTYPE_BYTES[cast])
    if comm.powersgd is not None:
        return powersgd_elements(shape, comm.powersgd.rank) * dtype_bytes
    return math.prod(shape) * dtype_bytes


def label(comm: Communication) -> str:
    """How the plan's text names a compressed reduction."""
    ps = comm.powersgd
    return f"PowerSGD rank {ps.rank} from step {ps.start_step}" if ps else f"{comm.compression_name}-compressed"
