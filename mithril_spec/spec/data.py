"""The `data` section: where the training samples come from."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

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


Data = Annotated[Union[Synthetic, Arrays, Text], Field(discriminator="kind")]
