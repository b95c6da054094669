"""Data that does not depend on the spec (docs/program.md "Data"): synthetic samples by global index, and the
checks of a token file on disk; the spec's Data (data.py) reads the samples."""

import json
import os

import numpy as np

from .errors import require


def check_token_file(path, ids, flag, vocab, dtype):
    """The token file against the spec before any step (docs/program.md "Data"): not a .npy file (its header
    would be read as ids), ids of the spec's width (`dtype`, the spec's data.dtype; the dtype data.json
    beside the file records, else a guess from the first ids: 32- or 64-bit ids read as 16-bit ones leave
    every other value 0), and a tokenizer whose vocabulary fits the model's embedding (`vocab`, from
    data.json)."""
    spec_dtype = np.dtype(dtype).name
    require(
        bytes(ids[:8].view(np.uint8)[:6]) != b"\x93NUMPY",
        f"{flag}: {path} is a .npy file (it starts with the .npy header), not flat token ids: write them "
        f"raw (np.asarray(ids, np.{spec_dtype}).tofile(path)) or with `mithril-spec data prepare`",
    )
    meta_file = os.path.join(os.path.dirname(path), "data.json")
    meta = None
    if os.path.isfile(meta_file):
        try:
            with open(meta_file, encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            meta = None
    if isinstance(meta, dict) and meta.get("dtype") in ("uint16", "uint32"):
        require(
            meta["dtype"] == spec_dtype,
            f"{flag}: {path} holds {meta['dtype']} ids ({meta_file}) but the spec reads {spec_dtype} "
            f"(data.dtype): set data.dtype: {meta['dtype']}",
        )
        v = meta.get("vocab")
        require(
            vocab is None or not isinstance(v, int) or v <= vocab,
            f"{flag}: {path} comes from a tokenizer of {v} ids ({meta_file}) but the model takes ids "
            f"below {vocab} (its vocab): set the spec's vocab to {v} or more, or prepare the data with "
            "the model's tokenizer (mithril-spec data prepare --tokenizer MODEL_DIR)",
        )
        return
    head = np.asarray(ids[: 1 << 12]).astype(np.int64)
    if len(head) >= 64 and head[0::2].any() and not head[1::2].any():
        wide = "64-bit" if spec_dtype == "uint32" or not head[2::4].any() else "32-bit"
        require(
            False,
            f"{flag}: {path} looks like {wide} ids read as {spec_dtype} (data.dtype): every other value "
            f"is 0; write {spec_dtype} ids (np.asarray(ids, np.{spec_dtype}).tofile(path)) or set "
            "data.dtype",
        )


class SyntheticData:
    """Synthetic samples by global index, so every mesh sees the same batches in the same order: sample `i`
    draws each input in turn (`inputs`: name -> (shape without the batch, dtype, high)) from numpy's
    generator seeded with (seed, i): integers in [0, high), or standard normal values where high is 0."""

    def __init__(self, inputs, seed):
        self.inputs, self.seed = inputs, seed

    def sample(self, i):
        rng = np.random.default_rng([self.seed, i])
        out = {}
        for n, (shape, dtype, high) in self.inputs.items():
            if high:
                out[n] = rng.integers(0, high, size=shape, dtype=np.int64).astype(dtype)
            else:
                out[n] = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        return out

    def batch(self, start, count):
        """Samples start .. start+count-1, stacked per input."""
        samples = [self.sample(start + j) for j in range(count)]
        return {n: np.stack([s[n] for s in samples]) for n in self.inputs}
