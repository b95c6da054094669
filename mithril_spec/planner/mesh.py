"""Choosing the mesh: the spec's `mesh`, one of its named `meshes`, or a `--mesh` override."""

from __future__ import annotations

import dataclasses
import re

from .. import codes
from ..axes import MESH_AXES, ParallelDims
from ..diagnostics import Diagnostic, DiagnosticError, Label, did_you_mean
from ..source import Document
from ..spec.root import Spec


class UsageError(Exception):
    """Bad command-line input (exit code 2), as opposed to a bad spec (exit code 1)."""


@dataclasses.dataclass(frozen=True)
class Mesh(ParallelDims):
    """The mesh a plan is for: the size of every axis (ParallelDims: `mesh.tensor`, `mesh.tensor_enabled`,
    `mesh.axes`, `mesh.devices`, `mesh.degree(axes)`), its name and where it is defined."""

    name: str
    sizes: dict[str, int]  # every known axis, 1 when absent
    source: tuple  # spec path of the mesh definition ("cli" when given on the command line)

    def describe(self) -> str:
        return ", ".join(f"{a}={self.sizes[a]}" for a in self.axes) or "a single device"


_OVERRIDE = re.compile(r"^\s*([A-Za-z_]+)\s*=\s*([0-9]+)\s*$")  # (ASCII digits: `\d` takes any script's)


def parse_override(text: str) -> dict[str, int]:
    """`data=4,tensor=2` -> {"data": 4, "tensor": 2}; raises UsageError."""
    out: dict[str, int] = {}
    for part in text.split(","):
        m = _OVERRIDE.match(part)
        if not m:
            raise UsageError(f"--mesh: cannot read {part.strip()!r}; expected AXIS=SIZE[,AXIS=SIZE...] or a mesh name")
        axis, size = m.group(1), int(m.group(2))
        if axis not in MESH_AXES:
            hint = did_you_mean(axis, MESH_AXES) or ""
            raise UsageError(f"--mesh: unknown mesh axis `{axis}` ({', '.join(MESH_AXES)}) {hint}".strip())
        if size < 1:
            raise UsageError(f"--mesh: size of `{axis}` must be at least 1")
        if axis in out:
            raise UsageError(f"--mesh: axis `{axis}` given twice")
        out[axis] = size
    return out


def select_mesh(spec: Spec, doc: Document, choice: str | None) -> Mesh:
    """The mesh to plan for. `choice` is a mesh name, an `AXIS=SIZE,...` override, or None (the default)."""
    if spec.mesh is not None and spec.meshes is not None:
        # At the one the spec adds to its base's (through `extends`), or else at the later one; a label on the other
        at = {k: doc.pos((k,), key=True) for k in ("mesh", "meshes")}
        mine = [k for k in at if at[k].file == doc.file]
        second = mine[0] if len(mine) == 1 else max(at, key=lambda k: (at[k].line, at[k].col))
        first = "meshes" if second == "mesh" else "mesh"
        raise DiagnosticError([Diagnostic(
            codes.E047, "give either `mesh` or `meshes`, not both", at[second],
            help="`mesh` is one mesh; `meshes` names several (the first is the default): keep one of them",
            labels=(Label(at[first], f"`{first}` is given here"),))])
    named: dict[str, tuple[dict[str, int], tuple]] = {}
    if spec.meshes is not None:
        if not spec.meshes:
            raise DiagnosticError([Diagnostic(codes.E047, "`meshes` is empty", doc.pos(("meshes",)))])
        named = {k: (dict(v), ("meshes", k)) for k, v in spec.meshes.items()}
    elif spec.mesh is not None:
        named = {"default": (dict(spec.mesh), ("mesh",))}
    diags = []
    for _, (axes, path) in named.items():
        for axis in axes:
            if axis not in MESH_AXES:
                diags.append(
                    Diagnostic(
                        codes.E040,
                        f"unknown mesh axis `{axis}`",
                        doc.pos(path + (axis,), key=True),
                        help=did_you_mean(axis, MESH_AXES),
                        notes=(f"mesh axes have fixed roles: {', '.join(MESH_AXES)}",),
                    )
                )
    if diags:
        raise DiagnosticError(diags)

    if choice is not None and "=" in choice:
        sizes = parse_override(choice)
        return Mesh("cli", {a: sizes.get(a, 1) for a in MESH_AXES}, ("cli",))
    if not named:
        if choice is not None:
            raise UsageError(f"--mesh {choice}: the spec defines no named meshes")
        # No mesh at all: one device.
        return Mesh("default", {a: 1 for a in MESH_AXES}, ())
    if choice is None:
        choice = next(iter(named))
    if choice not in named:
        hint = did_you_mean(choice, named) or ""
        raise UsageError(f"--mesh: the spec has no mesh named `{choice}` ({', '.join(named)}) {hint}".strip())
    axes, path = named[choice]
    return Mesh(choice, {a: axes.get(a, 1) for a in MESH_AXES}, path)
