"""gpt-pipe: the data, by global sample index, so every mesh sees the same batches in the same order."""

import jax
import numpy as np

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import BATCH_SIZE, CHUNK, GRAD_ACCUM, MICRO_BATCH, MICROBATCHES, SEED
from runtime.errors import require

# what the spec decided that only this file uses (the settings several files share: config.py)
# Model inputs in spec order: shape without the batch, dtype, and for integer inputs the exclusive upper
# bound of synthetic values (0 for float inputs).
INPUTS = {
    "tokens": ((32,), "int32", 256),
    "targets": ((32,), "int32", 256),
}
CHUNKS = GRAD_ACCUM * MICROBATCHES
DATA_SEED = SEED + 1


# ----------------------------------------------------------------------------
# Data by global sample index, so every mesh sees the same batches in the same order.
# A step's batch is laid out [CHUNKS, CHUNK, ...]: every device's rows of every micro-batch
# are already in place, and the accumulation loop moves no data.
# ----------------------------------------------------------------------------
class Data:
    """Samples by global index: every mesh sees the same batches in the same order."""

    def __init__(self, path=None, seed=None):
        # synthetic data is drawn from the parameters' seed + 1 (docs/program.md "Data")
        self.seed = DATA_SEED if seed is None else seed

    def sample(self, i):
        rng = np.random.default_rng([self.seed, i])
        out = {}
        for n, (shape, dtype, high) in INPUTS.items():
            out[n] = rng.integers(0, high, size=shape, dtype=np.int64).astype(dtype)
        return out

    def batch(self, start, count):
        """Samples start .. start+count-1, stacked per input."""
        samples = [self.sample(start + j) for j in range(count)]
        return {n: np.stack([s[n] for s in samples]) for n in INPUTS}


def micro_batch_start(step, micro):
    """First global sample index of micro-batch `micro` of optimizer step `step` (both 0-based)."""
    return step * BATCH_SIZE + micro * MICRO_BATCH


def local_rows(sharding, global_shape):
    """The rows (dimension 1: samples of a micro-batch) that this process's devices hold."""
    index = sharding.addressable_devices_indices_map(global_shape).values()
    rows = sorted({r for s in index for r in range(*s[1].indices(global_shape[1]))})
    require(
        rows == list(range(rows[0], rows[-1] + 1)),
        "this process's rows of the batch are not contiguous; put the batch axes first in the mesh",
    )
    return rows[0], rows[-1] + 1


def global_batch(data, step, shardings):
    """The batch of optimizer step `step` as global arrays. Each process reads only the samples of its
    own devices (docs/program.md "Data"); jax assembles the global arrays from the processes' parts."""
    out, cache = {}, {}
    for name, (shape, _, _) in INPUTS.items():
        global_shape = (CHUNKS, CHUNK, *shape)
        lo, hi = local_rows(shardings[name], global_shape)
        if (lo, hi) not in cache:
            # chunk k of the step: samples step * BATCH_SIZE + k * CHUNK ...
            cache[lo, hi] = [
                data.batch(micro_batch_start(step, 0) + k * CHUNK + lo, hi - lo)
                for k in range(CHUNKS)
            ]
        local = np.stack([micro[name] for micro in cache[lo, hi]])
        local = local.astype(jax.dtypes.canonicalize_dtype(local.dtype))  # int64: int32 unless x64
        out[name] = jax.make_array_from_process_local_data(shardings[name], local, global_shape)
    return out
