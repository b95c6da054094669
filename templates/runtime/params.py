"""Parameters as every target starts them (docs/program.md "Initialisation"): initial values that depend
only on (seed, name, element), computed only for the slice a process holds; and the per-parameter tables
of a program, by canonical name (every_copy). Parameter files: param_files.py."""

import math
import zlib

import numpy as np


def slices(index, shape):
    """An index (slices of the leading dimensions) as one plain slice per dimension of `shape`."""
    return [slice(*s.indices(n)) for s, n in zip((*index, *[slice(None)] * len(shape)), shape)]


def init_values(name, shape, kind, std, seed, index=()):
    """The initial values of parameter `name` at `index` (slices, one per leading dimension; () for all),
    float32, of init `kind` (zeros, ones, normal with `std`). Each element depends only on (seed, name, its
    flat index), so any process computes just the slice it holds, and every mesh and every target starts
    from the same values."""
    box = slices(index, shape)
    out_shape = tuple(len(range(b.start, b.stop, b.step)) for b in box)
    if kind == "zeros":
        return np.zeros(out_shape, np.float32)
    if kind == "ones":
        return np.ones(out_shape, np.float32)
    # each element's flat index in the whole parameter, a chunk of the slice at a time
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    key = _mix(
        np.array([(seed * 0x9E3779B97F4A7C15 + zlib.crc32(name.encode())) & (2**64 - 1)], np.uint64)
    )
    n = math.prod(out_shape)
    out = np.empty(n, np.float32)
    for lo in range(0, n, 1 << 22):
        at = np.unravel_index(np.arange(lo, min(n, lo + (1 << 22))), out_shape) if shape else ()
        flat = np.zeros(min(n, lo + (1 << 22)) - lo, np.uint64)
        for pos, b, stride in zip(at, box, strides):
            flat += (pos.astype(np.uint64) * np.uint64(b.step) + np.uint64(b.start)) * np.uint64(
                stride
            )
        out[lo : lo + len(flat)] = _normal(key, flat)
    return (out.reshape(out_shape) * np.float32(std)).astype(np.float32)


def _mix(x):
    """splitmix64's finaliser: a well-mixed uint64 for each uint64 (arithmetic wraps around)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _normal(key, i):
    """Standard normal values (float32) for element indices `i` of the stream `key`: Box-Muller on two
    uniforms in (0, 1] drawn from the counters 2i and 2i + 1."""
    gamma = np.uint64(0x9E3779B97F4A7C15)
    u1 = ((_mix(key + (i * np.uint64(2)) * gamma) >> np.uint64(11)) + np.uint64(1)) * 2.0**-53
    u2 = (
        (_mix(key + (i * np.uint64(2) + np.uint64(1)) * gamma) >> np.uint64(11)) + np.uint64(1)
    ) * 2.0**-53
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)


class InitTensor:
    """A parameter's initial values, computed only where they are indexed: `tensor[index]` gives that
    slice, `np.asarray(tensor)` the whole parameter."""

    def __init__(self, name, shape, kind, std, seed):
        self.name, self.shape, self.ndim = name, tuple(shape), len(shape)
        self.kind, self.std, self.seed = kind, std, seed

    def __getitem__(self, index):
        return init_values(
            self.name,
            self.shape,
            self.kind,
            self.std,
            self.seed,
            index if isinstance(index, tuple) else (index,),
        )

    def __array__(self, dtype=None, copy=None):
        return self[()].astype(dtype or np.float32)


def initial_params(params, seed):
    """Every parameter of `params` ({canonical name: (shape, init kind, std)}) lazily: nothing is computed
    until a slice is asked for."""
    return {
        name: InitTensor(name, shape, kind, std, seed)
        for name, (shape, kind, std) in params.items()
    }


def every_copy(top, blocks, repeats):
    """A table by canonical name: `top` as it is, and each entry of `blocks` ({block: {name inside the
    block: entry}}, or {block: set of names}) once per copy of the block (`repeats`: {block: number of
    copies}; an entry that is a function gets the copy index)."""
    each = [
        (
            f"{r}.{i}.{k}",
            (rows[k](i) if callable(rows[k]) else rows[k]) if isinstance(rows, dict) else True,
        )
        for r, rows in blocks.items()
        for i in range(repeats[r])
        for k in rows
    ]
    if isinstance(top, set):
        return top | {name for name, _ in each}
    return {**top, **dict(each)}
