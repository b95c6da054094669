"""The mesh axes and the typed mesh over them, defined once at the bottom of the package (the spec language,
the target registry, the planner, the lowerings and the renderers all read them from here).

Each axis has a fixed role (docs/spec.md "Mesh"): `pipe` (pipeline stages), `data` (replicas of the model:
the batch split), `fsdp` (the batch split, parameters and optimizer state sharded: ZeRO-3), `expert` (the
experts of moe layers; the batch split too), `context` (the sequence split: ring attention) and `tensor`
(layers split: Megatron / GSPMD). `ParallelDims` is torchtitan's object of the same name: the size of every
axis and what each enables, so that code asks `mesh.tensor_enabled` rather than
`mesh.sizes.get("tensor", 1) > 1`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

PIPE = "pipe"
DATA = "data"
FSDP = "fsdp"
EXPERT = "expert"
CONTEXT = "context"
TENSOR = "tensor"

MESH_AXES: tuple[str, ...] = (PIPE, DATA, FSDP, EXPERT, CONTEXT, TENSOR)  # canonical order, outermost first


class ParallelDims:
    """The size of every mesh axis (`sizes`, 1 for an axis the mesh does not name) and what each enables.
    A mixin over a `sizes` mapping: `planner.mesh.Mesh` is one (with the mesh's name and where the spec
    defines it), `Dims` a bare one."""

    sizes: Mapping[str, int]

    def size(self, axis: str) -> int:
        """The size of `axis` (1: not split over)."""
        return self.sizes.get(axis, 1)

    @property
    def pipe(self) -> int:
        return self.size(PIPE)

    @property
    def data(self) -> int:
        return self.size(DATA)

    @property
    def fsdp(self) -> int:
        return self.size(FSDP)

    @property
    def expert(self) -> int:
        return self.size(EXPERT)

    @property
    def context(self) -> int:
        return self.size(CONTEXT)

    @property
    def tensor(self) -> int:
        return self.size(TENSOR)

    @property
    def pipe_enabled(self) -> bool:
        return self.pipe > 1

    @property
    def data_enabled(self) -> bool:
        return self.data > 1

    @property
    def fsdp_enabled(self) -> bool:
        return self.fsdp > 1

    @property
    def expert_enabled(self) -> bool:
        return self.expert > 1

    @property
    def context_enabled(self) -> bool:
        return self.context > 1

    @property
    def tensor_enabled(self) -> bool:
        return self.tensor > 1

    @property
    def axes(self) -> tuple[str, ...]:
        """The axes that split something (size > 1), in canonical order."""
        return tuple(a for a in MESH_AXES if self.size(a) > 1)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.size(a) for a in self.axes)

    @property
    def devices(self) -> int:
        return math.prod(self.sizes.values())

    def degree(self, axes: Iterable[str]) -> int:
        """The product of the sizes of `axes` (how many ways they split together)."""
        return math.prod(self.size(a) for a in axes)


@dataclasses.dataclass(frozen=True)
class Dims(ParallelDims):
    """A bare ParallelDims: the sizes alone."""

    sizes: Mapping[str, int]
