"""Diagnostics: what every stage reports instead of raising.

A `Diagnostic` carries an error code from the catalog (`codes.py`), the span of the spec node that caused
it (a `Position`: where it starts and, when known, where it ends), a message, an optional help line,
secondary labels (other places worth showing, e.g. "first defined here") and structured fields (the path
into the spec data, the key concerned, the mesh it was found on, the spec that reached a base file through
`extends`). Stages collect them; `DiagnosticError` carries a batch of them out of a stage that cannot go
on. Renderers turn them into text (rustc/ruff style), JSON or GitHub workflow annotations; nothing ever
parses a message back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from .codes import CATALOG


@dataclasses.dataclass(frozen=True)
class Position:
    """A place in a source file: where a node starts (line and column, 1-based) and, when known, where it
    ends (`end_line`, `end_col`: the column just after its last character, so a one-character node at
    column 5 ends at column 6)."""

    file: str
    line: int
    col: int
    end_line: int | None = None
    end_col: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    @property
    def has_end(self) -> bool:
        return self.end_line is not None and self.end_col is not None

    def start(self) -> Position:
        """Only the start (no extent)."""
        return Position(self.file, self.line, self.col)


@dataclasses.dataclass(frozen=True)
class Label:
    """A secondary place shown with a diagnostic (underlined with `-` in text output)."""

    pos: Position
    message: str

    def to_json(self) -> dict:
        return {"message": self.message, **_pos_json(self.pos)}


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    code: str
    message: str
    pos: Position | None = None
    help: str | None = None
    notes: tuple[str, ...] = ()
    severity: str = ""  # "error" or "warning"; derived from the code when empty
    labels: tuple[Label, ...] = ()  # secondary places ("first defined here")
    path: tuple[Any, ...] | None = None  # the path into the spec data (keys and list indices)
    key: str | None = None  # the mapping key concerned (unknown, missing or duplicate keys)
    mesh: str | None = None  # the named mesh the diagnostic was found on
    spec: str | None = None  # the spec that reached `pos.file` through `extends`, when they differ

    def __post_init__(self) -> None:
        if self.code not in CATALOG:
            raise ValueError(f"unknown diagnostic code {self.code}")
        if not self.severity:
            object.__setattr__(self, "severity", "warning" if self.code.startswith("W") else "error")
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "labels", tuple(self.labels))
        if self.path is not None:
            object.__setattr__(self, "path", tuple(self.path))

    def as_error(self) -> Diagnostic:
        return dataclasses.replace(self, severity="error")

    @property
    def full_message(self) -> str:
        """The message with its context (the mesh it was found on), as every renderer shows it."""
        return f"{self.message} (mesh `{self.mesh}`)" if self.mesh else self.message

    def to_json(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.full_message,
            **_pos_json(self.pos),
            "help": self.help,
            "notes": list(self.notes),
            "labels": [lab.to_json() for lab in self.labels],
            "path": list(self.path) if self.path is not None else None,
            "key": self.key,
            "mesh": self.mesh,
            "spec": self.spec,
        }


def _pos_json(p: Position | None) -> dict:
    return {
        "file": p.file if p else None,
        "line": p.line if p else None,
        "col": p.col if p else None,
        "end_line": p.end_line if p else None,
        "end_col": p.end_col if p else None,
    }


class DiagnosticError(Exception):
    """Raised by a stage that found problems it cannot continue past."""

    def __init__(self, diagnostics: Sequence[Diagnostic]):
        super().__init__("; ".join(f"{d.code}: {d.message}" for d in diagnostics))
        self.diagnostics = list(diagnostics)


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions, adjacent swaps."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


MAX_SUGGEST = 100  # words longer than this get no suggestion (the distance costs len(a) * len(b))
MAX_COMPARED = 200  # choices whose distance to a word is computed (the closest by shared start and end)


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice close enough to `word` to be what was meant, if any."""
    if len(word) > MAX_SUGGEST:
        return None
    limit = max(1, len(word) // 3)
    # (a distance is at least the difference of the lengths: only choices within the limit are compared)
    choices = sorted({c for c in choices if abs(len(c) - len(word)) <= limit})
    low = word.lower()
    if len(choices) > MAX_COMPARED:
        # Thousands of names (every parameter of a deep model): compare those that share the most of the
        # word's start and end, so that a suggestion costs milliseconds, not seconds.
        def shared(c: str) -> int:
            c = c.lower()
            n = len(os.path.commonprefix([low, c]))
            return n + len(os.path.commonprefix([low[n:][::-1], c[n:][::-1]]))

        choices = sorted(sorted(choices, key=shared, reverse=True)[:MAX_COMPARED])
    mine = {ch: low.count(ch) for ch in set(low)}
    best, best_d = None, limit + 1
    for c in choices:
        cl = c.lower()
        # An edit changes at most one character of each word: the characters one word has and the other lacks
        # bound the distance from below, cheaply (thousands of parameter names are compared to one glob).
        if sum(n - cl.count(ch) for ch, n in mine.items() if n > cl.count(ch)) > min(limit, best_d):
            continue
        d = _within(low, cl, min(limit, best_d))
        if d < best_d or (d == best_d and best is not None and c < best):
            best, best_d = c, d
    return best if best_d <= limit else None


def _within(a: str, b: str, limit: int) -> int:
    """`edit_distance(a, b)` when it is at most `limit`, else `limit + 1`: only the diagonal band |i - j| <= limit
    is computed, and a row beyond the limit ends it (a suggestion is looked for among thousands of names)."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    if a == b:
        return 0
    big = limit + 1
    prev2: list[int] = []
    prev = [j if j <= limit else big for j in range(len(b) + 1)]
    for i in range(1, len(a) + 1):
        cur = [big] * (len(b) + 1)
        if i <= limit:
            cur[0] = i
        lo, hi = max(1, i - limit), min(len(b), i + limit)
        for j in range(lo, hi + 1):
            cost = a[i - 1] != b[j - 1]
            v = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                v = min(v, prev2[j - 2] + 1)
            cur[j] = v if v < big else big
        if min(cur[max(0, lo - 1) : hi + 1]) > limit:
            return big
        prev2, prev = prev, cur
    return min(prev[-1], big)


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A help line suggesting the closest of `choices`, or listing them when none is close."""
    choices = sorted(set(choices))
    word = str(word)
    best = closest(word, choices)
    if best is not None:
        return f"did you mean `{best}`?"
    if choices and len(choices) <= 12:
        return "expected one of: " + ", ".join(f"`{c}`" for c in choices)
    return None


def sort_key(d: Diagnostic) -> tuple:
    p = d.pos
    return (p.file, p.line, p.col, d.code) if p else ("", 0, 0, d.code)


# ---------------------------------------------------------------- renderers


def escape(text: str) -> str:
    """User text made safe for a terminal: control and other non-printable characters (escape sequences,
    bidirectional overrides, zero-width characters) are shown as Python-style escapes (`\\x1b`)."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        else:
            n = ord(ch)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return "".join(out)


MAX_MESSAGE = 1000  # characters of a message, note or help line shown (the middle is left out beyond)
MAX_LINE = 240  # a longer source line is shown as a window around what is underlined
WINDOW = 160


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text`, its middle left out when longer than `limit` (a message can quote a huge user value)."""
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def _style(text: str, code: str, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color else text


@dataclasses.dataclass(frozen=True)
class _Mark:
    pos: Position
    primary: bool
    text: str


def _source_lines(text: str) -> list[str]:
    return [ln.rstrip("\r") for ln in text.split("\n")]  # as the loaders count lines


def _columns(src: str, pos: Position) -> tuple[int, int]:
    """(start, width) of `pos` on its first line, in displayed characters (after escaping) from 0."""
    start = max(pos.col, 1) - 1
    shown = escape(src[:start])
    if pos.has_end and pos.end_line == pos.line:
        end = max(pos.end_col - 1, start + 1)
    elif pos.has_end and pos.end_line > pos.line:
        end = max(len(src.rstrip()), start + 1)  # a span over several lines: underline the first
    else:
        end = start + 1
    width = len(escape(src[start:end])) if start < len(src) else 1
    return len(shown), max(width, 1)


def _marker_lines(src: str, marks: list[_Mark], sev_color: str, color: bool) -> list[str]:
    """The underline row for one source line (`^` primary, `-` secondary) and the label texts (rustc style:
    the rightmost text on the underline row, the others below it on `|` connectors)."""
    cols = [(*_columns(src, m.pos), m) for m in marks]
    cols.sort(key=lambda c: (c[0], not c[2].primary))
    width = max(s + w for s, w, _ in cols)
    row = [" "] * width
    for s, w, m in cols:
        for k in range(s, s + w):
            if row[k] == " " or m.primary:
                row[k] = "^" if m.primary else "-"
    texts = [(s, m) for s, _w, m in cols if m.text]
    line = "".join(row).rstrip()
    if color:  # colour each run of markers
        styled, k = [], 0
        while k < len(line):
            j = k
            while j < len(line) and line[j] == line[k]:
                j += 1
            run = line[k:j]
            styled.append(run if run[0] == " " else _style(run, sev_color if run[0] == "^" else "1;34", color))
            k = j
        line = "".join(styled)
    out = []
    if texts and texts[-1][1] is cols[-1][2]:  # the rightmost mark's text goes on the underline row
        out.append(f"{line} {escape(texts.pop()[1].text)}")
    else:
        out.append(line)
    while texts:
        rest = [s for s, _ in texts]
        out.append(_connectors(rest))
        s, m = texts.pop()
        out.append(_connectors(rest[:-1], upto=s) + escape(m.text))
    return out


def _connectors(cols: list[int], upto: int | None = None) -> str:
    width = upto if upto is not None else (max(cols) + 1 if cols else 0)
    row = [" "] * width
    for c in cols:
        if c < width:
            row[c] = "|"
    return "".join(row) if upto is not None else "".join(row).rstrip()


def render_text(diags: Sequence[Diagnostic], sources: dict[str, str], color: bool = False) -> str:
    """rustc/ruff-like: a header, the source lines with the span underlined (`^`) and secondary labels
    (`-` and their text), then note and help lines. User text is escaped (see `escape`); very long messages
    and source lines are shortened (`clip`, a window of the line around the underline)."""
    out: list[str] = []
    cache: dict[str, list[str]] = {}

    def lines_of(file: str) -> list[str]:  # each file split once, however many diagnostics point into it
        if file not in cache:
            cache[file] = _ExpandedLines(_source_lines(sources[file]))
        return cache[file]
    for d in diags:
        sev_color = "1;31" if d.severity == "error" else "1;33"
        message = escape(clip(d.full_message))
        head = f"{_style(d.severity + '[' + d.code + ']', sev_color, color)}: {_style(message, '1', color)}"
        out.append(f"{escape(str(d.pos))}: {head}" if d.pos else head)
        marks = ([_Mark(d.pos, True, "")] if d.pos else []) + [
            _Mark(lab.pos, False, clip(lab.message)) for lab in d.labels]
        out += _snippets(marks, sources, sev_color, color, lines_of)
        for note in d.notes:
            out.append(f"  = note: {escape(clip(note))}")
        if d.help:
            out.append(f"  = {_style('help', '1;36', color)}: {escape(clip(d.help))}")
        out.append("")
    return "\n".join(out)


class _ExpandedLines(list):
    """A file's lines; `expanded(i)` is line i with tabs expanded, computed once."""

    def __init__(self, lines: list[str]):
        super().__init__(lines)
        self._expanded: dict[int, str] = {}

    def expanded(self, i: int) -> str:
        if i not in self._expanded:
            self._expanded[i] = self[i].expandtabs(1)
        return self._expanded[i]


def _window(src: str, marks: list[_Mark]) -> tuple[str, list[_Mark]]:
    """A line longer than MAX_LINE: the WINDOW characters around its marks (`...` where text is left out),
    with the marks' columns moved to match."""
    if len(src) <= MAX_LINE:
        return src, marks
    lo = min(max(m.pos.col, 1) - 1 for m in marks)
    start = max(0, min(lo - 40, len(src) - WINDOW))
    end = min(len(src), start + WINDOW)
    head = "..." if start > 0 else ""
    shown = head + src[start:end] + ("..." if end < len(src) else "")

    def move(col: int) -> int:
        return min(max(col - 1 - start, 0), end - start) + len(head) + 1

    moved = []
    for m in marks:
        p = m.pos
        if p.has_end and p.end_line == p.line:
            q = Position(p.file, p.line, move(p.col), p.end_line, max(move(p.end_col), move(p.col) + 1))
        else:
            q = Position(p.file, p.line, move(p.col))
        moved.append(_Mark(q, m.primary, m.text))
    return shown, moved


def _snippets(marks: list[_Mark], sources: dict[str, str], sev_color: str, color: bool,
              lines_of=None) -> list[str]:
    """Source excerpts for the marks, one block per file (the primary's first), lines in order."""
    if lines_of is None:
        def lines_of(file: str) -> list[str]:
            return _ExpandedLines(_source_lines(sources[file]))
    by_file: dict[str, dict[int, list[_Mark]]] = {}
    for m in marks:
        text = sources.get(m.pos.file)
        if text is None:
            continue
        lines = lines_of(m.pos.file)
        if 1 <= m.pos.line <= len(lines):
            by_file.setdefault(m.pos.file, {}).setdefault(m.pos.line, []).append(m)
    if not by_file:
        return []
    width = max(len(str(n)) for rows in by_file.values() for n in rows)
    pad = " " * width
    bar = _style("|", "1;34", color)
    out: list[str] = []
    for i, (file, rows) in enumerate(by_file.items()):
        lines = lines_of(file)
        if i > 0 or (marks and marks[0].pos.file != file):
            first = min(rows)
            ref = min(rows[first], key=lambda m: m.pos.col).pos
            out.append(f" {pad}{_style(':::', '1;34', color)} {escape(str(ref))}")
        out.append(f" {pad} {bar}")
        prev = None
        for n in sorted(rows):
            if prev is not None and n > prev + 1:
                out.append(_style("...", "1;34", color))
            src, shown_marks = _window(lines.expanded(n - 1), rows[n])
            out.append(f" {_style(str(n).rjust(width), '1;34', color)} {bar} {escape(src)}".rstrip())
            for row in _marker_lines(src, shown_marks, sev_color, color):
                out.append(f" {pad} {bar} {row}".rstrip())
            prev = n
    return out


def render_json(diags: Sequence[Diagnostic]) -> str:
    return json.dumps([d.to_json() for d in diags], indent=2, sort_keys=True) + "\n"


def _gh_escape(s: str, prop: bool = False) -> str:
    """A workflow command's escapes for `%`, CR and LF; any other control character (and whatever else a
    terminal would act on) escaped as in text output."""
    s = escape(s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))
    if prop:
        s = s.replace(":", "%3A").replace(",", "%2C")
    return s


def _gh_label(lab: Label, file: str | None) -> str:
    """A secondary label in words (an annotation has one place): `(first defined here: line 3, column 1)`."""
    p = lab.pos
    where = f"line {p.line}, column {p.col}" if p.file == file else f"{p.file}:{p.line}:{p.col}"
    return f" ({clip(lab.message)}: {where})"


def render_github(diags: Sequence[Diagnostic]) -> str:
    """GitHub Actions workflow commands: ::error file=..,line=..,col=..,title=..::message (label: where)
    (help: ...); an annotation marks one place, so secondary labels are told in the message."""
    out = []
    for d in diags:
        kind = "error" if d.severity == "error" else "warning"
        props = [f"title={_gh_escape(d.code, True)}"]
        if d.pos:
            props = [
                f"file={_gh_escape(d.pos.file, True)}",
                f"line={d.pos.line}",
                f"col={d.pos.col}",
            ] + props
        msg = clip(d.full_message) + "".join(_gh_label(lab, d.pos.file if d.pos else None) for lab in d.labels)
        msg += f" (help: {clip(d.help)})" if d.help else ""
        out.append(f"::{kind} {','.join(props)}::{_gh_escape(msg)}")
    return "\n".join(out) + ("\n" if out else "")
