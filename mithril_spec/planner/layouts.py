"""Layouts: logical-axis rules and per-parameter globs -> a partition spec for every parameter and input.

A partition spec has one entry per tensor dimension: a tuple of mesh axes that dimension is split over
(empty: replicated). Only mesh axes of size > 1 appear. The order of checks:

1. rules (logical axis -> mesh axes), with unknown axes and conflicting rules reported;
2. explicit `sharding.params` globs replace a parameter's whole layout (conflicts and globs that match
   nothing reported);
3. the fsdp axis shards every parameter (ZeRO-3): a parameter that no rule shards over fsdp is sharded
   on its first dimension that divides;
4. checks: a mesh axis used twice in one layout, sizes that do not divide.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Optional

from .. import codes
from ..axes import MESH_AXES
from ..diagnostics import Diagnostic, did_you_mean
from ..graph import Graph, Param
from ..source import Document
from ..spec.root import Spec
from .mesh import Mesh

PSpec = tuple[tuple[str, ...], ...]
DEFAULT_BATCH_AXES = ("data", "fsdp", "expert")
DEFAULT_RULES = {"experts": ("expert",)}  # rules that apply unless the spec gives its own


@dataclasses.dataclass(frozen=True)
class Rules:
    table: dict[str, tuple[str, ...]]  # logical axis -> mesh axes (as written, any size)
    paths: dict[str, tuple]  # logical axis -> spec path of the rule

    def mesh_axes(self, logical: Optional[str], mesh: Mesh) -> tuple[str, ...]:
        if logical is None:
            return ()
        axes = self.table.get(logical, DEFAULT_RULES.get(logical, ()))
        return tuple(a for a in axes if mesh.size(a) > 1)


def _as_axes(v) -> tuple[str, ...]:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(v)


def read_rules(spec: Spec, doc: Document, diags: list[Diagnostic]) -> Rules:
    raw = spec.sharding.rules
    table: dict[str, tuple[str, ...]] = {}
    paths: dict[str, tuple] = {}
    items = list(raw.items()) if isinstance(raw, dict) else [(k, v) for k, v in raw]
    for i, (logical, value) in enumerate(items):
        path = ("sharding", "rules", logical) if isinstance(raw, dict) else ("sharding", "rules", i)
        if not isinstance(logical, str):
            diags.append(Diagnostic(codes.E012, f"a rule's logical axis must be a name, got {logical!r}",
                                    doc.pos(path + (0,)), help="write rules as [logical_axis, mesh_axis] pairs"))
            continue
        axes = _as_axes(value)
        for j, a in enumerate(axes):
            if a not in MESH_AXES:
                sub = path if isinstance(value, str) else path + ((j,) if isinstance(raw, dict) else (1, j))
                diags.append(Diagnostic(codes.E040, f"unknown mesh axis `{a}` in the rule for `{logical}`",
                                        doc.pos(sub), help=did_you_mean(a, MESH_AXES)))
        if len(set(axes)) != len(axes):
            diags.append(Diagnostic(codes.E041, f"the rule for `{logical}` names a mesh axis twice", doc.pos(path)))
        if logical in table and table[logical] != axes:
            diags.append(Diagnostic(
                codes.E044, f"conflicting rules for logical axis `{logical}`: {list(table[logical])} and {list(axes)}",
                doc.pos(path), help=f"the first rule is at line {doc.pos(paths[logical]).line}; keep one"))
            continue
        table[logical] = axes
        paths[logical] = path
    return Rules(table, paths)


@dataclasses.dataclass(frozen=True)
class Layout:
    spec: PSpec
    origin: tuple  # spec path that decided the layout (a rule or a glob), for diagnostics
    origins: tuple[tuple, ...] = ()  # per dimension: the spec path of the rule that shards it


def batch_axes(rules: Rules, mesh: Mesh) -> tuple[str, ...]:
    if "batch" in rules.table:
        return rules.mesh_axes("batch", mesh)
    return tuple(a for a in DEFAULT_BATCH_AXES if mesh.size(a) > 1)


def _explicit(layout: list, mesh: Mesh) -> PSpec:
    return tuple(tuple(a for a in _as_axes(entry) if mesh.size(a) > 1) for entry in layout)


def param_layouts(graph: Graph, spec: Spec, doc: Document, mesh: Mesh, rules: Rules,
                  diags: list[Diagnostic]) -> dict[str, Layout]:
    out: dict[str, Layout] = {}
    globs = spec.sharding.params
    matched: dict[str, str] = {}  # param -> glob that set it
    for glob, layout in globs.items():
        gpath = ("sharding", "params", glob)
        bad = False
        for j, entry in enumerate(layout):
            for a in _as_axes(entry):
                if a not in MESH_AXES:
                    diags.append(Diagnostic(codes.E040, f"unknown mesh axis `{a}` in the layout for `{glob}`",
                                            doc.pos(gpath + (j,)), help=did_you_mean(a, MESH_AXES)))
                    bad = True
        hits = [p for p in graph.params if fnmatch.fnmatchcase(p.name, glob)]
        if not hits:
            diags.append(Diagnostic(codes.E045, f"`{glob}` matches no parameter", doc.pos(gpath, key=True),
                                    help=did_you_mean(glob, [p.name for p in graph.params])
                                    or "`mithril-spec plan` lists every parameter name"))
            continue
        for p in hits:
            if len(layout) != len(p.shape):
                diags.append(Diagnostic(
                    codes.E048, f"layout for `{glob}` has {len(layout)} entries but `{p.name}` has "
                    f"{len(p.shape)} dimensions {list(p.shape)}", doc.pos(gpath),
                    help="give one entry per dimension; null for a replicated dimension"))
                bad = True
                break
            if p.name in matched and globs[matched[p.name]] != layout:
                diags.append(Diagnostic(
                    codes.E044, f"`{glob}` and `{matched[p.name]}` both match `{p.name}` with different layouts",
                    doc.pos(gpath, key=True), help="make the globs disjoint, or give them the same layout"))
                bad = True
                break
            matched.setdefault(p.name, glob)
        if bad:
            continue
    # Copies of a repeated block share axes, shapes and spec paths: compute each distinct layout once.
    cache: dict[tuple, Layout] = {}
    for p in graph.params + graph.buffers:
        if p.name in matched and len(globs[matched[p.name]]) == len(p.shape):
            g = matched[p.name]
            gpath = ("sharding", "params", g)
            out[p.name] = _fill_fsdp(p, Layout(_explicit(globs[g], mesh), gpath, (gpath,) * len(p.shape)), mesh)
            continue
        key = (p.axes, p.shape, p.units, p.path, p.trainable)
        lay = cache.get(key)
        if lay is None:
            dims = tuple(rules.mesh_axes(a, mesh) for a in p.axes)
            origins = tuple(rules.paths.get(a, ()) if a else () for a in p.axes)
            lay = cache[key] = _fill_fsdp(p, Layout(dims, next((o for o in origins if o), p.path), origins), mesh)
        out[p.name] = lay
    return out


def _fill_fsdp(p: Param, layout: Layout, mesh: Mesh) -> Layout:
    """ZeRO-3: shard over fsdp on the first dimension that takes it, if no rule already did."""
    f = mesh.fsdp
    if f == 1 or not p.trainable or any("fsdp" in d for d in layout.spec):
        return layout  # buffers (batch-norm statistics) stay replicated, as FSDP2 leaves them
    units = p.units or p.shape
    for i, d in enumerate(layout.spec):
        if units[i] % (mesh.degree(d) * f) == 0:
            new = list(layout.spec)
            new[i] = d + ("fsdp",)
            return dataclasses.replace(layout, spec=tuple(new))
    return layout


def check_layout(name: str, shape: tuple[int, ...], units: Optional[tuple[int, ...]], layout: Layout,
                 mesh: Mesh, doc: Document, diags: list[Diagnostic], seen: set) -> bool:
    """Reports a mesh axis used twice and sizes that do not divide. True when the layout is usable."""
    ok = True
    flat = [a for d in layout.spec for a in d]
    twice = sorted({a for a in flat if flat.count(a) > 1})
    if twice:
        key = (codes.E041, layout.origin, tuple(twice))
        if key not in seen:
            seen.add(key)
            diags.append(Diagnostic(
                codes.E041, f"mesh axis `{twice[0]}` shards two dimensions of `{name}` {list(shape)}",
                doc.pos(layout.origin),
                help="change one of the rules for this parameter's logical axes, or give it an explicit layout "
                "under `sharding.params`"))
        ok = False
    units = units or shape
    for i, d in enumerate(layout.spec):
        deg = mesh.degree(d)
        if deg > 1 and units[i] % deg:
            what = "heads" if units[i] != shape[i] else "size"
            origin = layout.origins[i] if i < len(layout.origins) and layout.origins[i] else layout.origin
            key = (codes.E042, origin, units[i], deg)
            if key not in seen:
                seen.add(key)
                diags.append(Diagnostic(
                    codes.E042, f"{what} {units[i]} of `{name}` (dimension {i}) is not divisible by "
                    f"{' x '.join(f'{a}={mesh.size(a)}' for a in d)} = {deg}", doc.pos(origin),
                    help="change the mesh, the size, or the rule that shards this dimension"))
            ok = False
    return ok


def local_shape(shape: tuple[int, ...], spec: PSpec, mesh: Mesh) -> tuple[int, ...]:
    return tuple(math.ceil(s / mesh.degree(d)) for s, d in zip(shape, spec))
