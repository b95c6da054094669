"""Types shared by the spec sections."""

from __future__ import annotations

import keyword
from typing import Annotated, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr

IDENT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"



def _not_keyword(name: str) -> str:
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise ValueError(f"`{name}` is a Python keyword and cannot name anything in the generated program")
    return name


# A name that becomes a Python identifier in generated code (layer, block, input, dim names).
Ident = Annotated[str, Field(pattern=IDENT_PATTERN, max_length=64), AfterValidator(_not_keyword)]

# A size: a positive integer, a dim name, or arithmetic on dims (`4*d`, `d/heads`).
Size = Annotated[
    Union[StrictInt, StrictStr],
    Field(description="positive integer, dim name, or arithmetic on dim names such as `4*d`"),
]


class Strict(BaseModel):
    """Base of every spec section: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
