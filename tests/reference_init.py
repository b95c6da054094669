"""The documented initialisation (docs/program.md "Initialisation"), written out independently of the
programs' templates: whole parameters, element by element index, with Python integers for the hashing."""

from __future__ import annotations

import math
import zlib

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def _mix(x: np.ndarray) -> np.ndarray:
    x = x.astype(object)  # Python integers: exact modular arithmetic, independent of numpy's wrapping
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def normal(name: str, shape: tuple[int, ...], std: float, seed: int) -> np.ndarray:
    n = math.prod(shape)
    key = int(_mix(np.array([(seed * GOLDEN + zlib.crc32(name.encode())) & M64], dtype=object))[0])
    i = np.arange(n, dtype=object)
    u1 = ((_mix((key + 2 * i * GOLDEN) & M64) >> 11) + 1).astype(np.float64) * 2.0**-53
    u2 = ((_mix((key + (2 * i + 1) * GOLDEN) & M64) >> 11) + 1).astype(np.float64) * 2.0**-53
    z = (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)
    return (z * np.float32(std)).astype(np.float32).reshape(shape)


def init(name: str, shape: tuple[int, ...], kind: str, std: float, seed: int = 0) -> np.ndarray:
    if kind == "zeros":
        return np.zeros(shape, np.float32)
    if kind == "ones":
        return np.ones(shape, np.float32)
    return normal(name, shape, std, seed)
