"""gpt-pipe: the data, by global sample index, so every mesh sees the same batches in the same order."""

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import BATCH_SIZE, CHUNK, GRAD_ACCUM, MICRO_BATCH, MICROBATCHES, SEED
from runtime.data import SyntheticData
from runtime.jax.batches import batch_arrays

# what the spec decided that only this file uses (the settings several files share: config.py)
# Model inputs in spec order: shape without the batch, dtype, and for integer inputs the exclusive upper
# bound of synthetic values (0 for float inputs).
INPUTS = {
    "tokens": ((32,), "int32", 256),
    "targets": ((32,), "int32", 256),
}
CHUNKS = GRAD_ACCUM * MICROBATCHES
DATA_SEED = SEED + 1


# Data by global sample index; a step's batch, [CHUNKS, CHUNK, ...], as global arrays (runtime/jax/batches.py).
class Data(SyntheticData):
    """Samples by global index, drawn by runtime/data.py's SyntheticData: every mesh sees the same batches in
    the same order."""

    def __init__(self, path=None, seed=None):
        # synthetic data is drawn from the parameters' seed + 1 (docs/program.md "Data")
        super().__init__(INPUTS, DATA_SEED if seed is None else seed)


def micro_batch_start(step, micro):
    """First global sample index of micro-batch `micro` of optimizer step `step` (both 0-based)."""
    return step * BATCH_SIZE + micro * MICRO_BATCH


def global_batch(data, step, shardings):
    """The batch of optimizer step `step` as global arrays, each process reading only its devices' samples
    (runtime/jax/batches.py)."""
    # chunk k of the step: samples step * BATCH_SIZE + k * CHUNK ...
    starts = [micro_batch_start(step, 0) + k * CHUNK for k in range(CHUNKS)]
    return batch_arrays(data, INPUTS, starts, CHUNK, shardings)
