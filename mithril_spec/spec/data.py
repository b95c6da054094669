"""The `data` section (where the training samples come from) and the `eval` section (held-out samples and
how often the program evaluates on them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from .common import Strict


class Synthetic(Strict):
    kind: Literal["synthetic"]


class Arrays(Strict):
    """One `.npy` file per model input in a directory, sample axis first (memory-mapped)."""

    kind: Literal["arrays"]
    path: Annotated[str, Field(min_length=1, max_length=4096)]


class Text(Strict):
    """A text file read as bytes: character-level tokens, vocab 256."""

    kind: Literal["text"]
    path: Annotated[str, Field(min_length=1, max_length=4096)]



Path = Annotated[str, Field(min_length=1, max_length=4096)]


class Tokens(Strict):
    """A flat binary file of token ids (nanoGPT's `train.bin`): windows of seq + 1 tokens, each window once per
    epoch in a seeded order. `mithril-spec data prepare` writes such files and their tokenizer."""

    kind: Literal["tokens"]
    path: Path
    dtype: Literal["uint16", "uint32"] = Field("uint16", description="the file's integer type")
    tokenizer: Path | None = Field(None, description="tokenizer.json of the ids (for sampling)")
    mask: Path | None = Field(None, description="a loss mask: one uint8 per id of `path` (1: the loss counts "
                              "predicting this id, 0: it does not), as `data prepare --format` writes it")


Data = Annotated[Synthetic | Arrays | Text | Tokens, Field(discriminator="kind")]


class Eval(Strict):
    """Held-out evaluation: samples from `path` (data of the training data's kind), or the last `split` of the
    training data's samples (held out of training), or, for synthetic data, draws of their own."""

    path: Path | None = Field(None, description="held-out data of the same kind as `data`")
    split: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        None, description="hold out this fraction of the training data (its last samples) instead of a `path`")
    every: Annotated[int, Field(ge=0)] = Field(0, description="steps between evaluations (0: only after the last)")
    batches: PositiveInt = Field(1, description="batches of `training.batch_size` samples per evaluation")

    @model_validator(mode="after")
    def _one_source(self):
        if self.path is not None and self.split is not None:
            raise ValueError("give either `path` (held-out data) or `split` (a fraction of the training data), "
                             "not both")
        return self
