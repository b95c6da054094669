"""The one helper the parts modules share (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def chosen(*pairs: tuple[str, Any]) -> list[str]:
    """The macro names whose condition holds, in the order given: `chosen(("a", x), ("b", y))`."""
    return [name for name, cond in pairs if cond]
