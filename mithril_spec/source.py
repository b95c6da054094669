"""Loading: source text -> plain data plus a position for every node.

YAML goes through PyYAML's composer (which keeps marks); TOML values come from `tomllib` and their
positions from a small scanner that walks the same text. Both give a `Document`: the plain data and,
for every path into it (a tuple of keys and list indices), where its key and its value stand in the file:
a `Position` with the start and the end of the node's text (a span).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from .diagnostics import Diagnostic, DiagnosticError, Label, Position

PathT = tuple[Any, ...]


@dataclasses.dataclass
class Document:
    data: Any
    file: str
    text: str
    values: dict[PathT, Position]  # where each node's value stands (start and end)
    keys: dict[PathT, Position]  # where the key of a mapping entry stands (start and end)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)  # file -> text, for every file merged
    # Through `extends`: for a value of this spec that replaced one of a base spec, where the base's value stands.
    overridden: dict[PathT, Position] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sources.setdefault(self.file, self.text)
        self._paths: dict[Position, PathT] | None = None

    def pos(self, path: PathT, key: bool = False) -> Position:
        """The span of `path` (of its key when `key`), or of its nearest located ancestor."""
        table = self.keys if key else self.values
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            if key and p in self.values:
                return self.values[p]
            p = p[:-1]
        return self.values.get((), Position(self.file, 1, 1))

    span = pos  # the same thing, by the name that says it has an end

    def path_at(self, pos: Position) -> PathT | None:
        """The path whose key or value stands exactly at `pos` (start and end), if any."""
        if self._paths is None:
            paths: dict[Position, PathT] = {}
            for table in (self.values, self.keys):
                for p, where in table.items():
                    paths.setdefault(where, p)
            self._paths = paths
        return self._paths.get(pos)


def load_text(text: str, file: str) -> Document:
    suffix = Path(file).suffix.lower()
    if suffix == ".toml":
        return _load_toml(text, file)
    return _load_yaml(text, file)


def load_file(path: str | Path) -> Document:
    p = Path(path)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        # A broken spec like any other (exit 1 with a position), not a usage error.
        before = raw[: e.start].decode("utf-8", errors="replace")
        line = before.count("\n") + 1
        col = len(before) - (before.rfind("\n") + 1) + 1
        toml = p.suffix.lower() == ".toml"
        raise DiagnosticError([Diagnostic(
            "E002" if toml else "E001",
            f"{'TOML' if toml else 'YAML'} syntax error: the file is not UTF-8 text (byte 0x{raw[e.start]:02x})",
            Position(str(path), line, col), help="save the file as UTF-8")]) from None
    text = text.removeprefix("\ufeff")
    return load_text(text, str(path))


# ---------------------------------------------------------------- YAML


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `1e-3` as a float (YAML 1.2, and TOML, do; YAML 1.1 wants `1.0e-3`)."""


_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _load_yaml(text: str, file: str) -> Document:
    values: dict[PathT, Position] = {}
    keys: dict[PathT, Position] = {}
    errors: list[Diagnostic] = []
    try:
        loader = _SpecLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                data: Any = None
                values[()] = Position(file, 1, 1)
            else:
                data = _yaml_node(loader, node, (), file, values, keys, errors)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        lines = text.splitlines()
        if lines and line > len(lines):  # at the end of the stream: point just after the last line
            line, col = len(lines), len(lines[-1]) + 1
        msg = (e.problem or "invalid YAML").strip()
        if e.context:
            msg = f"{msg} ({e.context.strip()})"
        labels = ()
        ctx = e.context_mark
        if e.context and ctx is not None and e.problem_mark is not None and (ctx.line + 1, ctx.column + 1) != (
            line,
            col,
        ):
            what = re.sub(r"^while (parsing|scanning|constructing) ", "", e.context.strip())
            labels = (Label(Position(file, ctx.line + 1, ctx.column + 1), f"{what} starts here"),)
        raise DiagnosticError(
            [
                Diagnostic(
                    "E001",
                    f"YAML syntax error: {msg}",
                    Position(file, line, col),
                    help="check indentation (spaces, not tabs), brackets and quotes near this point",
                    labels=labels,
                )
            ]
        ) from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (control characters)
        before = text[: e.position]
        line, col = before.count("\n") + 1, e.position - (before.rfind("\n") + 1) + 1
        what = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        raise DiagnosticError([Diagnostic(
            "E001", f"YAML syntax error: unacceptable character {what}: {e.reason}", Position(file, line, col),
            help="remove the control character, or quote and escape it in a double-quoted string")]) from None
    except yaml.YAMLError as e:
        raise DiagnosticError([Diagnostic("E001", f"YAML syntax error: {e}", Position(file, 1, 1))]) from None
    except RecursionError:
        raise DiagnosticError([_too_deep("E001", "YAML", text, file)]) from None
    if errors:
        raise DiagnosticError(errors)
    return Document(data, file, text, values, keys)


MAX_DEPTH = 100
MAX_NODES = 20_000  # aliases can expand a small file into a huge tree ("billion laughs")


def _too_deep(code: str, lang: str, text: str, file: str) -> Diagnostic:
    """The parser ran out of stack: point at the bracket where flow nesting passes MAX_DEPTH, if any."""
    depth, line, col = 0, 1, 1
    pos = Position(file, 1, 1)
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                pos = Position(file, line, col)
                break
        elif ch in "]}":
            depth -= 1
        if ch == "\n":
            line, col = line + 1, 1
        else:
            col += 1
    return Diagnostic(code, f"{lang} syntax error: nesting too deep", pos,
                      help=f"a spec nests at most {MAX_DEPTH} levels deep")


def _scalar(loader, node) -> Any:
    try:
        return loader.construct_object(node)
    except (ValueError, OverflowError, TypeError):  # e.g. `2001-02-30`, `!!float abc`: keep the text
        return node.value


def _mark(node: yaml.Node, file: str) -> Position:
    start, end = node.start_mark, node.end_mark
    if end is None or (end.line, end.column) <= (start.line, start.column):
        return Position(file, start.line + 1, start.column + 1)
    return Position(file, start.line + 1, start.column + 1, end.line + 1, end.column + 1)


def _yaml_node(loader, node, path, file, values, keys, errors, depth=0):
    if depth > MAX_DEPTH:
        raise yaml.MarkedYAMLError(problem="nesting too deep", problem_mark=node.start_mark)
    loader.node_count = getattr(loader, "node_count", 0) + 1
    if loader.node_count > MAX_NODES:
        raise yaml.MarkedYAMLError(problem=f"the document expands to more than {MAX_NODES:,} values (aliases?)",
                                   problem_mark=node.start_mark)
    values[path] = _mark(node, file) if path else _mark(node, file).start()  # the document: its start only
    if isinstance(node, yaml.MappingNode):
        # `<<` merge keys: the merged entries come first; an explicit key overrides a merged one silently.
        # (An aliased mapping is visited again, already flattened: remember its explicit keys.)
        explicit = getattr(loader, "explicit_keys", None)
        if explicit is None:
            explicit = loader.explicit_keys = {}
        if id(node) not in explicit:
            explicit[id(node)] = {id(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"}
            loader.flatten_mapping(node)
        mine = explicit[id(node)]
        out: dict = {}
        merged: set = set()
        for knode, vnode in node.value:
            if not isinstance(knode, yaml.ScalarNode):
                raise yaml.MarkedYAMLError(problem="mapping keys must be plain scalars", problem_mark=knode.start_mark)
            key = _scalar(loader, knode)
            if not isinstance(key, str):
                key = str(key).lower() if isinstance(key, bool) else str(key)
            if id(knode) not in mine:
                merged.add(key)
            elif key in merged:
                merged.discard(key)
                out.pop(key)
            if key in out and key in merged:
                out.pop(key)  # several merged mappings define it: the later one wins, as in PyYAML
            if key in out:
                first = keys[path + (key,)]
                errors.append(
                    Diagnostic(
                        "E003",
                        f"duplicate key `{key}`",
                        _mark(knode, file),
                        help=f"`{key}` is already defined at line {first.line}; keep one",
                        labels=(Label(first, "first defined here"),),
                        path=path + (key,),
                        key=key,
                    )
                )
                continue
            keys[path + (key,)] = _mark(knode, file)
            out[key] = _yaml_node(loader, vnode, path + (key,), file, values, keys, errors, depth + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [
            _yaml_node(loader, item, path + (i,), file, values, keys, errors, depth + 1)
            for i, item in enumerate(node.value)
        ]
    value = _scalar(loader, node)
    # Dates and binary are not part of the spec language; keep them as text so validation reports a type error.
    if not isinstance(value, (str, int, float, bool, type(None))):
        value = str(value)
    return value


# ---------------------------------------------------------------- TOML

_TOML_ERR = re.compile(r"\(at line (\d+), column (\d+)\)")
_TOML_EOF = re.compile(r"\(at end of document\)")


def _load_toml(text: str, file: str) -> Document:
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise DiagnosticError([_too_deep("E002", "TOML", text, file)]) from None
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_ERR.search(msg)
        if m:
            line, col = int(m.group(1)), int(m.group(2))
        elif _TOML_EOF.search(msg):
            lines = text.rstrip("\n").split("\n")  # tomllib counts lines by "\n" only
            line, col = len(lines), len(lines[-1]) + 1
        else:
            line, col = 1, 1
        msg = _TOML_ERR.sub("", _TOML_EOF.sub("", msg)).strip()
        dup = "Cannot overwrite a value" in msg or "Cannot declare" in msg or "Duplicate inline table key" in msg
        if dup:
            pos, msg, first, key = _toml_duplicate(text, file, line, col, msg)
            raise DiagnosticError([Diagnostic(
                "E003", msg, pos, help="a key or table may be defined only once",
                labels=(Label(first, "first defined here"),) if first else (), key=key)]) from None
        raise DiagnosticError([Diagnostic(
            "E002", f"TOML syntax error: {msg}", Position(file, line, col),
            help="check `key = value` syntax, string quotes and brackets near this point")]) from None
    values: dict[PathT, Position] = {(): Position(file, 1, 1)}
    keys: dict[PathT, Position] = {}
    try:
        _TomlScanner(text, file, values, keys).scan()
    except Exception:  # noqa: BLE001, S110 (positions are best effort: a scanner gap must never hide diagnostics)
        pass
    return Document(data, file, text, values, keys)


_TOML_KEYVAL = re.compile(r"\s*(\[|[A-Za-z0-9_\-\"'][^=\n]*=)")


def _toml_duplicate(
    text: str, file: str, line: int, col: int, msg: str
) -> tuple[Position, str, Position | None, str | None]:
    """tomllib reports a duplicate where it stopped (after the value); point at the duplicate key instead,
    and (best effort) at its first definition. Returns (span of the duplicate, message, first, key)."""
    lines = [ln.rstrip("\r") for ln in text.split("\n")]  # tomllib counts lines by "\n" only
    if not 1 <= line <= len(lines):
        return Position(file, line, col), f"duplicate key: {msg}", None, None

    def span(ln: int, start: int, end: int) -> Position:  # 0-based columns on line `ln`
        return Position(file, ln, start + 1, ln, max(end, start + 1) + 1)

    m = re.search(r"Duplicate inline table key '(.*)'", msg)
    if m:
        key = m.group(1)
        here = lines[line - 1][: max(col - 1, 0)]
        hits = list(re.finditer(r"(?<![\w-])([\"']?" + re.escape(key) + r"[\"']?)\s*=", here))
        pos, first = Position(file, line, col), None
        if hits:
            pos = span(line, hits[-1].start(1), hits[-1].end(1))
        if len(hits) > 1:
            first = span(line, hits[-2].start(1), hits[-2].end(1))
        return pos, f"duplicate key `{key}` in an inline table", first, key
    m = re.search(r"Cannot declare \((.*)\) twice", msg)
    if m:
        src = lines[line - 1]
        name = ".".join(p.strip().strip("'\"") for p in m.group(1).split(",") if p.strip())
        first = None
        for i in range(line - 1, 0, -1):
            h = _TOML_HEADER.match(lines[i - 1])
            if h and _toml_name(h.group(2)) == name and not h.group(1).startswith("[["):
                first = span(i, h.start(1), h.end(1))
                break
        h = _TOML_HEADER.match(src)
        pos = span(line, h.start(1), h.end(1)) if h else Position(file, line, len(src) - len(src.lstrip()) + 1)
        return pos, f"duplicate key: table `[{name}]` is declared twice", first, name
    for i in range(line, 0, -1):
        src = lines[i - 1]
        if _TOML_KEYVAL.match(src):
            start = len(src) - len(src.lstrip())
            if src.lstrip().startswith("["):
                key = src.strip()
                h = _TOML_HEADER.match(src)
                pos = span(i, h.start(1), h.end(1)) if h else Position(file, i, start + 1)
                return pos, f"duplicate key: `{key}` is already defined", None, None
            key = src.strip().split("=")[0].strip()
            first = None
            for j in range(i - 1, 0, -1):
                prev = lines[j - 1]
                if re.match(r"\s*" + re.escape(key) + r"\s*=", prev):
                    k0 = len(prev) - len(prev.lstrip())
                    first = span(j, k0, k0 + len(key))
                    break
            return span(i, start, start + len(key)), f"duplicate key: `{key}` is already defined", first, key
    return Position(file, line, col), f"duplicate key: {msg}", None, None


_TOML_HEADER = re.compile(r"\s*(\[\[?\s*([^\]\n]*?)\s*\]\]?)")


def _toml_name(raw: str) -> str:
    return ".".join(p.strip().strip("'\"") for p in raw.split("."))


class _TomlScanner:
    """Walks valid TOML text recording where each key and value starts and ends (tomllib gives values only)."""

    def __init__(self, text: str, file: str, values: dict, keys: dict):
        self.s = text
        self.i = 0
        self.file = file
        self.values = values
        self.keys = keys
        self.array_counts: dict[PathT, int] = {}
        # line starts for offset -> (line, col)
        self.starts = [0] + [m.end() for m in re.finditer(r"\n", text)]

    def at(self, offset: int) -> Position:
        import bisect

        line = bisect.bisect_right(self.starts, offset)
        return Position(self.file, line, offset - self.starts[line - 1] + 1)

    def span(self, start: int, end: int) -> Position:
        a, b = self.at(start), self.at(max(end, start + 1))
        return Position(self.file, a.line, a.col, b.line, b.col)

    # -- low level
    def peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def skip_ws(self, newlines: bool = False) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def read_key_part(self) -> str:
        c = self.peek()
        if c in "\"'":
            return self.read_string()
        m = re.compile(r"[A-Za-z0-9_-]+").match(self.s, self.i)
        self.i = m.end()
        return m.group(0)

    def read_key(self) -> list[tuple[str, int, int]]:
        parts = []
        while True:
            self.skip_ws()
            start = self.i
            name = self.read_key_part()
            parts.append((name, start, self.i))
            self.skip_ws()
            if self.peek() == ".":
                self.i += 1
                continue
            return parts

    def read_string(self) -> str:
        q3 = self.peek(3)
        if q3 in ('"""', "'''"):
            end = self.s.index(q3, self.i + 3)
            while self.s[end + 3 : end + 4] == q3[0]:
                end += 1
            self.i = end + 3
            return ""
        q = self.peek()
        j = self.i + 1
        out = []
        while self.s[j] != q:
            if q == '"' and self.s[j] == "\\":
                out.append(self.s[j : j + 2])
                j += 2
                continue
            out.append(self.s[j])
            j += 1
        raw = "".join(out)
        self.i = j + 1
        if q == '"' and "\\" in raw:
            return tomllib.loads(f'x = "{raw}"')["x"]
        return raw

    # -- structure
    def scan(self) -> None:
        table: PathT = ()
        while True:
            self.skip_ws(newlines=True)
            if self.i >= len(self.s):
                return
            if self.peek(2) == "[[":
                start = self.i
                self.i += 2
                names = tuple(k for k, *_ in self.read_key())
                base = self._resolve(names[:-1]) + names[-1:]  # [[a.b]] under [[a]]: the latest a
                self.i = self.s.index("]]", self.i) + 2
                n = self.array_counts.get(base, 0)
                self.array_counts[base] = n + 1
                table = base + (n,)
                header = self.span(start, self.i)
                self.keys.setdefault(base, header)
                self.values.setdefault(base, header)
                self.values[table] = header
            elif self.peek() == "[":
                start = self.i
                self.i += 1
                parts = self.read_key()
                self.i = self.s.index("]", self.i) + 1
                table = self._resolve(tuple(k for k, *_ in parts))
                self.keys.setdefault(table, self.span(parts[-1][1], parts[-1][2]))
                self.values.setdefault(table, self.span(start, self.i))
            else:
                self.key_value(table)

    def _resolve(self, keys: PathT) -> PathT:
        """A table header path, with array-of-tables segments pointing at their latest element."""
        out: PathT = ()
        for k in keys:
            out = out + (k,)
            if out in self.array_counts:
                out = out + (self.array_counts[out] - 1,)
        return out

    def key_value(self, table: PathT) -> None:
        parts = self.read_key()
        path = table
        for k, start, end in parts:
            path = path + (k,)
            self.keys.setdefault(path, self.span(start, end))
        self.skip_ws()
        assert self.peek() == "="
        self.i += 1
        self.skip_ws()
        self.value(path)

    def value(self, path: PathT) -> None:
        start = self.i
        self.values[path] = self.at(start)
        self._value(path)
        self.values[path] = self.span(start, self.i)

    def _value(self, path: PathT) -> None:
        c = self.peek()
        if c in "\"'":
            self.read_string()
        elif c == "[":
            self.i += 1
            n = 0
            while True:
                self.skip_ws(newlines=True)
                if self.peek() == "]":
                    self.i += 1
                    return
                self.value(path + (n,))
                n += 1
                self.skip_ws(newlines=True)
                if self.peek() == ",":
                    self.i += 1
        elif c == "{":
            self.i += 1
            while True:
                self.skip_ws()
                if self.peek() == "}":
                    self.i += 1
                    return
                self.key_value(path)
                self.skip_ws()
                if self.peek() == ",":
                    self.i += 1
        else:
            m = re.compile(r"[^,\]\}\s#]+( [0-9:.+\-Z]+)?").match(self.s, self.i)
            self.i = m.end() if m else self.i + 1
