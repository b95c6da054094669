"""A JAX program's batches as global arrays: each process reads only the samples of its own devices
(docs/program.md "Data") and jax assembles the global arrays from the processes' parts. A step's batch is
laid out [chunks, rows, ...]: every device's rows of every micro-batch are already in place, and the
accumulation loop moves no data."""

import jax
import numpy as np

from runtime.errors import require


def local_rows(sharding, global_shape):
    """The rows (dimension 1: samples of a micro-batch) that this process's devices hold."""
    index = sharding.addressable_devices_indices_map(global_shape).values()
    rows = sorted({r for s in index for r in range(*s[1].indices(global_shape[1]))})
    require(
        rows == list(range(rows[0], rows[-1] + 1)),
        "this process's rows of the batch are not contiguous; put the batch axes first in the mesh",
    )
    return rows[0], rows[-1] + 1


def batch_arrays(data, inputs, starts, rows, shardings, order=None):
    """The global arrays {input: [len(starts), rows, ...]} of the micro-batches whose first global sample
    indices are `starts`, from `data` (data.batch(first, count): samples by global index, stacked per input;
    `inputs`: {input: (shape without the batch, ...)}), laid out by `shardings`. `order(length)`: the order
    of positions a sequence is held in (context parallelism), if not its own."""
    out, cache = {}, {}
    for name, (shape, *_) in inputs.items():
        global_shape = (len(starts), rows, *shape)
        lo, hi = local_rows(shardings[name], global_shape)
        if (lo, hi) not in cache:
            cache[lo, hi] = [data.batch(start + lo, hi - lo) for start in starts]
        local = np.stack([micro[name] for micro in cache[lo, hi]])
        if order is not None:  # the sequence in the order context parallelism holds it
            local = local[:, :, order(local.shape[2])]
        local = local.astype(jax.dtypes.canonicalize_dtype(local.dtype))  # int64: int32 unless x64
        out[name] = jax.make_array_from_process_local_data(shardings[name], local, global_shape)
    return out
