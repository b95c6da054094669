"""The `mesh`/`meshes` and `sharding` sections."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field, StrictStr

from ..axes import MESH_AXES  # noqa: F401 (re-exported: the canonical order)
from .common import IDENT_PATTERN, Strict


AxisName = StrictStr
MeshAxes = Union[AxisName, list[AxisName]]
# One entry per tensor dimension: a mesh axis, several mesh axes, or null (replicated).
Layout = list[Union[AxisName, list[AxisName], None]]
Mesh = dict[Annotated[str, Field(pattern=IDENT_PATTERN)], Annotated[int, Field(ge=1)]]


class Sharding(Strict):
    rules: Union[dict[StrictStr, MeshAxes], list[Annotated[list[Union[StrictStr, list[StrictStr]]], Field(min_length=2, max_length=2)]]] = Field(
        default_factory=dict,
        description="logical axis -> mesh axis or axes (a mapping, or a list of [logical, mesh] pairs)",
    )
    params: dict[StrictStr, Layout] = Field(
        default_factory=dict, description="parameter-name glob -> explicit layout (one entry per dimension)"
    )
    inputs: dict[StrictStr, Layout] = Field(
        default_factory=dict, description="model input name -> explicit layout (one entry per dimension)"
    )
