"""Loading: source text -> plain data plus a position for every node.

YAML goes through a composer of ours (which keeps marks and enforces the limits of `limits.py` while it
composes: nesting depth, and the number of values with aliases and `<<` merge keys counted before anything is
expanded) over libyaml's event parser when PyYAML has it (PyYAML's own parser otherwise, and for the messages
of syntax errors, which `syntax.py` points where the mistake is); TOML values come from `tomllib` and their
positions from a small scanner that walks the same text. Both give a `Document`: the plain data and, for
every path into it (a tuple of keys and list indices), where its key and its value stand in the file: a
`Position` with the start and the end of the node's text (a span).
"""

from __future__ import annotations

import bisect
import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from . import codes
from .diagnostics import Diagnostic, DiagnosticError, Label, Position
from .limits import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES, power_of_two
from .syntax import toml_error, yaml_error

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
    # Through `--set KEY=null`: for a key an override removed, where that argument names it (a diagnostic
    # about the missing key then shows why it is missing).
    removed: dict[PathT, Position] = dataclasses.field(default_factory=dict)
    # Through `extends`: a key an extending spec set to null that no base spec has (it removes nothing), where
    # that key stands; validation checks that it is a key its section has (a misspelt one is E010).
    nulls: dict[PathT, Position] = dataclasses.field(default_factory=dict)

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


def load_text(text: str, file: str, root_span: bool = False) -> Document:
    """The document in `text` (TOML when `file` ends in .toml, else YAML). Its root value's position is its
    start only (a whole file is not underlined), unless `root_span`: a YAML value that stands on its own in
    a line, such as a `--set` VALUE, is underlined whole."""
    suffix = Path(file).suffix.lower()
    if len(text) > MAX_FILE_BYTES and len(text.encode("utf-8", errors="surrogatepass")) > MAX_FILE_BYTES:
        raise DiagnosticError([too_large(file, len(text.encode("utf-8", errors="surrogatepass")))])
    if suffix == ".toml":
        return _load_toml(text, file)
    return _load_yaml(text, file, root_span)


def too_large(file: str, size: int | None) -> Diagnostic:
    """E006 for a file over MAX_FILE_BYTES (`size` None: not known, the file was read up to the limit)."""
    what = f"{size:,} bytes" if size is not None else f"more than {MAX_FILE_BYTES:,} bytes"
    return Diagnostic(codes.E006, f"the spec file is too large: {what} (at most {MAX_FILE_BYTES:,}, 1 MiB)",
                      Position(file, 1, 1),
                      help="a spec describes a model in a few kilobytes: use `repeat` for repeated blocks, "
                      "and keep data out of the spec")


def read_limited(path: str | Path) -> bytes:
    """The bytes of a file, or DiagnosticError E006 when it holds more than MAX_FILE_BYTES (read no further)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        size = None
    if size is not None and size > MAX_FILE_BYTES and p.is_file():
        raise DiagnosticError([too_large(str(path), size)])
    with open(p, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise DiagnosticError([too_large(str(path), None)])
    return raw


def read_source(path: str | Path) -> str:
    """A file's text for showing source excerpts: at most MAX_FILE_BYTES of it, undecodable bytes replaced."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES)
    except OSError:
        return ""
    return raw.decode("utf-8", errors="replace").removeprefix("\ufeff")


def load_file(path: str | Path) -> Document:
    p = Path(path)
    raw = read_limited(p)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        # A broken spec like any other (exit 1 with a position), not a usage error.
        before = raw[: e.start].decode("utf-8", errors="replace")
        line = before.count("\n") + 1
        col = len(before) - (before.rfind("\n") + 1) + 1
        toml = p.suffix.lower() == ".toml"
        raise DiagnosticError([Diagnostic(
            codes.E002 if toml else codes.E001,
            f"{'TOML' if toml else 'YAML'} syntax error: the file is not UTF-8 text (byte 0x{raw[e.start]:02x})",
            Position(str(path), line, col), help="save the file as UTF-8")]) from None
    text = text.removeprefix("\ufeff")
    return load_text(text, str(path))


# ---------------------------------------------------------------- YAML

_MERGE = "tag:yaml.org,2002:merge"
_INT = "tag:yaml.org,2002:int"
_SURROGATE = re.compile("[\ud800-\udfff]")
_CORE = "tag:yaml.org,2002:"
_TAGS = {_CORE + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge")}  # tags a spec may write


class _Refused(yaml.MarkedYAMLError):
    """A YAML error of ours (E001), with its own help line."""

    def __init__(self, problem: str, mark, help: str):
        super().__init__(problem=problem, problem_mark=mark)
        self.help = help


class _Limit(Exception):
    """A limit passed while composing: code, message, where, help."""

    def __init__(self, code: str, message: str, mark, help: str):
        super().__init__(message)
        self.code, self.message, self.mark, self.help = code, message, mark, help


def _too_many(mark) -> _Limit:
    return _Limit(codes.E006, f"the document expands to more than {MAX_NODES:,} values (aliases and merge keys "
                  "expanded)", mark, f"a spec holds at most {MAX_NODES:,} values; aliases count once per use")


def _too_deep_here(mark, alias: bool = False) -> _Limit:
    return _Limit(codes.E006, "nesting too deep" + (" (through an alias)" if alias else ""), mark,
                  f"a spec nests at most {MAX_DEPTH} levels deep")


class _LimitedComposer(Composer):
    """PyYAML's composer, keeping count: every node gets `size` (the values of its subtree once every alias in
    it is expanded) and `height`; the expanded size of the document and its expanded depth are checked as each
    node or alias is met, so that neither recursion nor expansion (`*a` repeated, `<<: [*a, *a]` chains) ever
    gets past the limits. A lone surrogate (`"\\ud800"`) is refused where it stands."""

    def compose_document(self):
        self.depth = 0
        self.total = 0
        return super().compose_document()

    def _count(self, n: int, mark) -> None:
        self.total += n
        if self.total > MAX_NODES:
            raise _too_many(mark)

    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None:
                size = getattr(node, "size", None)
                if size is None:  # the alias stands inside the node it names
                    raise _Refused(f"alias *{event.anchor} refers to a node that contains it", event.start_mark,
                                   "an alias names a whole node written before it, not one it stands in")
                if self.depth + node.height > MAX_DEPTH:
                    raise _too_deep_here(event.start_mark, alias=True)
                self._count(size, event.start_mark)
            return super().compose_node(parent, index)  # (an undefined alias: PyYAML's error)
        event = self.peek_event()
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _too_deep_here(event.start_mark)
        if not (index is None and isinstance(parent, MappingNode)):  # (keys are not values)
            self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        return node

    def _check_tag(self, event) -> None:
        """A tag other than YAML's own for strings, numbers, booleans, null, lists and mappings (`!!binary`,
        `!!set`, `!!python/object:...`, `!foo`) is refused where it stands: ignored, it would change nothing
        on a mapping or list, and turn a scalar into the text of some other type."""
        tag = event.tag
        if tag is not None and tag != "!" and tag not in _TAGS:
            shown = "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag
            raise _Refused(f"the tag `{shown}` is not supported", event.start_mark,
                           "remove the tag: a spec holds strings, numbers, booleans, null, lists and mappings "
                           "(`!!str` makes a value a string)")

    def compose_sequence_node(self, anchor):
        self._check_tag(self.peek_event())
        node = super().compose_sequence_node(anchor)
        node.size = 1 + sum(item.size for item in node.value)
        node.height = 1 + max((item.height for item in node.value), default=0)
        return node

    def compose_mapping_node(self, anchor):
        self._check_tag(self.peek_event())
        node = super().compose_mapping_node(anchor)
        node.size = 1 + sum(v.size for _, v in node.value)
        node.height = 1 + max((max(k.height, v.height) for k, v in node.value), default=0)
        return node

    def compose_scalar_node(self, anchor):
        event = self.peek_event()
        self._check_tag(event)
        m = _SURROGATE.search(event.value)
        if m:
            raise _Refused(f"\\u{ord(m.group()):04x} is not a Unicode character (a lone surrogate)",
                           event.start_mark, "write the character itself, or escape a whole one (\\U0001F600)")
        node = super().compose_scalar_node(anchor)
        node.size, node.height = 1, 1
        return node


class _SpecLoader(_LimitedComposer, yaml.SafeLoader):
    """PyYAML's safe loader with our composer, reading `1e-3` as a float (YAML 1.2, and TOML, do; YAML 1.1
    wants `1.0e-3`)."""


# YAML 1.1's numbers without its surprises: `1:20` (base 60) and `017` (octal) are not numbers (the text
# then fails the type check, as in YAML 1.2); `0x1F`, `0o17`, `0b101` and `1_000` are, as in TOML.
_SpecLoader.yaml_implicit_resolvers = {
    c: [(tag, r) for tag, r in rs if tag not in (_CORE + "int", _CORE + "float")]
    for c, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    _CORE + "int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o[0-7_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(?:0|[1-9][0-9_]*))$"),
    list("-+0123456789"),
)
_SpecLoader.add_implicit_resolver(
    _CORE + "float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)

try:  # libyaml's parser (C, tens of times faster) feeding the same composer, resolver and constructor
    from yaml._yaml import CParser

    class _FastLoader(_LimitedComposer, CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        yaml_implicit_resolvers = _SpecLoader.yaml_implicit_resolvers

        def __init__(self, stream):
            CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            Composer.__init__(self)

    _LOADERS: tuple = (_FastLoader, _SpecLoader)
except ImportError:  # pragma: no cover (PyYAML without libyaml)
    _LOADERS = (_SpecLoader,)


# A syntax error found by libyaml is explained by PyYAML's own parser (its established words and positions)
# in files up to this size; in larger ones (where PyYAML would take seconds) libyaml's report is used.
PYTHON_REPARSE_CHARS = 1 << 17


def _load_yaml(text: str, file: str, root_span: bool = False) -> Document:
    if len(_LOADERS) > 1:
        try:
            return _compose_yaml(_LOADERS[0], text, file, report=len(text) > PYTHON_REPARSE_CHARS,
                                 root_span=root_span)
        except (yaml.YAMLError, UnicodeError, ValueError) as e:
            if "maximum nesting depth" in str(e):
                # libyaml refuses flow nesting past 1000 levels before composing anything; PyYAML's scanner
                # takes quadratic time on it: ours stops at MAX_DEPTH within the first levels.
                _deep_prefix(text, file)
    return _compose_yaml(_LOADERS[-1], text, file, report=True, root_span=root_span)


def _deep_prefix(text: str, file: str) -> None:
    """Raises the E006 our composer gives for the text up to where its flow nesting reaches 2 * MAX_DEPTH."""
    depth = 0
    for m in re.finditer(r"[\[\]{}]", text):
        depth += 1 if m.group() in "[{" else -1
        if depth >= 2 * MAX_DEPTH:
            try:
                _compose_yaml(_LOADERS[-1], text[: m.end()], file, report=True)
            except DiagnosticError as e:
                if e.diagnostics[0].code == codes.E006:
                    raise
            return


def _compose_yaml(loader_class, text: str, file: str, report: bool = False, root_span: bool = False) -> Document:
    values: dict[PathT, Position] = {}
    keys: dict[PathT, Position] = {}
    errors: list[Diagnostic] = []
    try:
        loader = loader_class(text)
        try:
            node = loader.get_single_node()
            if node is None:
                data: Any = None
                values[()] = Position(file, 1, 1)
            else:
                loader.merged = {}
                data = _yaml_node(loader, node, (), file, values, keys, errors)
                if root_span:
                    values[()] = _mark(node, file)
        finally:
            loader.dispose()
    except _Limit as e:
        mark = e.mark
        raise DiagnosticError([Diagnostic(e.code, e.message, Position(file, mark.line + 1, mark.column + 1),
                                          help=e.help)]) from None
    except yaml.MarkedYAMLError as e:
        if not report:
            raise
        raise DiagnosticError([yaml_error(e, text, file)]) from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (control characters)
        if not report:
            raise
        before = text[: e.position]
        line, col = before.count("\n") + 1, e.position - (before.rfind("\n") + 1) + 1
        what = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        raise DiagnosticError([Diagnostic(
            codes.E001, f"YAML syntax error: unacceptable character {what}: {e.reason}", Position(file, line, col),
            help="remove the control character, or quote and escape it in a double-quoted string")]) from None
    except yaml.YAMLError as e:
        if not report:
            raise
        raise DiagnosticError([Diagnostic(codes.E001, f"YAML syntax error: {e}", Position(file, 1, 1))]) from None
    except RecursionError:  # (the composer's depth limit comes first; kept as a last guard)
        raise DiagnosticError([Diagnostic(codes.E006, "nesting too deep", Position(file, 1, 1),
                                          help=f"a spec nests at most {MAX_DEPTH} levels deep")]) from None
    if errors:
        raise DiagnosticError(errors)
    return Document(data, file, text, values, keys)


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


def _key(loader, knode) -> str:
    if not isinstance(knode, ScalarNode):
        raise yaml.MarkedYAMLError(problem="mapping keys must be plain scalars", problem_mark=knode.start_mark)
    # A key is its text as written: `on:` is the key "on" (not YAML 1.1's true), `~:` "~" (not null), `0x1F:`
    # "0x1F" (not 31), `=` (YAML 1.1's value key) "=".
    return knode.value


def _entries(loader, node) -> list[tuple[str, Any, Any, bool]]:
    """A mapping's entries with `<<` merge keys resolved as YAML defines them: (key, key node, value node,
    merged). Merged entries come first; an explicit key overrides a merged one; of several merged mappings
    (`<<: [*a, *b]`) the earlier wins. Memoised per node, so that shared mappings are resolved once."""
    memo = loader.merged
    if id(node) in memo:
        return memo[id(node)][1]
    explicit: list[tuple[str, Any, Any, bool]] = []
    sources = []
    for knode, vnode in node.value:
        if isinstance(knode, ScalarNode) and knode.tag == _MERGE:
            items = vnode.value if isinstance(vnode, SequenceNode) else [vnode]
            for s in items:
                if not isinstance(s, MappingNode):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"expected a mapping or list of mappings for merging, but found {s.id}", s.start_mark)
                sources.append(s)
        else:
            explicit.append((_key(loader, knode), knode, vnode, False))
    mine = {k for k, *_ in explicit}
    merged: dict[str, tuple[str, Any, Any, bool]] = {}
    for s in sources:
        for key, knode, vnode, _ in _entries(loader, s):
            if key not in mine and key not in merged:
                merged[key] = (key, knode, vnode, True)
    out = list(merged.values()) + explicit
    memo[id(node)] = (node, out)  # (the node too: its id must not be reused while the memo lives)
    return out


def _yaml_node(loader, node, path, file, values, keys, errors, depth=0):
    if depth > MAX_DEPTH:  # (the composer stops this first; kept as a guard)
        raise _too_deep_here(node.start_mark)
    loader.node_count = getattr(loader, "node_count", 0) + 1
    if loader.node_count > MAX_NODES:  # (likewise)
        raise _too_many(node.start_mark)
    values[path] = _mark(node, file) if path else _mark(node, file).start()  # the document: its start only
    if isinstance(node, MappingNode):
        out: dict = {}
        for key, knode, vnode, _merged in _entries(loader, node):
            if key in out:  # (only explicit keys can repeat: a merged one is dropped when a later key has it)
                first = keys[path + (key,)]
                errors.append(
                    Diagnostic(
                        codes.E003,
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
    if isinstance(node, SequenceNode):
        return [
            _yaml_node(loader, item, path + (i,), file, values, keys, errors, depth + 1)
            for i, item in enumerate(node.value)
        ]
    value = _scalar(loader, node)
    if node.tag == _INT and isinstance(value, str):  # more digits than Python converts (4,300)
        errors.append(Diagnostic(
            codes.E015, f"integer of {len(node.value):,} characters is out of range (sizes and counts are below "
            f"{power_of_two(2**53)})", _mark(node, file), help="write a smaller number", path=path))
        return None
    # Dates and binary are not part of the spec language; keep them as text so validation reports a type error.
    if not isinstance(value, (str, int, float, bool, type(None))):
        value = str(value)
    return value


# ---------------------------------------------------------------- TOML

_TOML_ERR = re.compile(r"\(at line (\d+), column (\d+)\)")
_TOML_EOF = re.compile(r"\(at end of document\)")


def _too_deep(text: str, file: str) -> Diagnostic:
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
    return Diagnostic(codes.E006, "nesting too deep", pos, help=f"a spec nests at most {MAX_DEPTH} levels deep")


# The places a TOML value can start (after `=`, `,`, `[`, `{`), strings and comments skipped: counted before
# parsing, so that a file of a million values is refused without parsing it (their count bounds the values).
# A dotted key of very many parts (`a.a.a...`) costs tomllib time and memory quadratic in its length: refused
# first (a chain of more than MAX_DEPTH parts but not many more is found, at its part past MAX_DEPTH, later).
# (Possessive quantifiers and a bare-word token keep the scan linear however long a word or string is.)
_TOML_CHAIN = r'(?P<chain>(?>(?:(?:[A-Za-z0-9_-]++|"[^"\\\n]*+"|\'[^\'\n]*+\')[ \t]*+\.[ \t]*+){%d,}))' % (
    10 * MAX_DEPTH)
# (A string never closed is taken to the end of its line, or of the text: one token, not one per quote.)
_TOML_TOKENS = re.compile(_TOML_CHAIN + r'|[A-Za-z0-9_-]++|"""[\s\S]*?(?:"""|\Z)|\'\'\'[\s\S]*?(?:\'\'\'|\Z)'
                          r'|"(?:[^"\\\n]++|\\.)*+"?|\'[^\'\n]*+\'?|#[^\n]*+|[=,\[{]')


def _toml_precount(text: str, file: str) -> None:
    n = 0
    for m in _TOML_TOKENS.finditer(text):
        if m.group("chain"):
            before = text[: m.start()]
            line, col = before.count("\n") + 1, m.start() - (before.rfind("\n") + 1) + 1
            raise DiagnosticError([Diagnostic(
                codes.E006, f"nesting too deep: a dotted key of more than {10 * MAX_DEPTH:,} parts",
                Position(file, line, col), help=f"a spec nests at most {MAX_DEPTH} levels deep")])
        if len(m.group()) == 1:
            n += 1
            if n > MAX_NODES:
                before = text[: m.start()]
                line, col = before.count("\n") + 1, m.start() - (before.rfind("\n") + 1) + 1
                raise DiagnosticError([Diagnostic(
                    codes.E006, f"the document holds more than {MAX_NODES:,} values", Position(file, line, col),
                    help=f"a spec holds at most {MAX_NODES:,} values")])


def _load_toml(text: str, file: str) -> Document:
    _toml_precount(text, file)
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise DiagnosticError([_too_deep(text, file)]) from None
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_ERR.search(msg)
        at_end = m is None and _TOML_EOF.search(msg) is not None
        if m:
            line, col = int(m.group(1)), int(m.group(2))
        elif at_end:
            lines = text.rstrip("\n").split("\n")  # tomllib counts lines by "\n" only
            line, col = len(lines), len(lines[-1]) + 1
        else:
            line, col = 1, 1
        msg = _TOML_ERR.sub("", _TOML_EOF.sub("", msg)).strip()
        dup = "Cannot overwrite a value" in msg or "Cannot declare" in msg or "Duplicate inline table key" in msg
        dup = dup or "Cannot mutate immutable namespace" in msg
        if dup:
            pos, msg, first, key = _toml_duplicate(text, file, line, col, msg)
            inline = "is an inline table" in msg or "is an array" in msg
            help = ("write all of its keys inside its `{ ... }`, or make it a [table]" if "is an inline table" in msg
                    else "write all of its entries inside its `[ ... ]`, or make every entry a [[table]]" if inline
                    else "a key or table may be defined only once")
            raise DiagnosticError([Diagnostic(
                codes.E003, msg, pos, help=help,
                labels=(Label(first, "written whole here" if inline else "first defined here"),) if first else (),
                key=key)]) from None
        raise DiagnosticError([toml_error(text, file, Position(file, line, col), at_end, msg)]) from None
    except ValueError as e:
        # Python refuses to convert an integer of more than 4,300 digits.
        m = next((m for m in re.finditer(r"[0-9][0-9_]*+", text) if len(m.group()) > 4000), None)
        if m is None:
            raise DiagnosticError([Diagnostic(codes.E002, f"TOML syntax error: {e}", Position(file, 1, 1))]) from None
        before = text[: m.start()]
        line, col = before.count("\n") + 1, m.start() - (before.rfind("\n") + 1) + 1
        raise DiagnosticError([Diagnostic(
            codes.E015, f"integer of {len(m.group()):,} characters is out of range (sizes and counts are below "
            f"{power_of_two(2**53)})", Position(file, line, col), help="write a smaller number")]) from None
    values: dict[PathT, Position] = {(): Position(file, 1, 1)}
    keys: dict[PathT, Position] = {}
    scanner = _TomlScanner(text, file, values, keys)
    try:
        scanner.scan()
    except _Limit as e:
        raise DiagnosticError([Diagnostic(e.code, e.message, scanner.too_deep, help=e.help)]) from None
    except Exception:  # noqa: BLE001, S110 (positions are best effort: a scanner gap must never hide diagnostics)
        pass
    doc = Document(data, file, text, values, keys)
    _toml_limits(doc)
    return doc


def _toml_limits(doc: Document) -> None:
    """E006 when a TOML document nests deeper than MAX_DEPTH (dotted keys and table headers nest without
    brackets) or holds more than MAX_NODES values; at the first node past the limit."""
    count = 0
    stack: list[tuple[PathT, Any]] = [((), doc.data)]
    while stack:
        path, value = stack.pop()
        count += 1
        if len(path) > MAX_DEPTH:
            raise DiagnosticError([Diagnostic(codes.E006, "nesting too deep", doc.pos(path, key=True),
                                              help=f"a spec nests at most {MAX_DEPTH} levels deep")])
        if count > MAX_NODES:
            raise DiagnosticError([Diagnostic(
                codes.E006, f"the document holds more than {MAX_NODES:,} values", doc.pos(path),
                help=f"a spec holds at most {MAX_NODES:,} values")])
        if isinstance(value, dict):
            stack.extend((path + (k,), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((path + (i,), v) for i, v in reversed(list(enumerate(value))))


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
    m = re.search(r"Cannot (declare|mutate immutable namespace) \((.*?)\)( twice)?$", msg)
    if m:
        src = lines[line - 1]
        names = [p.strip().strip("'\"") for p in m.group(2).split(",") if p.strip()]
        name = ".".join(names)
        h = _TOML_HEADER.match(src)
        if h:
            pos = span(line, h.start(1), h.end(1))
        else:  # a dotted key (`a.y = 2`): the key
            start = len(src) - len(src.lstrip())
            pos = span(line, start, start + len(src.split("=")[0].rstrip()) - start)
        first = None
        for i in range(line - 1, 0, -1):
            h = _TOML_HEADER.match(lines[i - 1])
            if h and _toml_name(h.group(2)) == name and not h.group(1).startswith("[["):
                first = span(i, h.start(1), h.end(1))
                break
        if first is None:  # an inline table or array (`a = {x = 1}`) that the line goes on to extend
            for n in range(len(names), 0, -1):
                found = _toml_written_whole(lines, line, names[n - 1])
                if found is not None:
                    where, kind = found
                    whole = ".".join(names[:n])
                    return pos, (
                        f"duplicate key: `{whole}` is {kind}, written whole at line {where[0]}: it cannot be "
                        "extended afterwards"), span(*where), whole
        if m.group(1) != "declare":
            return pos, f"duplicate key: `{name}` cannot be extended here", None, name
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


def _toml_written_whole(lines: list[str], line: int, key: str) -> tuple[tuple[int, int, int], str] | None:
    """Where `key = {` or `key = [` stands on a line before `line` (the nearest): ((line, start, end) of the
    key, "an inline table" or "an array"), or None."""
    pattern = re.compile(r"(?:^|[\s.{,])([\"']?" + re.escape(key) + r"[\"']?)\s*=\s*([\[{])")
    for i in range(line - 1, 0, -1):
        found = pattern.search(lines[i - 1])
        if found:
            return (i, found.start(1), found.end(1)), "an inline table" if found.group(2) == "{" else "an array"
    return None


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

    def _line_col(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.starts, offset)
        return line, offset - self.starts[line - 1] + 1

    def at(self, offset: int) -> Position:
        return Position(self.file, *self._line_col(offset))

    def span(self, start: int, end: int) -> Position:
        return Position(self.file, *self._line_col(start), *self._line_col(max(end, start + 1)))

    # -- low level
    def peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    _BASIC = re.compile(r'"((?:[^"\\\n]++|\\.)*+)"')
    _LITERAL = re.compile(r"'([^'\n]*)'")
    _WS = re.compile(r"[ \t]*(?:#[^\n]*)?")
    _WS_NL = re.compile(r"[ \t\r\n]*(?:#[^\n]*[ \t\r\n]*)*")

    def skip_ws(self, newlines: bool = False) -> None:
        self.i = (self._WS_NL if newlines else self._WS).match(self.s, self.i).end()

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

    def read_string(self, decode: bool = True) -> str:
        q3 = self.peek(3)
        if q3 in ('"""', "'''"):
            end = self.s.index(q3, self.i + 3)
            while self.s[end + 3 : end + 4] == q3[0]:
                end += 1
            self.i = end + 3
            return ""
        q = self.peek()
        m = (self._BASIC if q == '"' else self._LITERAL).match(self.s, self.i)
        raw = m.group(1)
        self.i = m.end()
        if decode and q == '"' and "\\" in raw:
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
                parts = self.read_key()
                if len(parts) > MAX_DEPTH:
                    self._depth(tuple(k for k, *_ in parts), parts[MAX_DEPTH][1], parts[MAX_DEPTH][2])
                names = tuple(k for k, *_ in parts)
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
                if len(parts) > MAX_DEPTH:
                    self._depth(tuple(k for k, *_ in parts), parts[MAX_DEPTH][1], parts[MAX_DEPTH][2])
                table = self._resolve(tuple(k for k, *_ in parts))
                self.keys.setdefault(table, self.span(parts[-1][1], parts[-1][2]))
                self.values.setdefault(table, self.span(start, self.i))
            else:
                self.key_value(table)

    def _depth(self, path: PathT, start: int, end: int) -> None:
        """Stops at a key nested deeper than MAX_DEPTH (paths would grow quadratically): `too_deep` says where."""
        if len(path) > MAX_DEPTH:
            self.too_deep = self.span(start, end)
            raise _Limit(codes.E006, "nesting too deep", None, f"a spec nests at most {MAX_DEPTH} levels deep")

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
            self._depth(path, start, end)
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
            self.read_string(decode=False)
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
