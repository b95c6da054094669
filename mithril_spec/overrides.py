"""`--set KEY=VALUE`: command-line overrides of a spec, applied after `extends`.

KEY is a dotted path into the spec (`training.optimizer.lr`, `dims.layers`, `meshes.sharded.tensor`;
a number indexes a list: `model.layers.0.dim`). VALUE is YAML (`1e-3`, `true`, `[data, fsdp]`,
`{kind: synthetic}`); `null` removes the key, as in `extends`. Later overrides win over earlier ones.

An override must name something, as in Hydra: `KEY=VALUE` changes (or removes) a key the spec has, and a
KEY the spec lacks is an error (E007) with the closest key it has, not a silent addition that nothing reads.
Adding has its own spelling: `+KEY=VALUE` adds a key the spec does not have (missing mappings on the way are
created; a list index equal to the list's length appends), and `++KEY=VALUE` sets KEY whether or not it is
there (`++KEY=null` removes it if it is there).

An override is its own small source file (named `--set #N`, its text the argument), so a diagnostic
about a value it set points at the argument, with carets under the value; so does E007, under the part of
KEY that names nothing.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Sequence
from typing import Any

from . import codes
from .diagnostics import Diagnostic, DiagnosticError, Label, Position, closest
from .limits import MAX_NODES, count_values
from .planner.mesh import UsageError
from .source import Document, PathT, load_text

_SEGMENT = re.compile(r"[A-Za-z0-9_\-]+")

# The three spellings of KEY (Hydra's): change a key that is there, add one that is not, set it either way.
SET, ADD, FORCE = "", "+", "++"

CODE = codes.E007  # an override that names nothing (codes.py)
MAX_LISTED = 12  # sibling keys listed in a help line when none is close to a misspelt one


def source_name(index: int) -> str:
    """The pseudo file name of the `index`-th override (1-based) in positions and source excerpts."""
    return f"--set #{index}"


def is_override(file: str) -> bool:
    return file.startswith("--set #")


@dataclasses.dataclass(frozen=True)
class _Arg:
    """One `--set` argument taken apart: its spelling, the parts of KEY with where each stands in the
    argument (so that a diagnostic underlines the part that names nothing) and where VALUE starts."""

    text: str
    index: int
    mode: str  # SET, ADD or FORCE
    parts: tuple[str, ...]
    offsets: tuple[int, ...]  # 0-based column of each part in `text`
    value_at: int  # 0-based column where VALUE starts

    @property
    def name(self) -> str:
        return source_name(self.index)

    @property
    def key(self) -> str:
        return ".".join(self.parts)

    def dotted(self, n: int) -> str:
        """The first `n` parts of KEY, as written."""
        return ".".join(self.parts[:n])

    def span(self, first: int, last: int) -> Position:
        """Where KEY's parts `first` to `last` (inclusive) stand in the argument."""
        return Position(self.name, 1, self.offsets[first] + 1, 1, self.offsets[last] + len(self.parts[last]) + 1)

    def key_span(self) -> Position:
        """Where KEY stands with its `+`/`++`."""
        whole = self.span(0, len(self.parts) - 1)
        return dataclasses.replace(whole, col=whole.col - len(self.mode))

    def spelled(self, mode: str, key: str | None = None) -> str:
        """This argument with another spelling (or KEY), as a help line shows it."""
        return "--set " + shlex.quote(f"{mode}{key or self.key}={self.text[self.value_at:].strip()}")


def apply(doc: Document, settings: Sequence[str]) -> Document:
    """`doc` with each `KEY=VALUE` of `settings` applied in order. A malformed argument is a UsageError; a KEY
    that names nothing (as its spelling requires it to) is a DiagnosticError E007 at the argument; a bad
    VALUE's YAML is a diagnostic at it."""
    for i, arg in enumerate(settings, 1):
        doc = _apply_one(doc, arg, i)
    return doc


def _parse(arg: str, index: int) -> _Arg:
    head, eq, _value = arg.partition("=")
    lead = len(head) - len(head.lstrip(" \t"))
    key = head.strip(" \t")
    mode = FORCE if key.startswith(FORCE) else ADD if key.startswith(ADD) else SET
    key = key[len(mode):]
    if not eq or not key:
        raise UsageError(f"--set {arg!r}: expected KEY=VALUE, e.g. --set training.optimizer.lr=3e-4 "
                         "(+KEY=VALUE adds a key the spec does not have)")
    parts = tuple(key.split("."))
    if not all(_SEGMENT.fullmatch(p) for p in parts):
        raise UsageError(
            f"--set {arg!r}: KEY is a dotted path of names and list indices, "
            "e.g. training.optimizer.lr or model.layers.0.dim"
        )
    offsets, at = [], lead + len(mode)
    for p in parts:
        offsets.append(at)
        at += len(p) + 1
    return _Arg(arg, index, mode, parts, tuple(offsets), len(head) + 1)


def _apply_one(doc: Document, arg: str, index: int) -> Document:
    a = _parse(arg, index)
    if a.parts[0] == "extends":  # (merged before the overrides: setting it would change nothing)
        raise UsageError(f"--set {a.key}: `extends` is merged before the overrides are applied, so an override "
                         "cannot change it; edit the spec's `extends:`, or --set the values themselves")
    # The value is parsed where it stands in the argument, so that its positions are columns of the argument.
    sub = load_text(" " * a.value_at + arg[a.value_at:], a.name, root_span=True)
    if not isinstance(doc.data, dict):
        raise UsageError(f"--set {a.key}: the spec is not a mapping")
    data = _copy_path(doc.data, a.parts)
    found = _target(doc, data, a, remove=sub.data is None)
    if found is None:  # `++KEY=null` where there is nothing to remove
        return dataclasses.replace(doc, sources={**doc.sources, a.name: arg})
    parent, path, last, created = found
    if sub.data is None:
        if isinstance(parent, list):
            raise UsageError(f"--set {a.key}=null: list entries cannot be removed, set the whole list instead")
        parent.pop(last)
    elif isinstance(parent, list) and last == len(parent):
        parent.append(sub.data)
    else:
        parent[last] = sub.data
    if count_values(data) > MAX_NODES:
        raise UsageError(f"--set {a.key}: the spec would hold more than {MAX_NODES:,} values")
    return _located(doc, data, a, sub, path + (last,), created)


def _target(doc: Document, data: dict, a: _Arg, remove: bool) -> tuple[Any, PathT, Any, int | None] | None:
    """Where KEY leads in `data`: the mapping or list that holds its last part, that one's path, the last key
    or index, and the first part of KEY that `+`/`++` created (None: none was). E007 unless KEY names what
    its spelling requires; None for a `++KEY=null` that has nothing to remove."""
    create = a.mode != SET and not remove  # only an addition creates the mappings on its way
    parent, path, missing = _parent(doc, data, a, create)
    if missing is not None and not create:
        if a.mode == FORCE:
            return None
        raise _adds_nothing(a) if a.mode == ADD else _no_key(doc, a, missing, parent, path, remove)
    last, exists = _last_step(doc, a, parent, path)
    if a.mode == SET and not exists:
        raise _no_key(doc, a, len(a.parts) - 1, parent, path, remove)
    if a.mode == ADD and (exists or remove):
        raise _exists(doc, a, path + (last,)) if exists else _adds_nothing(a)
    if remove and not exists:
        return None
    return parent, path, last, missing


def _located(doc: Document, data: Any, a: _Arg, sub: Document, path: PathT, created: int | None) -> Document:
    """The new document: the positions of what the argument set (or removed) are in the argument, those of
    what it replaced are dropped (the replaced value is kept as a label, `overridden`)."""

    def outside(p: PathT) -> bool:
        return p[: len(path)] != path

    n = len(a.parts)
    values = {p: v for p, v in doc.values.items() if outside(p)}
    keys = {p: v for p, v in doc.keys.items() if outside(p)}
    # (a key removed earlier and set again, or set beneath, is no longer removed)
    removed = {p: v for p, v in doc.removed.items() if outside(p) and path[: len(p)] != p}
    overridden = {p: v for p, v in doc.overridden.items() if outside(p)}
    if sub.data is None:
        removed[path] = a.span(0, n - 1)
    else:
        values.update({path + p: v for p, v in sub.values.items()})
        keys.update({path + p: v for p, v in sub.keys.items() if p})
        keys[path] = a.span(0, n - 1)
        for i in range(created if created is not None else n - 1, n - 1):
            # a mapping `+` created on the way: its key is KEY up to it, its content the rest of KEY
            keys[path[: i + 1]] = a.span(0, i)
            values[path[: i + 1]] = a.span(i + 1, n - 1)
        old = doc.values.get(path)
        if old is not None:
            overridden[path] = old
    sources = {**doc.sources, a.name: a.text}
    return Document(data, doc.file, doc.text, values, keys, sources, overridden, removed, doc.nulls)


def _parent(doc: Document, data: dict, a: _Arg, create: bool) -> tuple[Any, PathT, int | None]:
    """The mapping or list that holds KEY's last part, its path, and the index of the first part of KEY that
    was missing (None: all were there). A missing part of a mapping is created when `create`; otherwise the
    walk stops at the mapping that lacks it (returned with its path)."""
    parent, path, missing = data, (), None
    for i, part in enumerate(a.parts[:-1]):
        step = _step(doc, a, parent, path, i)
        if step is None:
            if not create:
                return parent, path, i
            parent[part] = {}
            step = part
            missing = i if missing is None else missing
        parent, path = parent[step], path + (step,)
    return parent, path, missing


def _step(doc: Document, a: _Arg, parent: Any, path: PathT, i: int) -> Any:
    """The key or index KEY's part `i` names in `parent`: None when `parent` is a mapping without it; an
    E007 when `parent` is a list it is not an index of, or a scalar."""
    part = a.parts[i]
    if isinstance(parent, dict):
        return part if part in parent else None
    if isinstance(parent, list):
        if part.isdigit() and int(part) < len(parent):
            return int(part)
        raise _bad_index(doc, a, i, parent, path)
    raise _through_scalar(doc, a, i, parent, path)


def _last_step(doc: Document, a: _Arg, parent: Any, path: PathT) -> tuple[Any, bool]:
    """The key or index KEY's last part names in `parent`, and whether it is there. A list's length is an
    index too (where `+` appends); beyond it, or a scalar parent, is an E007."""
    i = len(a.parts) - 1
    part = a.parts[i]
    if isinstance(parent, dict):
        return part, part in parent
    if isinstance(parent, list):
        if part.isdigit() and int(part) <= len(parent):
            return int(part), int(part) < len(parent)
        raise _bad_index(doc, a, i, parent, path)
    raise _through_scalar(doc, a, i, parent, path)


# ---------------------------------------------------------------- E007: an override that names nothing


def _error(a: _Arg, message: str, pos: Position, help: str | None, labels: Sequence[Label] = (),
           note: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(CODE, message, pos, help=help, labels=tuple(labels), key=a.key,
                                       notes=(note,) if note else ())])


def _where(a: _Arg, i: int) -> str:
    return f"`{a.dotted(i)}`" if i else "the spec"


def _defined_here(doc: Document, a: _Arg, i: int, path: PathT) -> list[Label]:
    """A label on the spec's key of the mapping or list where KEY stops naming anything (not the root)."""
    pos = doc.keys.get(path) if path else None
    return [Label(pos, f"`{a.dotted(i)}` is defined here")] if pos is not None else []


def _no_key(doc: Document, a: _Arg, i: int, parent: Any, path: PathT, remove: bool) -> DiagnosticError:
    """KEY's part `i` is not a key of the mapping (or an index of the list) `parent`: the closest key there, or
    the keys there, and the spelling that adds it."""
    if isinstance(parent, list):
        return _bad_index(doc, a, i, parent, path)
    part, siblings = a.parts[i], sorted(str(k) for k in parent)
    what = " to remove" if remove else ""
    message = f"`{a.key}` is not in the spec: {_where(a, i)} has no key `{part}`{what}"
    best = closest(part, siblings)
    meant = f"did you mean `{'.'.join((*a.parts[:i], best, *a.parts[i + 1:]))}`?" if best is not None else None
    listed = None
    if siblings and len(siblings) <= MAX_LISTED:
        listed = f"{_where(a, i)} has the keys " + ", ".join(f"`{k}`" for k in siblings)
    add = None if remove else f"to add `{a.key}`, write `{a.spelled(ADD)}`"
    # (the likelier intent first: a misspelling when a key is close, an addition when none is)
    help, note = (meant, add) if meant else (add or listed, listed if add else None)
    return _error(a, message, a.span(i, i), help, _defined_here(doc, a, i, path), note)


def _bad_index(doc: Document, a: _Arg, i: int, parent: list, path: PathT) -> DiagnosticError:
    """KEY's part `i` is not an index of the list `parent` (or, for the last part, its length)."""
    n, part, last = len(parent), a.parts[i], i == len(a.parts) - 1
    indices = f"indices 0 to {n - 1}" if n else "it is empty"
    if part.isdigit():
        message = f"`{a.key}` is not in the spec: `{a.dotted(i)}` is a list of {n} entries ({indices})"
    else:
        message = f"`{a.key}` is not in the spec: `{a.dotted(i)}` is a list ({indices}), indexed by number"
    help = None
    if part.isdigit() and last and int(part) == n and a.mode == SET:
        help = f"to append an entry, write `{a.spelled(ADD)}`"
    elif last and a.mode != SET:
        help = f"`{a.mode}` appends to a list at index {n}: `{a.spelled(a.mode, f'{a.dotted(i)}.{n}')}`"
    return _error(a, message, a.span(i, i), help, _defined_here(doc, a, i, path))


def _through_scalar(doc: Document, a: _Arg, i: int, parent: Any, path: PathT) -> DiagnosticError:
    """KEY goes on (part `i`) past a value that is neither a mapping nor a list."""
    kind = _kind(parent)
    message = f"`{a.key}` is not in the spec: `{a.dotted(i)}` is {kind}, not a mapping or a list"
    labels = [Label(doc.pos(path), f"`{a.dotted(i)}` is {kind} here")] if path in doc.values else []
    return _error(a, message, a.span(i, i), f"set `{a.dotted(i)}` itself: `--set {a.dotted(i)}=...`", labels)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number" if isinstance(value, (int, float)) else "a string" if isinstance(value, str) else "a value"


def _exists(doc: Document, a: _Arg, path: PathT) -> DiagnosticError:
    """`+KEY=VALUE` where KEY is already there: `+` only adds."""
    labels = [Label(doc.values[path], "the spec's value")] if path in doc.values else []
    return _error(a, f"`{a.key}` is already in the spec: `+` adds a key that is not there", a.key_span(),
                  f"to change it, write `{a.spelled(SET)}` (`{a.spelled(FORCE)}` sets it whether it is there or not)",
                  labels)


def _adds_nothing(a: _Arg) -> DiagnosticError:
    """`+KEY=null` where KEY is not there: null removes, so the addition adds nothing."""
    return _error(a, f"`+{a.key}=null` adds nothing: null removes a key, and `{a.key}` is not in the spec",
                  a.key_span(), f"drop this --set; `{a.spelled(FORCE)}` removes `{a.key}` if it is there")


def _copy_path(data: dict, parts: Sequence[str]) -> dict:
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
