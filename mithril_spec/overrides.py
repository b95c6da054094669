"""`--set KEY=VALUE`: command-line overrides of a spec, applied after `extends`.

KEY is a dotted path into the spec (`training.optimizer.lr`, `dims.layers`, `meshes.sharded.tensor`;
a number indexes a list: `model.layers.0.dim`). VALUE is YAML (`1e-3`, `true`, `[data, fsdp]`,
`{kind: synthetic}`); `null` removes the key, as in `extends`. Later overrides win over earlier ones.

An override is its own small source file (named `--set #N`, its text the argument), so a diagnostic
about a value it set points at the argument, with carets under the value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .diagnostics import Position
from .limits import MAX_NODES, count_values
from .planner.mesh import UsageError
from .source import Document, PathT, load_text

_SEGMENT = re.compile(r"[A-Za-z0-9_\-]+")


def source_name(index: int) -> str:
    """The pseudo file name of the `index`-th override (1-based) in positions and source excerpts."""
    return f"--set #{index}"


def is_override(file: str) -> bool:
    return file.startswith("--set #")


def apply(doc: Document, settings: Sequence[str]) -> Document:
    """`doc` with each `KEY=VALUE` of `settings` applied in order. A malformed argument or a path through
    something that is not a mapping or list is a UsageError; a bad VALUE's YAML is a diagnostic at it."""
    for i, arg in enumerate(settings, 1):
        doc = _apply_one(doc, arg, i)
    return doc


def _apply_one(doc: Document, arg: str, index: int) -> Document:
    key, eq, value = arg.partition("=")
    key = key.strip()
    if not eq or not key:
        raise UsageError(f"--set {arg!r}: expected KEY=VALUE, e.g. --set training.optimizer.lr=3e-4")
    parts = key.split(".")
    if not all(_SEGMENT.fullmatch(p) for p in parts):
        raise UsageError(
            f"--set {arg!r}: KEY is a dotted path of names and list indices, "
            "e.g. training.optimizer.lr or model.layers.0.dim"
        )
    name = source_name(index)
    start = len(arg) - len(arg.lstrip())
    # The value is parsed where it stands in the argument, so that its positions are columns of the argument.
    sub = load_text(" " * (len(arg.partition("=")[0]) + 1) + value, name)
    if not isinstance(doc.data, dict):
        raise UsageError(f"--set {key}: the spec is not a mapping")
    data = _copy_path(doc.data, parts)
    parent, path = data, ()
    for p in parts[:-1]:
        step = _step(parent, p, key, path)
        if step not in _children(parent):
            parent[step] = {}
        parent, path = parent[step], path + (step,)
        if not isinstance(parent, (dict, list)):
            raise UsageError(
                f"--set {key}: `{'.'.join(map(str, path))}` is {_kind(parent)} in the spec, not a mapping or a list"
            )
    last = _step(parent, parts[-1], key, path)
    path = path + (last,)
    old = doc.values.get(path)
    if sub.data is None:
        if isinstance(parent, list):
            raise UsageError(f"--set {key}=null: list entries cannot be removed, set the whole list instead")
        parent.pop(last, None)
    elif isinstance(parent, list) and last == len(parent):
        parent.append(sub.data)
    else:
        parent[last] = sub.data
    if count_values(data) > MAX_NODES:
        raise UsageError(f"--set {key}: the spec would hold more than {MAX_NODES:,} values")

    def outside(p: PathT) -> bool:
        return p[: len(path)] != path

    values = {p: v for p, v in doc.values.items() if outside(p)}
    keys = {p: v for p, v in doc.keys.items() if outside(p)}
    if sub.data is not None:
        values.update({path + p: v for p, v in sub.values.items()})
        keys.update({path + p: v for p, v in sub.keys.items() if p})
        keys[path] = Position(name, 1, start + 1, 1, start + len(key) + 1)
    overridden = {p: v for p, v in doc.overridden.items() if outside(p)}
    if old is not None and sub.data is not None:
        overridden[path] = old
    sources = {**doc.sources, name: arg}
    return Document(data, doc.file, doc.text, values, keys, sources, overridden)


def _step(parent: Any, part: str, key: str, path: PathT) -> Any:
    """The key or index `part` names in `parent`."""
    if isinstance(parent, list):
        if not part.isdigit() or int(part) > len(parent):
            where = ".".join(map(str, path))
            raise UsageError(
                f"--set {key}: `{where}` is a list of {len(parent)} entries, `{part}` is not an "
                f"index of it (0 to {len(parent) - 1}, or {len(parent)} to append)"
            )
        return int(part)
    return part


def _children(parent: Any) -> Any:
    return range(len(parent)) if isinstance(parent, list) else parent


def _kind(v: Any) -> str:
    return "null" if v is None else f"a {type(v).__name__}"


def _copy_path(data: dict, parts: list[str]) -> dict:
    """A copy of `data` in which the mappings and lists along `parts` are new objects (the rest shared)."""
    out = dict(data)
    node: Any = out
    for p in parts[:-1]:
        k = int(p) if isinstance(node, list) and p.isdigit() else p
        try:
            child = node[k]
        except (KeyError, IndexError, TypeError):
            return out
        if isinstance(child, dict):
            node[k] = dict(child)
        elif isinstance(child, list):
            node[k] = list(child)
        else:
            return out
        node = node[k]
    return out
