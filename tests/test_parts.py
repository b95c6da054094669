"""The optional pieces of the templates (lowering/parts): every macro of a parts file is a piece the lowering
can name (or a helper the pieces call), so that no template code is dead; a slot's names are macros of its parts files (a render of every
example and matrix cell checks that: an unknown name is an error under StrictUndefined)."""

from __future__ import annotations

import re
from pathlib import Path

from mithril_spec.frontend import compile_file
from mithril_spec.lowering.parts import SECTIONS
from mithril_spec.lowering.program import lower

ROOT = Path(__file__).resolve().parent.parent
PARTS_FILES = sorted((ROOT / "templates").glob("*/*_parts.*.j2"))
# where the lowering names pieces: lowering/parts, the per-block pieces of the target lowerings, the operators'
PARTS_CODE = "\n".join(p.read_text() for d in ("lowering", "ops") for p in sorted((ROOT / "mithril_spec" / d).rglob("*.py")))
TEMPLATES = "\n".join(p.read_text() for p in sorted((ROOT / "templates").rglob("*.j2")))
MACRO = re.compile(r"{%-?\s*macro\s+(\w+)\s*\(")


def unnamed_macros(template: str, lowering: str, templates: str) -> list[str]:
    """The macros of a parts file that the lowering does not name (a string literal) and no template calls by
    name (a helper of the pieces, such as a list of PartitionSpecs: `name(` besides its definition)."""
    def called(m: str) -> bool:
        return len(re.findall(rf"\b{m}\(", templates)) > len(re.findall(rf"macro\s+{m}\(", templates))
    return [m for m in MACRO.findall(template) if f'"{m}"' not in lowering and not called(m)]


def test_the_checker_finds_a_macro_nothing_names():
    template = "{% macro used() %}x{% endmacro %}{% macro helper() %}h{% endmacro %}{% macro dead() %}y{% endmacro %}"
    assert unnamed_macros(template, 'return {"slot": ["used"]}', template + "{{ helper() }}") == ["dead"]


def test_every_parts_macro_is_named_by_the_lowering():
    assert PARTS_FILES, "no parts file found"
    dead = {p.relative_to(ROOT).as_posix(): names for p in PARTS_FILES if (names := unnamed_macros(p.read_text(), PARTS_CODE, TEMPLATES))}
    assert not dead, f"macros of parts files that no lowering/parts module names (dead template code): {dead}"


def test_parts_are_lists_of_names_per_section():
    c = compile_file(ROOT / "specs" / "gpt-tiny.yaml")
    for target in ("torch", "jax"):
        parts = lower(c.plan, c.doc, target, "gpt-tiny.yaml").parts
        assert list(parts) == [s for s, _ in SECTIONS[target]]
        assert all(isinstance(n, str) for slots in parts.values() for names in slots.values() for n in names)
