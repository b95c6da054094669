"""Diagnostics: what every stage reports instead of raising.

A `Diagnostic` carries an error code from the catalog (`codes.py`), the position of the spec node that
caused it, a message, and an optional help line. Stages collect them; `DiagnosticError` carries a batch
of them out of a stage that cannot go on. Renderers turn them into text (rustc/ruff style), JSON or
GitHub workflow annotations.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence

from .codes import CATALOG


@dataclasses.dataclass(frozen=True)
class Position:
    """A place in a source file; line and column are 1-based."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    code: str
    message: str
    pos: Position | None = None
    help: str | None = None
    notes: tuple[str, ...] = ()
    severity: str = ""  # "error" or "warning"; derived from the code when empty

    def __post_init__(self) -> None:
        if self.code not in CATALOG:
            raise ValueError(f"unknown diagnostic code {self.code}")
        if not self.severity:
            object.__setattr__(self, "severity", "warning" if self.code.startswith("W") else "error")

    def as_error(self) -> Diagnostic:
        return dataclasses.replace(self, severity="error")

    def to_json(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "file": self.pos.file if self.pos else None,
            "line": self.pos.line if self.pos else None,
            "col": self.pos.col if self.pos else None,
            "help": self.help,
            "notes": list(self.notes),
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


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A help line suggesting the closest of `choices`, or listing them when none is close."""
    choices = sorted(set(choices))
    if choices:
        best = min(choices, key=lambda c: (edit_distance(word.lower(), c.lower()), c))
        if edit_distance(word.lower(), best.lower()) <= max(1, len(word) // 3):
            return f"did you mean `{best}`?"
    if choices and len(choices) <= 12:
        return "expected one of: " + ", ".join(f"`{c}`" for c in choices)
    return None


def sort_key(d: Diagnostic) -> tuple:
    p = d.pos
    return (p.file, p.line, p.col, d.code) if p else ("", 0, 0, d.code)


# ---------------------------------------------------------------- renderers


def _style(text: str, code: str, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color else text


def render_text(diags: Sequence[Diagnostic], sources: dict[str, str], color: bool = False) -> str:
    """rustc/ruff-like: header, source line with a caret, help line."""
    out: list[str] = []
    for d in diags:
        sev_color = "1;31" if d.severity == "error" else "1;33"
        head = f"{_style(d.severity + '[' + d.code + ']', sev_color, color)}: {_style(d.message, '1', color)}"
        out.append(f"{d.pos}: {head}" if d.pos else head)
        text = sources.get(d.pos.file) if d.pos else None
        if d.pos and text is not None:
            lines = [ln.rstrip("\r") for ln in text.split("\n")]  # as the loaders count lines
            if 1 <= d.pos.line <= len(lines):
                src = lines[d.pos.line - 1].expandtabs(1)
                num = str(d.pos.line)
                pad = " " * len(num)
                bar = _style("|", "1;34", color)
                out.append(f" {pad} {bar}")
                out.append(f" {_style(num, '1;34', color)} {bar} {src}")
                caret = " " * (max(d.pos.col, 1) - 1) + _style("^", sev_color, color)
                out.append(f" {pad} {bar} {caret}")
        for note in d.notes:
            out.append(f"  = note: {note}")
        if d.help:
            out.append(f"  = {_style('help', '1;36', color)}: {d.help}")
        out.append("")
    return "\n".join(out)


def render_json(diags: Sequence[Diagnostic]) -> str:
    return json.dumps([d.to_json() for d in diags], indent=2, sort_keys=True) + "\n"


def _gh_escape(s: str, prop: bool = False) -> str:
    s = s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        s = s.replace(":", "%3A").replace(",", "%2C")
    return s


def render_github(diags: Sequence[Diagnostic]) -> str:
    """GitHub Actions workflow commands: ::error file=..,line=..,col=..,title=..::message"""
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
        msg = d.message + (f" (help: {d.help})" if d.help else "")
        out.append(f"::{kind} {','.join(props)}::{_gh_escape(msg)}")
    return "\n".join(out) + ("\n" if out else "")
