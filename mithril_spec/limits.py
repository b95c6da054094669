"""The limits of the spec language: what a spec may hold, checked before the work it would cost is done.

Every limit is generous for real models (a 1000-layer GPT, a Llama-2-70B import) and small enough that any
spec, however hostile, is answered in well under a second and a few hundred MB: a limit that is passed is a
diagnostic pointing at the node that passes it, never a hang, a MemoryError or a traceback.
docs/spec.md (section "Limits") lists them.
"""

from __future__ import annotations

import math
from typing import Any

MAX_FILE_BYTES = 1 << 20  # E006: a spec file (and each base spec it extends) at most 1 MiB
MAX_DEPTH = 100  # E006: nesting of mappings and lists, aliases expanded
MAX_NODES = 20_000  # E006: values of a document, aliases and merge keys expanded (counted before expanding)
MAX_EXPRESSION_CHARS = 200  # E021: the text of one size expression
MAX_LAYERS = 10_000  # E031: layers of the model once every `repeat` is expanded (a 1000-layer GPT: 6,005)
MAX_INT = 2**53  # E015: integers (and products of sizes: tensor elements, mesh devices) stay below 2^53
MAX_SHOWN = 80  # characters of a user value quoted in a message


def int_too_large(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and abs(n) >= MAX_INT


def float_not_finite(x: Any) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def show(value: Any, limit: int = MAX_SHOWN) -> str:
    """`repr(value)` for a message, shortened in the middle when long (a spec's values can be huge); a boolean
    and null as the spec writes them (`true`, `null`, not Python's `True`, `None`)."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        digits = len(str(abs(value))) if abs(value) < 10**4000 else None
        return f"an integer of {digits:,} digits" if digits else "an integer of more than 4,000 digits"
    if isinstance(value, (dict, list)) and len(value) > 20:
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value):,} entries"
    text = repr(value)
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def shorten(text: Any, limit: int = MAX_SHOWN) -> str:
    """`str(text)` shortened in the middle when long (user text quoted in a message)."""
    text = str(text)
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def power_of_two(n: int) -> str:
    """`2^53` for a power of two, else the number with separators."""
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else f"{n:,}"


def count_values(data: Any) -> int:
    """The values of a loaded document (stops counting past MAX_NODES)."""
    n, stack = 0, [data]
    while stack and n <= MAX_NODES:
        v = stack.pop()
        n += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return n
