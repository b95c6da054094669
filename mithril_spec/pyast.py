"""ast.parse behind a lock.

CPython 3.11's ast.parse is not thread-safe: two threads parsing at once can fail with "AST constructor
recursion depth mismatch". Compiling and building may run from several threads (the test suite does),
so every parse in mithril_spec goes through here. A process that also parses elsewhere while it builds
(the test suite: coverage's analysis, its own AST checks) routes those parses through `LOCK` too
(`install()`).
"""

from __future__ import annotations

import ast
import threading

LOCK = threading.RLock()
_PARSE = ast.parse  # the interpreter's own, whatever `install` later puts in its place


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    with LOCK:
        return _PARSE(source, filename=filename, mode=mode)


def _locked_parse(*args, **kwargs):
    with LOCK:
        return _PARSE(*args, **kwargs)


def install() -> None:
    """Makes every `ast.parse` in this process take the same lock (for processes that build from several
    threads while other code parses)."""
    ast.parse = _locked_parse
