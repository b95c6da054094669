"""Every diagnostic code in the catalog is produced by at least one spec of the broken corpus, and the
corpus names no code outside the catalog; the package raises them by name (`codes.E049`)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from corpus import corpus_files, read_case

from mithril_spec.codes import CATALOG

PKG = Path(__file__).resolve().parent.parent / "mithril_spec"


def _corpus_codes() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in corpus_files():
        for code, *_ in read_case(path).expect:
            out.setdefault(code, []).append(path.name)
    return out


def test_every_catalog_code_is_triggered_by_the_corpus():
    covered = _corpus_codes()
    # codes of other commands than `validate` (`import hf`) are covered by their own tests (test_hf_import.py)
    missing = sorted(c for c in set(CATALOG) - set(covered) if CATALOG[c].example.command == ("validate",))
    assert not missing, f"no spec in tests/specs/broken/ expects {missing}: add one"


def test_corpus_codes_exist_in_the_catalog():
    unknown = sorted(set(_corpus_codes()) - set(CATALOG))
    assert not unknown, f"tests/specs/broken/ expects codes not in codes.CATALOG: {unknown}"


def test_every_corpus_file_declares_an_expectation():
    for path in corpus_files():
        assert read_case(path).expect, f"{path.name}: add a `# expect: CODE LINE:COL` line"


def test_warnings_are_covered_both_as_warnings_and_under_strict():
    strict, plain = set(), set()
    for path in corpus_files():
        case = read_case(path)
        for code, *_ in case.expect:
            if code.startswith("W"):
                (strict if "--strict" in case.args else plain).add(code)
    warnings = {c for c in CATALOG if c.startswith("W") and CATALOG[c].example.command == ("validate",)}
    assert warnings <= strict | plain
    assert strict and plain


def test_the_codes_are_names_of_the_catalog():
    from mithril_spec import codes

    names = {n for n in dir(codes) if re.fullmatch(r"[EW]\d{3}", n)}
    assert names == set(CATALOG), f"codes.py's names and its catalog differ: {sorted(names ^ set(CATALOG))}"
    assert all(getattr(codes, n) == n for n in names)


def test_raise_sites_name_the_codes():
    """Outside codes.py the package writes `codes.E049`, never the string "E049" (a misspelt name fails at
    import; a misspelt string would give a wrong code)."""
    strings = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "codes.py":
            continue
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type == tokenize.STRING and re.fullmatch(r"[rbuf]?[\"'][EW]\d{3}[\"']", tok.string):
                strings.append(f"{path.relative_to(PKG.parent)}:{tok.start[0]}: {tok.string}")
    assert not strings, "diagnostic codes written as strings:\n" + "\n".join(strings)
