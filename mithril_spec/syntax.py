"""Syntax errors where the mistake is, not where the parser gave up.

PyYAML and tomllib report the place they stopped. For the commonest mistakes that place is after the
mistake, often lines later: a bracket, brace or quote never closed is noticed at the next key or at the end
of the file, a key missing its `:` (`=`) at the next line. Here such errors get their primary span where
the construct opens (the bracket, the quote, the key) and a secondary label where the parser stopped.
PyYAML's `context_mark` is where the construct it was reading opened; tomllib gives only a message and a
position, so a small scanner of ours (strings and comments skipped) finds the bracket or quote open there.
Every other error keeps the parser's position and words.
"""

from __future__ import annotations

import bisect
import dataclasses
import re

from . import codes
from .diagnostics import Diagnostic, Label, Position

STOPPED = "the parser stopped here"
_PAIRS = {"[": "]", "{": "}"}


class _Text:
    """A file's text with its line starts: offsets <-> positions, lines counted by "\\n" as the renderer
    and tomllib count them."""

    def __init__(self, text: str, file: str):
        self.text, self.file = text, file
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def offset(self, line: int, col: int) -> int:
        """The offset of a 1-based line and column, kept within the text."""
        line = min(max(line, 1), len(self.starts))
        return min(self.starts[line - 1] + max(col, 1) - 1, len(self.text))

    def pos(self, start: int, end: int | None = None) -> Position:
        """The position of `text[start:end]` (a point when `end` is None)."""
        line = bisect.bisect_right(self.starts, start)
        col = start - self.starts[line - 1] + 1
        if end is None:
            return Position(self.file, line, col)
        end_line = bisect.bisect_right(self.starts, max(end, start + 1))
        return Position(self.file, line, col, end_line, max(end, start + 1) - self.starts[end_line - 1] + 1)

    def line_end(self, offset: int) -> int:
        end = self.text.find("\n", offset)
        return len(self.text) if end < 0 else end


def _closers(tokens: re.Pattern, text: str, start: int) -> dict[int, int]:
    """For each bracket from the one at `start` on, the offset of the bracket that closes it; one never
    closed is absent: the text ends, or a different bracket closes first (`[1, 2}`: then no bracket still
    open is closed). One pass, however deep the nesting. Strings and comments are single tokens of
    `tokens`, so that brackets in them do not count."""
    stack: list[tuple[str, int]] = []
    out: dict[int, int] = {}
    for m in tokens.finditer(text, start):
        t = m.group()
        if t in _PAIRS:
            stack.append((t, m.start()))
        elif t in ("]", "}"):
            if not stack or _PAIRS[stack[-1][0]] != t:
                return out
            out[stack.pop()[1]] = m.start()
            if not stack:
                return out
    return out


def _uncommented(line: str) -> str:
    """A line without its comment (`#` at its start or after a space) and trailing spaces."""
    m = re.search(r"(?:^|[ \t])#", line)
    return (line[: m.start()] if m else line).rstrip()


# ---------------------------------------------------------------- YAML

# A flow collection's tokens: quoted strings (only where a token may start: a quote inside a plain word,
# `it's`, is text), comments (after a space) and brackets. Possessive quantifiers keep the scan linear.
_YAML_TOKENS = re.compile(
    r"(?<![^\s\[{,:])(?:\"(?:[^\"\\]++|\\[\s\S]?)*+\"?|'(?:[^']++|'')*+'?)|(?<!\S)#[^\n]*+|[\[\]{}]")
_FLOW = {"while parsing a flow mapping": "{", "while parsing a flow sequence": "["}
_YAML_HELP = "check indentation (spaces, not tabs), brackets and quotes near this point"


@dataclasses.dataclass
class _YamlFailure:
    """What PyYAML said, in positions: where the parser stopped, where the construct it read opened."""

    t: _Text
    problem: str
    context: str
    opened: int | None  # offset where the construct opened (PyYAML's context mark), if any
    stop: Position  # where the parser stopped (just after the last line when the file ended)
    stop_at: int  # its offset
    at_end: bool  # the parser stopped at the end of the file


def yaml_error(e, text: str, file: str) -> Diagnostic:
    """E001 for a PyYAML (or libyaml) error `e`, pointing at the mistake where it can be told apart."""
    t = _Text(text, file)
    mark = e.problem_mark or e.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    lines = text.splitlines()
    at_end = bool(lines) and line > len(lines)
    if at_end:  # at the end of the stream: point just after the last line
        line, col = len(lines), len(lines[-1]) + 1
    ctx = e.context_mark if e.problem_mark is not None else None
    f = _YamlFailure(t, (e.problem or "invalid YAML").strip(), (e.context or "").strip(),
                     t.offset(ctx.line + 1, ctx.column + 1) if ctx is not None else None,
                     Position(file, line, col), t.offset(line, col), at_end)
    for explain in (_unclosed_quote, _unclosed_flow, _key_without_colon, _plain_line_key, _tab):
        d = explain(f)
        if d is not None:
            return d
    msg = f"{f.problem} ({f.context})" if f.context else f.problem
    help = getattr(e, "help", None) or _YAML_HELP
    labels: tuple[Label, ...] = ()
    if f.context and f.opened is not None and t.pos(f.opened) != f.stop:
        what = re.sub(r"^while (parsing|scanning|constructing) ", "", f.context)
        labels = (Label(t.pos(f.opened), f"{what} starts here"),)
    return Diagnostic(codes.E001, f"YAML syntax error: {msg}", f.stop, help=help, labels=labels)


def _unclosed_quote(f: _YamlFailure) -> Diagnostic | None:
    """A quoted string never closed runs to the end of the file: point at its opening quote."""
    if "quoted scalar" not in f.context or "end of stream" not in f.problem or f.opened is None:
        return None
    return Diagnostic(
        codes.E001, "YAML syntax error: a quoted string is never closed", f.t.pos(f.opened, f.opened + 1),
        help="close the quote (a string that contains a quote is written \"a \\\"b\\\" c\" or 'a ''b'' c')",
        labels=(Label(f.stop, "the file ends before its closing quote"),))


def _unclosed_flow(f: _YamlFailure) -> Diagnostic | None:
    """A `{` or `[` never closed: the parser reads on to the next key (or the end of the file) before it
    objects. Only when our scan finds no closing bracket: `{a: 1 b: 2}` is closed, its mistake inside."""
    opener = _FLOW.get(f.context)
    text = f.t.text
    if opener is None or f.opened is None or text[f.opened : f.opened + 1] != opener:
        return None
    if f.opened in _closers(_YAML_TOKENS, text, f.opened):
        return None
    stopped = f"the file ends before the `{opener}` is closed" if f.at_end else STOPPED
    return Diagnostic(
        codes.E001, f"YAML syntax error: this `{opener}` is never closed ({f.problem})", f.t.pos(f.opened, f.opened + 1),
        help=f"close the `{opener}` opened here with `{_PAIRS[opener]}`", labels=(Label(f.stop, stopped),))


def _key_line(f: _YamlFailure, start: int) -> tuple[int, int, str]:
    """The text of the line from `start` (a key), without a comment or trailing spaces: (start, end, text)."""
    raw = _uncommented(f.t.text[start : f.t.line_end(start)])
    return start, start + len(raw), raw


def _suggest(line: str) -> str | None:
    """`key: value` for a short line `key value` that lacks its `:`."""
    words = line.split(None, 1)
    if not words or len(line) > 80 or ":" in line:
        return None
    return f"{words[0]}: {words[1]}" if len(words) == 2 else f"{words[0]}:"


def _missing_colon(f: _YamlFailure, start: int, end: int, key: str) -> Diagnostic:
    better = _suggest(key)
    help = f"add `:` after the key: `{better}`" if better else "add `:` and a space after the key"
    return Diagnostic(codes.E001, f"YAML syntax error: a key without its `:` ({f.problem})", f.t.pos(start, end),
                      help=help, labels=(Label(f.stop, STOPPED),))


def _key_without_colon(f: _YamlFailure) -> Diagnostic | None:
    """`steps 20` among keys: PyYAML looks for the `:` of a key that starts there, and gives up a line
    later. Point at the key."""
    if "simple key" not in f.context or f.opened is None:
        return None
    start, end, key = _key_line(f, f.opened)
    if not key:
        return None
    return _missing_colon(f, start, end, key)


_KEY_VALUE = re.compile(r"[ \t]*(?:-[ \t]+)*[^\s#:][^\n]*?:(?=[ \t\n]|\Z)")  # a line `key: ...`, to its `:`


def _plain_line_key(f: _YamlFailure) -> Diagnostic | None:
    """`training` over an indented mapping: the word and the next line's key read as one text, which a
    `:` then ends ("mapping values are not allowed here" at the next line's `:`; a comment between them
    makes the mapping one too deep: "expected <block end>, but found '<block mapping start>'" at its key).
    Point at the word: the previous line, when it has no `:` of its own."""
    t = f.t
    here = bisect.bisect_right(t.starts, f.stop_at) - 1
    if "mapping values are not allowed" in f.problem and not f.context:
        m = _KEY_VALUE.match(t.text, t.starts[here])
        stop = m.end() - 1 if m else -1  # the first `:` of the line
    elif "found '<block mapping start>'" in f.problem:
        stop = re.compile(r"[ \t]*").match(t.text, t.starts[here]).end()  # the line's first word
    else:
        return None
    if here == 0 or stop != f.stop_at:
        return None
    prev = here - 1
    while prev >= 0 and re.fullmatch(r"[ \t\r]*(?:#.*)?", t.text[t.starts[prev] : t.line_end(t.starts[prev])]):
        prev -= 1  # blank lines and comments
    if prev < 0:
        return None
    line = t.text[t.starts[prev] : t.line_end(t.starts[prev])]
    lead = re.match(r"[ \t]*(?:-[ \t]+)*", line).end()
    start, end, key = _key_line(f, t.starts[prev] + lead)
    if not key or key[0] in "[{\"'&*!|>%@`" or re.search(r":(?:\s|$)", key):
        return None
    return _missing_colon(f, start, end, key)


def _tab(f: _YamlFailure) -> Diagnostic | None:
    """A tab where YAML wants spaces: say so (the position is already the tab)."""
    text = f.t.text
    if "cannot start any token" not in f.problem or text[f.stop_at : f.stop_at + 1] != "\t":
        return None
    line_start = f.t.starts[bisect.bisect_right(f.t.starts, f.stop_at) - 1]
    if text[line_start : f.stop_at].strip(" \t"):
        return None
    return Diagnostic(codes.E001, f"YAML syntax error: a tab indents this line ({f.problem})", f.stop,
                      help="indent with spaces: YAML does not allow tabs in indentation")


# ---------------------------------------------------------------- TOML

# TOML's tokens for finding brackets: strings of the four kinds (the group `c*` is the closing quote, absent
# when the string is never closed: a one-line string then ends at its line), comments, brackets, the
# separators where a key may start (newline, `,`; `{` is a bracket).
_TOML_TOKENS = re.compile(
    r'"""(?:[^\\"]++|\\[\s\S]?|"(?!""))*+(?P<c3>"""(?:""?)?)?'
    r"|'''(?:[^']++|'(?!''))*+(?P<c4>'''(?:''?)?)?"
    r'|"(?:[^"\\\n]++|\\.?)*+(?P<c1>")?'
    r"|'[^'\n]*+(?P<c2>')?"
    r"|#[^\n]*+|[\[\]{},\n]")
_ESCAPES = ("Unescaped '\\' in a string", "Invalid hex value", "Escaped character is not a Unicode scalar value")
_IN_STRING = ("Illegal character", "Unterminated string", "Expected \"'", "Found invalid character")
_TOML_HELP = "check `key = value` syntax, string quotes and brackets near this point"


@dataclasses.dataclass
class _TomlScan:
    """The state of the text where tomllib stopped, as our scan of the text before it finds it."""

    open: list[tuple[str, int, bool]]  # brackets open there, outermost first: bracket, offset, a table header
    inside: tuple[int, int] | None  # the string the stop falls in: start, end
    unclosed: tuple[int, int] | None  # the first string never closed before the stop: start, length of quote
    key_from: int  # just after the last newline, `{` or `,` before the stop: where a key may start


def _toml_scan(text: str, stop: int) -> _TomlScan:
    """Scans `text` up to `stop` (tomllib read it without error, so its brackets and strings match)."""
    stack: list[tuple[str, int, bool]] = []
    inside = unclosed = None
    key_from = line_start = 0
    for m in _TOML_TOKENS.finditer(text):
        a, b = m.start(), m.end()
        if a >= stop:
            break
        c = text[a]
        if c in "\"'":
            closed = m.group("c1", "c2", "c3", "c4") != (None,) * 4
            if not closed and unclosed is None:
                unclosed = (a, 3 if text.startswith(c * 3, a) else 1)
            if b > stop or (b == stop and not closed):
                inside = (a, b)
        elif c in _PAIRS:
            stack.append((c, a, c == "[" and not stack and not text[line_start:a].strip()))
            key_from = b
        elif c in "]}":
            if stack:
                stack.pop()
        elif c in ",\n":
            key_from = b
            if c == "\n":
                line_start = b
    return _TomlScan(stack, inside, unclosed, key_from)


def _stopped(text: str, at: int, before: str) -> str:
    """The label where tomllib stopped: the end of the file or of a line `before` what, or just "stopped"."""
    if at >= len(text):
        return f"the file ends {before}"
    return f"the line ends {before}" if text[at] in "\r\n" else STOPPED


def toml_error(text: str, file: str, stop: Position, at_end: bool, message: str) -> Diagnostic:
    """E002 for tomllib's `message` (without its position), which stopped at `stop` (`at_end`: at the end
    of the document), pointing at the mistake where it can be told apart."""
    t = _Text(text, file)
    stop_at = len(text) if at_end else t.offset(stop.line, stop.col)
    scan = _toml_scan(text, stop_at)
    for explain in (_bad_escape, _unclosed_string, _unclosed_bracket, _missing_equals, _closed_bracket):
        d = explain(t, scan, stop, stop_at, message)
        if d is not None:
            return d
    return Diagnostic(codes.E002, f"TOML syntax error: {message}", stop, help=_TOML_HELP)


def _bad_escape(t: _Text, scan: _TomlScan, stop: Position, stop_at: int, message: str) -> Diagnostic | None:
    """tomllib reports a bad escape after it (`\\q` at the `q`'s end): point at its backslash."""
    if not message.startswith(_ESCAPES) or scan.inside is None:
        return None
    slash = t.text.rfind("\\", scan.inside[0], stop_at)
    if slash < 0:
        return None
    esc = re.compile(r"\\(?:u[0-9A-Fa-f]{0,4}|U[0-9A-Fa-f]{0,8}|[^\n])?").match(t.text, slash).group()
    if message.startswith("Invalid hex"):
        what, help = "is not an escape: `\\u` takes 4 hex digits, `\\U` 8", "write `\\u00e9` or `\\U0001F600`"
    elif message.startswith("Escaped character"):
        what, help = "is not a Unicode character", "escape a character (not a surrogate, at most U+10FFFF)"
    else:
        what = "is not an escape"
        help = ("escapes are \\b \\t \\n \\f \\r \\\" \\\\ \\uXXXX \\UXXXXXXXX: write `\\\\` for a backslash, or use "
                "a literal string ('C:\\dir', without escapes)")
    return Diagnostic(codes.E002, f"TOML syntax error: `{esc}` {what}", t.pos(slash, slash + len(esc)), help=help)


def _unclosed_string(t: _Text, scan: _TomlScan, stop: Position, stop_at: int, message: str) -> Diagnostic | None:
    """A string never closed: tomllib stops at the end of its line (or of the file). Point at its quote."""
    if not message.startswith(_IN_STRING) or scan.unclosed is None:
        return None
    start, n = scan.unclosed
    quote = t.text[start : start + n]
    where = _stopped(t.text, stop_at, "before its closing quote")
    help = (f"close the string with `{quote}`" if n == 3 else
            f"close the string with `{quote}` on its line (a string of several lines is written between "
            f"`{quote * 3}`)")
    return Diagnostic(codes.E002, "TOML syntax error: this string is never closed", t.pos(start, start + n),
                      help=help, labels=(Label(stop, where),))


def _unclosed_bracket(t: _Text, scan: _TomlScan, stop: Position, stop_at: int, message: str) -> Diagnostic | None:
    """A bracket open where tomllib stopped that is never closed (an inline table or a table header: not on
    its line), the innermost such: point at it."""
    closers = _closers(_TOML_TOKENS, t.text, scan.open[0][1]) if scan.open else {}
    for c, at, header in reversed(scan.open):
        if at in closers and not ((c == "{" or header) and t.text.find("\n", at, closers[at]) >= 0):
            continue  # closed (an inline table or a header on its line)
        if header:
            msg, help = "this table header is not closed on its line", "close the `[` opened here with `]`"
        elif c == "{":
            msg = "this `{` is not closed on its line (an inline table stays on one line)"
            help = "close the `{` opened here with `}` on its line (a larger table is written as a [table])"
        else:
            msg, help = "this `[` is never closed (expected `,` or `]`)", "close the `[` opened here with `]`"
        where = _stopped(t.text, stop_at, "before it is closed")
        return Diagnostic(codes.E002, f"TOML syntax error: {msg}", t.pos(at, at + 1), help=help,
                          labels=(Label(stop, where),))
    return None


def _missing_equals(t: _Text, scan: _TomlScan, stop: Position, stop_at: int, message: str) -> Diagnostic | None:
    """`name "x"`: tomllib objects after the key. Point at the key."""
    if not message.startswith("Expected '=' after a key"):
        return None
    before = t.text[scan.key_from : stop_at]
    start = stop_at - len(before.lstrip())
    key = before.strip()
    if not key or "\n" in key:
        return None
    rest = _uncommented(t.text[stop_at : t.line_end(stop_at)]).strip()
    if "=" not in rest and len(key) + len(rest) <= 80:
        help = f"add `=` after the key: `{key} = {rest or '...'}`"
    else:
        help = "write `key = value` (a key with spaces in it is quoted: `\"a b\" = 1`)"
    return Diagnostic(codes.E002, "TOML syntax error: a key without its `=`", t.pos(start, start + len(key)),
                      help=help, labels=(Label(stop, STOPPED),))


def _closed_bracket(t: _Text, scan: _TomlScan, stop: Position, stop_at: int, message: str) -> Diagnostic | None:
    """tomllib's "Unclosed array" for an array closed later (`[1, 2 3]`): say what was expected, and where
    the array starts."""
    kinds = {"Unclosed array": ("[", "array"), "Unclosed inline table": ("{", "inline table")}
    if message not in kinds or not scan.open:
        return None
    c, name = kinds[message]
    at = next((at for b, at, _ in reversed(scan.open) if b == c), None)
    if at is None:
        return None
    return Diagnostic(codes.E002, f"TOML syntax error: expected `,` or `{_PAIRS[c]}` after a value of the {name}",
                      stop, help=_TOML_HELP, labels=(Label(t.pos(at, at + 1), f"the {name} starts here"),))
