"""Validation: plain data (with positions) -> typed `Spec`.

Pydantic does the checking; this module turns its errors into diagnostics that point into the user's
file, with a did-you-mean for unknown keys.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Union

import pydantic
from pydantic import BaseModel

from . import codes
from .diagnostics import Diagnostic, DiagnosticError, closest, did_you_mean
from .limits import MAX_INT, float_not_finite, int_too_large, shorten, show
from .source import Document
from .spec.root import Spec

_TYPE_ERRORS = {
    "int_type", "int_parsing", "float_type", "float_parsing", "string_type", "bool_type", "bool_parsing",
    "dict_type", "list_type", "tuple_type", "model_type", "model_attributes_type", "int_from_float",
    "dataclass_type", "is_instance_of", "none_required",
}  # fmt: skip
_SECTION_NAMES = {(): "the spec"}


def validate(doc: Document) -> Spec:
    data = doc.data
    if not isinstance(data, dict):
        raise DiagnosticError(
            [
                Diagnostic(
                    codes.E005,
                    f"a spec must be a mapping at the top level, got {_kind(data)}",
                    doc.pos(()),
                    help="start with `version: 1`, `name: ...`, `model: ...`",
                    path=(),
                )
            ]
        )
    if "version" in data and data["version"] != 1:
        raise DiagnosticError(
            [
                Diagnostic(
                    codes.E014,
                    f"unsupported spec version {show(data['version'])}",
                    doc.pos(("version",)),
                    help="this mithril-spec reads `version: 1`",
                    path=("version",),
                )
            ]
        )
    numbers = _out_of_range(doc) + _unknown_nulls(doc)
    try:
        spec = Spec.model_validate(data)
    except pydantic.ValidationError as e:
        bad = {d.path for d in numbers}
        raise DiagnosticError(numbers + [d for d in _convert(e, doc) if d.path not in bad]) from None
    if numbers:
        raise DiagnosticError(numbers)
    return spec


def _unknown_nulls(doc: Document) -> list[Diagnostic]:
    """E010 for a key that an extending spec sets to null, that no base spec has and that its section does not
    have either: a misspelt key (`chekpoint: null`) would otherwise remove nothing, silently."""
    out = []
    for path, pos in doc.nulls.items():
        section = path[:-1]
        if _has_path(doc.data, path) or not _has_path(doc.data, section):
            continue  # set again later (checked as any value), or its section is gone
        allowed = _allowed_keys(section, doc.data)
        if allowed is None or path[-1] in allowed:
            continue
        out.append(Diagnostic(
            codes.E010, f"unknown key `{shorten(path[-1])}` in {_section(section)}", pos,
            help=did_you_mean(str(path[-1]), allowed),
            notes=("set to null, it removes nothing: no base spec has it",), path=path, key=str(path[-1])))
    return out


def _has_path(data: Any, path: tuple) -> bool:
    for p in path:
        if not _has_child(data, p):
            return False
        data = data[p]
    return True


# `hf.config` is the imported model's config.json, kept as it is (written back by --export-hf).
_OPAQUE = {("hf", "config")}


def _out_of_range(doc: Document) -> list[Diagnostic]:
    """E015 for every integer of 2^53 or more and every float that is not finite (inf, nan, 1e400), and
    for a mesh whose device count (the product of its axis sizes) reaches 2^53."""
    out: list[Diagnostic] = []
    stack: list[tuple[tuple, Any]] = [((), doc.data)]
    while stack:
        path, v = stack.pop()
        if path in _OPAQUE:
            continue
        if isinstance(v, dict):
            stack.extend((path + (k,), x) for k, x in reversed(v.items()))
        elif isinstance(v, list):
            stack.extend((path + (i,), x) for i, x in reversed(list(enumerate(v))))
        elif int_too_large(v):
            out.append(Diagnostic(
                codes.E015, f"{show(v)} is out of range for {_section(path)}: integers must be below 2^53",
                doc.pos(path), help="sizes and counts are below 2^53 (9,007,199,254,740,992)", path=path))
        elif float_not_finite(v):
            text = "infinite" if v == v else "not a number"
            out.append(Diagnostic(
                codes.E015, f"{_section(path)} is {text} ({v!r}); numbers must be finite", doc.pos(path),
                help="write a finite number (`1e400` is beyond the float range and reads as infinity)", path=path))
    data = doc.data if isinstance(doc.data, dict) else {}
    meshes = [(("mesh",), data.get("mesh"))]
    if isinstance(data.get("meshes"), dict):
        meshes += [(("meshes", k), m) for k, m in data["meshes"].items()]
    for path, mesh in meshes:
        if not isinstance(mesh, dict):
            continue
        sizes = [n for n in mesh.values() if isinstance(n, int) and not isinstance(n, bool) and n > 0]
        if sizes and not any(int_too_large(n) for n in sizes) and math.prod(sizes) >= MAX_INT:
            out.append(Diagnostic(
                codes.E015, f"{_section(path)} has {math.prod(sizes):,} devices; a mesh has fewer than 2^53",
                doc.pos(path), help="the product of the mesh axis sizes is the device count", path=path))
    return out


def _convert(err: pydantic.ValidationError, doc: Document) -> list[Diagnostic]:
    seen: set[tuple] = set()
    unknown_ops: set[tuple] = set()  # layers whose operator is unknown: their other errors are noise
    out: list[Diagnostic] = []
    errors = err.errors(include_url=False)
    # A size (an integer or a string: `Size`) that is neither: pydantic reports each member of the union.
    members = {(e["loc"][:-1], e["loc"][-1], e["type"]) for e in errors if e["loc"]}
    sizes = {loc for loc, tag, typ in members if (tag, typ) == ("int", "int_type")
             and (loc, "str", "string_type") in members}
    for e in errors:
        if _other_branch(e["loc"], doc.data):
            continue
        path = _real_path(e["loc"], doc.data)
        if e["loc"][:-1] in sizes:
            d = _wrong_size(path, doc)
        else:
            d = _diagnostic(e, path, doc, is_key=bool(e["loc"]) and e["loc"][-1] == "[key]")
        key = (path, d.code)
        if key in seen or any(path[:n] in unknown_ops for n in range(len(path) + 1)):
            continue
        # A union member error at a path whose parent already produced one is noise.
        seen.add(key)
        if d.code == codes.E024:
            unknown_ops.add(path)
        out.append(d)
    # `optimiser: ...` gives both "unknown key `optimiser`" (did you mean `optimizer`?) and "missing key
    # `optimizer`": the first says it all.
    meant = set()
    for d in out:
        if d.code == codes.E010 and d.path:
            section = d.path[:-1]
            best = closest(str(d.key), _allowed_keys(section, doc.data) or ())
            if best is not None:
                meant.add(section + (best,))
    return [d for d in out if not (d.code == codes.E011 and d.path in meant)]


def _has_child(node: Any, item: Any) -> bool:
    """Is `item` a key of the mapping or an index of the list `node`?"""
    if isinstance(node, dict):
        return item in node
    return isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node)


def _real_path(loc: tuple, data: Any) -> tuple:
    """Pydantic's loc with union tags and validator names dropped: a path into the data."""
    path: list = []
    node = data
    tagged = None  # the node whose union tag was skipped (once: the loc's next item is one of its keys)
    for i, item in enumerate(loc):
        if (isinstance(node, dict) and isinstance(item, str) and path_is_tag(item, node) and i + 1 < len(loc)
                and _has_child(node, item) and not isinstance(node[item], (dict, list)) and tagged is not node):
            # The union tag of a layer (`repeat`) that is also one of its keys: the loc goes on inside the
            # layer (`repeat`, `stage`), not inside the scalar value of that key.
            tagged = node
            continue
        if _has_child(node, item):
            path.append(item)
            node = node[item]
        elif isinstance(node, dict) and isinstance(item, str) and not path_is_tag(item, node):
            path.append(item)  # a missing or extra key
            node = None
    return tuple(path)


def _other_branch(loc: tuple, data: Any) -> bool:
    """True for an error from a union member meant for another kind of value (the list form of
    `sharding.rules` when the spec gives a mapping, or the reverse): the member that fits reports its own."""
    node = data
    for item in loc:
        if _has_child(node, item):
            node = node[item]
        elif isinstance(item, str):
            if item.startswith("dict[") and isinstance(node, list):
                return True
            if item.startswith("list[") and isinstance(node, dict):
                return True
        else:
            return False
    return False


def path_is_tag(item: str, node: dict) -> bool:
    return (
        item in ("repeat",)
        or item == node.get("op")
        or item == node.get("name")
        or item == node.get("kind")
        or ("[" in item or "function" in item)
    )


def _section(path: tuple) -> str:
    keys = [shorten(p, 40) if not isinstance(p, int) else f"[{p}]" for p in path]
    return ".".join(keys).replace(".[", "[") if keys else "the spec"


def _diagnostic(e: dict, path: tuple, doc: Document, is_key: bool = False) -> Diagnostic:
    d = _diagnostic_for(e, path, doc, is_key)
    # A mesh axis size that is not a positive integer is a bad mesh definition (E047), like `mesh` + `meshes`.
    sizes = len(path) == 2 and path[0] == "mesh" or len(path) == 3 and path[0] == "meshes"
    if sizes and not is_key and d.code in (codes.E012, codes.E013) and e["type"] != "string_pattern_mismatch":
        value = _get(doc.data, path)
        d = Diagnostic(
            codes.E047,
            f"mesh axis `{path[-1]}` has size {show(value)}; sizes are positive integers",
            d.pos,
            help="e.g. `mesh: {data: 2, tensor: 4}`",
            path=path,
        )
    return d


def _diagnostic_for(e: dict, path: tuple, doc: Document, is_key: bool = False) -> Diagnostic:
    typ = e["type"]
    ctx = e.get("ctx") or {}
    here = _section(path)
    if is_key and path:  # a mapping key that is not allowed (`dims: {"a b": 4}`): point at the key
        where = doc.pos(path, key=True)
        key = path[-1]
        if typ == "string_pattern_mismatch":
            message = (f"invalid name {show(key)} in {_section(path[:-1])}: names must be identifiers (letters, "
                       "digits, _; not starting with a digit)")
            help = "names become Python identifiers in the generated program"
        elif typ == "string_too_long":
            message = f"invalid name {show(key)} in {_section(path[:-1])}: {e['msg'].removeprefix('Value error, ')}"
            help = None
        else:
            message = f"invalid key {show(key)} in {_section(path[:-1])}: {e['msg'].removeprefix('Value error, ')}"
            help = None
        return Diagnostic(codes.E013, message, where, help=help, path=path, key=str(key))
    if typ == "extra_forbidden":
        key = path[-1]
        allowed = _allowed_keys(path[:-1], doc.data)
        return Diagnostic(
            codes.E010,
            f"unknown key `{shorten(key)}` in {_section(path[:-1])}",
            doc.pos(path, key=True),
            help=did_you_mean(str(key), allowed) if allowed else None,
            path=path,
            key=str(key),
        )
    if typ == "missing":
        return Diagnostic(
            codes.E011,
            f"missing key `{path[-1]}` in {_section(path[:-1])}",
            doc.pos(path[:-1], key=True),
            help=f"add `{path[-1]}:` here",
            path=path,
            key=str(path[-1]),
        )
    if typ == "union_tag_invalid":
        tag, expected = ctx.get("tag"), ctx.get("expected_tags", "")
        choices = [t.strip().strip("'") for t in str(expected).split(",")]
        node = _get(doc.data, path)
        field = "op" if isinstance(node, dict) and "op" in node else _tag_field(node)
        if field == "op" and "repeat" in choices:
            choices = [c for c in choices if c != "repeat"]
            return Diagnostic(
                codes.E024,
                f"unknown operator `{shorten(tag)}`",
                doc.pos(path + ("op",)),
                help=did_you_mean(str(tag), choices) or "see docs/spec.md for the operators",
                path=path + ("op",),
            )
        return Diagnostic(
            codes.E013,
            f"invalid value {show(tag)} for {_section(path + (field,))}",
            doc.pos(path + (field,)),
            help=did_you_mean(str(tag), choices),
            path=path + (field,),
        )
    if typ == "union_tag_not_found":
        disc = ctx.get("discriminator", "")
        field = str(disc).strip("'") if disc and "function" not in str(disc) and "(" not in str(disc) else "op"
        return Diagnostic(
            codes.E011,
            f"missing key `{field}` in {here}",
            doc.pos(path, key=True),
            help="every layer names its operator with `op:` (or is a `repeat:` of a block)"
            if field == "op"
            else f"add `{field}:`",
            path=path + (field,),
            key=field,
        )
    value = _get(doc.data, path)
    if typ in _TYPE_ERRORS:
        return Diagnostic(
            codes.E012,
            f"wrong type for {here}: {e['msg'].replace('Input should be', 'expected')}, got {_kind(value)}",
            doc.pos(path),
            help=_type_help(typ),
            path=path,
        )
    if typ == "literal_error":
        expected = ctx.get("expected", "")
        choices = [c.strip().strip("'") for c in str(expected).replace(" or ", ",").split(",") if c.strip()]
        return Diagnostic(
            codes.E013,
            f"invalid value {show(value)} for {here}",
            doc.pos(path),
            help=did_you_mean(str(value), choices) if choices else None,
            path=path,
        )
    if typ == "string_pattern_mismatch":
        return Diagnostic(
            codes.E013,
            f"invalid name {show(value)} for {here}: names must be identifiers (letters, digits, _; not starting "
            "with a digit)",
            doc.pos(path),
            help="names become Python identifiers in the generated program",
            path=path,
        )
    return Diagnostic(
        codes.E013,
        f"invalid value {show(value)} for {here}: {e['msg'].removeprefix('Value error, ')}",
        doc.pos(path),
        help=None,
        path=path,
    )


def _wrong_size(path: tuple, doc: Document) -> Diagnostic:
    return Diagnostic(
        codes.E012,
        f"wrong type for {_section(path)}: expected a size (an integer, a dim name or an expression such as "
        f"`4*d`), got {_kind(_get(doc.data, path))}",
        doc.pos(path),
        help="write a positive integer (`512`), a dim of `dims` (`ff`) or arithmetic on dims (`4*d`, `d/heads`)",
        path=path,
    )


def _type_help(typ: str) -> str | None:
    if typ.startswith(("dict", "model")):
        return "this section is a mapping of `key: value` entries"
    if typ.startswith(("list", "tuple")):
        return "this value is a list, e.g. `[a, b]`"
    if typ.startswith("string"):
        return "quote the value if it is meant as text"
    return None


def _tag_field(node: Any) -> str:
    if isinstance(node, dict):
        for f in ("name", "kind", "op"):
            if f in node:
                return f
    return "value"


def _get(data: Any, path: tuple) -> Any:
    node = data
    for p in path:
        try:
            node = node[p]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{str(v).lower()}`"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, str):
        return f"string {show(v)}"
    return f"{type(v).__name__} `{v}`"


# ---- the keys a section accepts, for did-you-mean


def _allowed_keys(path: tuple, data: Any) -> list[str] | None:
    tp: Any = Spec
    node = data
    for key in path:
        tp = _unwrap(tp, node)
        node = node[key] if isinstance(node, (dict, list)) else None
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(key)
            if field is None:
                return None
            tp = field.annotation
        else:
            origin = typing.get_origin(tp)
            args = typing.get_args(tp)
            if origin is dict:
                tp = args[1]
            elif origin is list:
                tp = args[0]
            else:
                return None
    tp = _unwrap(tp, node)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return list(tp.model_fields)
    return None


def _unwrap(tp: Any, node: Any) -> Any:
    for _ in range(10):
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin is Union or origin is types.UnionType:
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            models = [_unwrap(m, node) for m in members]
            models = [m for m in models if isinstance(m, type) and issubclass(m, BaseModel)]
            tp = _pick(models, node) or (members[0] if len(members) == 1 else None)
        else:
            return tp
    return tp


def _pick(models: list[type[BaseModel]], node: Any) -> type[BaseModel] | None:
    if not models:
        return None
    if isinstance(node, dict):
        for m in models:
            for fname, f in m.model_fields.items():
                if typing.get_origin(f.annotation) is typing.Literal and node.get(fname) in typing.get_args(
                    f.annotation
                ):
                    return m
        if "repeat" in node:
            for m in models:
                if "repeat" in m.model_fields:
                    return m
    return models[0] if len(models) == 1 else None
