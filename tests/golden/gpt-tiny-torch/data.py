"""gpt-tiny: the data, by global sample index, so every mesh sees the same batches in the same order."""

import numpy as np
import torch

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import BATCH_SIZE, MICRO_BATCH, SEED
from runtime.data import SyntheticData

# what the spec decided that only this file uses (the settings several files share: config.py)
# Model inputs in spec order: shape without the batch, dtype, and for integer inputs the exclusive upper
# bound of synthetic values (0 for float inputs).
INPUTS = {
    "tokens": ((64,), "int32", 256),
    "targets": ((64,), "int32", 256),
}
DATA_SEED = SEED + 1


# ----------------------------------------------------------------------------
# Data by global sample index, so every mesh sees the same batches in the same order. A data-parallel
# rank reads only its contiguous slice of each micro-batch.
class Data(SyntheticData):
    """Samples by global index, drawn by runtime/data.py's SyntheticData: every mesh sees the same batches in
    the same order."""

    def __init__(self, path=None, seed=None):
        # synthetic data is drawn from the parameters' seed + 1 (docs/program.md "Data")
        super().__init__(INPUTS, DATA_SEED if seed is None else seed)


def micro_batch_start(step, micro):
    """First global sample index of micro-batch `micro` of optimizer step `step` (both 0-based)."""
    return step * BATCH_SIZE + micro * MICRO_BATCH


def to_tensors(arrays, device):
    """numpy -> torch, in INPUTS order; integer inputs as int64 (what embeddings and losses index with)."""
    out = []
    for name in INPUTS:
        t = torch.from_numpy(np.ascontiguousarray(arrays[name]))
        out.append((t.long() if not t.is_floating_point() else t).to(device))
    return out
