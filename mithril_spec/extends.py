"""`extends:`: a spec may name a base spec (relative path inside its own directory tree) merged under it.

Merge rules: mappings merge key by key, the extending spec winning; lists and scalars are replaced whole;
a key set to null in the extending spec removes it. Positions keep pointing into the file each value came
from. Chains are allowed; cycles are not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import codes
from .diagnostics import Diagnostic, DiagnosticError
from .limits import MAX_NODES, count_values
from .source import Document, load_file

MAX_DEPTH = 16


def load_spec_file(path: str | Path) -> Document:
    return _load(Path(path), ())


def relative_base(spec: str | Path, base: str | Path) -> str | None:
    """What `spec` writes as `extends:` to extend `base` (a relative POSIX path), or None where the rule above
    does not allow it (`base` outside `spec`'s directory tree)."""
    root = Path(spec).parent.resolve()
    target = Path(base).resolve()
    return target.relative_to(root).as_posix() if target.is_relative_to(root) else None


def _load(path: Path, chain: tuple[Path, ...]) -> Document:
    doc = load_file(path)
    if not isinstance(doc.data, dict) or "extends" not in doc.data:
        return doc
    ext = doc.data["extends"]
    pos = doc.pos(("extends",))
    if not isinstance(ext, str) or not ext:
        raise DiagnosticError([Diagnostic(codes.E004, "`extends` must be a relative path to a spec file", pos)])
    rel = Path(ext)
    try:
        root = path.parent.resolve()
        target = (path.parent / rel).resolve()
        target.is_file()  # (a name too long for the file system: OSError here, not later)
    except (OSError, ValueError) as e:  # ValueError: a NUL character
        why = "contains a NUL character" if "\0" in ext else f"is not a usable path ({getattr(e, 'strerror', None) or e})"
        raise DiagnosticError([Diagnostic(codes.E004, f"`extends` {why}", pos,
                                          help="name a spec file next to this one or below it, e.g. `_base.yaml`")]
                              ) from None
    if rel.is_absolute() or not target.is_relative_to(root):
        raise DiagnosticError([Diagnostic(
            codes.E004, f"`extends: {ext}` leaves the directory of this spec", pos,
            help="a base spec must live in the same directory as the spec that extends it, or below it")])
    if target.suffix.lower() not in (".yaml", ".yml", ".toml"):
        raise DiagnosticError([Diagnostic(codes.E004, f"`extends: {ext}` is not a .yaml, .yml or .toml file", pos)])
    if not target.is_file():
        raise DiagnosticError([Diagnostic(codes.E004, f"`extends: {ext}`: no such file", pos)])
    if target in chain or target == path.resolve():
        raise DiagnosticError([Diagnostic(codes.E004, f"`extends: {ext}` forms a cycle", pos,
                                          help="a spec cannot (indirectly) extend itself")])
    if len(chain) >= MAX_DEPTH:
        raise DiagnosticError([Diagnostic(codes.E004, f"`extends` chains deeper than {MAX_DEPTH} specs", pos)])
    base = _load(path.parent / rel, chain + (path.resolve(),))
    if not isinstance(base.data, dict):
        kind = "empty" if base.data is None else f"a {type(base.data).__name__}"
        raise DiagnosticError([Diagnostic(codes.E005, f"the base spec `{ext}` is not a mapping ({kind})", base.pos(()),
                                          help="a base spec is a mapping of spec sections, like any spec")])
    absent: list[tuple] = []
    data = _merge(base.data, {k: v for k, v in doc.data.items() if k != "extends"}, absent)
    if count_values(data) > MAX_NODES:
        raise DiagnosticError([Diagnostic(
            codes.E006, f"this spec and the base specs it extends hold more than {MAX_NODES:,} values together", pos,
            help=f"a spec holds at most {MAX_NODES:,} values, its base specs included")])
    values = {**base.values, **doc.values}
    keys = {**base.keys, **doc.keys}
    sources = {**base.sources, **doc.sources}
    nulls = {**base.nulls, **{p: doc.pos(p, key=True) for p in absent}}
    return Document(data, doc.file, doc.text, values, keys, sources, _overridden(base, doc), nulls=nulls)


def _overridden(base: Document, doc: Document) -> dict:
    """Where the base spec's values stand that this spec replaced (not merged into): for secondary labels."""
    out = dict(base.overridden)
    for path in sorted((p for p in doc.values if p and p in base.values and p != ("extends",)), key=len):
        if any(path[:n] in out for n in range(1, len(path))):
            continue  # inside a value that was replaced whole
        b, o = _get(base.data, path), _get(doc.data, path)
        if not (isinstance(b, dict) and isinstance(o, dict)):
            out[path] = base.values[path]
    return out


def _get(data: Any, path: tuple) -> Any:
    for k in path:
        try:
            data = data[k]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _merge(base: Any, over: Any, absent: list | None = None, path: tuple = ()) -> Any:
    """`over` merged over `base`; the paths of the keys `over` sets to null that `base` lacks (they remove
    nothing) are appended to `absent`."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if v is None:
                if k in out:
                    del out[k]
                elif absent is not None:
                    absent.append(path + (k,))
            else:
                out[k] = _merge(base.get(k), v, absent, path + (k,))
        return out
    return over
