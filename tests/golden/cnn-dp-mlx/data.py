"""cnn-dp: the data, by global sample index (the same batches for every mesh and target)."""

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import BATCH_SIZE, MICRO_BATCH, SEED
from runtime.data import SyntheticData

# what the spec decided that only this file uses (the settings several files share: config.py)
# Model inputs in spec order: shape without the batch, dtype, and for integer inputs the exclusive upper
# bound of synthetic values (0 for float inputs).
INPUTS = {
    "images": ((3, 32, 32), "float32", 0),
    "labels": ((), "int32", 10),
}
DATA_SEED = SEED + 1


class Data(SyntheticData):
    """Samples by global index, drawn by runtime/data.py's SyntheticData: every mesh sees the same batches in
    the same order."""

    def __init__(self, path=None, seed=None):
        # synthetic data is drawn from the parameters' seed + 1 (docs/program.md "Data")
        super().__init__(INPUTS, DATA_SEED if seed is None else seed)


def micro_batch_start(step, micro):
    """First global sample index of micro-batch `micro` of optimizer step `step` (both 0-based)."""
    return step * BATCH_SIZE + micro * MICRO_BATCH
