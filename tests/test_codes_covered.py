"""Every diagnostic code in the catalog is produced by at least one spec of the broken corpus, and the
corpus names no code outside the catalog."""

from __future__ import annotations

from corpus import corpus_files, read_case

from mithril_spec.codes import CATALOG


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
