"""ast.parse behind a lock.

CPython 3.11's ast.parse is not thread-safe: two threads parsing at once can fail with "AST constructor
recursion depth mismatch". Compiling and building may run from several threads (the test suite does),
so every parse in mithril_spec goes through here.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)
