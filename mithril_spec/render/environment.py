"""The Jinja environment shared by every target: strict undefined names, and the filters that keep spec
text from reaching generated code unescaped."""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import jinja2

from ..template_files import template_dirs

def py(value: Any) -> str:
    """A Python literal for a plain value (repr-escaped; floats round-trip exactly)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return repr(value)
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return f'float("{value}")'
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(py(v) for v in value)
        return f"({inner},)" if isinstance(value, tuple) and len(value) == 1 else (
            f"({inner})" if isinstance(value, tuple) else f"[{inner}]")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py(k)}: {py(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot render {type(value).__name__} as a Python literal")


def py_block(value: Any, level: int = 0) -> str:
    """`py`, with every non-empty mapping one item a line and a trailing comma (the formatter keeps such a
    literal exploded): a literal whose line count does not depend on its values (a program's length must not
    depend on how large its figures are)."""
    if isinstance(value, dict) and value:
        pad = "    " * (level + 1)
        items = "".join(f"{pad}{py(k)}: {py_block(v, level + 1)},\n" for k, v in value.items())
        return "{\n" + items + "    " * level + "}"
    return py(value)


def ident(value: Any) -> str:
    """Asserts an identifier (names are validated upstream; this is the last line of defence)."""
    if not isinstance(value, str) or not value.isidentifier():
        raise ValueError(f"not an identifier: {value!r}")
    return value


def shell(value: Any) -> str:
    """A single-quoted shell word."""
    return "'" + str(value).replace("'", "'\"'\"'") + "'"


def make_environment(autoescape: bool) -> jinja2.Environment:
    """A Jinja environment over the template directories: undefined names are errors. `autoescape` for
    HTML (the plan report); programs escape values explicitly with the `py` filter instead."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in template_dirs()]),
        undefined=jinja2.StrictUndefined,
        autoescape=autoescape,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The environment that renders programs, with the filters that keep spec text escaped."""
    env = make_environment(autoescape=False)
    env.filters["py"] = py
    env.filters["py_block"] = py_block
    env.filters["ident"] = ident
    env.filters["shell"] = shell
    env.filters["json"] = lambda v: json.dumps(v, sort_keys=True)
    return env
