"""Every spec in tests/specs/broken/ fails with exactly the diagnostics (code, file, line, column) it declares."""

from __future__ import annotations

import json
import re

import pytest
from corpus import corpus_files, read_case

from mithril_spec import cli
from mithril_spec.diagnostics import MAX_LINE, escape

FILES = corpus_files()


def test_corpus_is_large_enough():
    assert len(FILES) >= 45
    assert sum(p.suffix == ".toml" for p in FILES) >= 5


def _run(capsys, argv):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "internal error" not in err
    return rc, out, err


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_broken_spec_json(path, capsys):
    case = read_case(path)
    assert case.expect, f"{path.name} declares no `# expect:` line"
    rc, out, _err = _run(capsys, ["validate", str(path), "--format", "json", *case.args])
    diags = json.loads(out) if out.strip() else []
    got = {(d["code"], d["file"], d["line"], d["col"]) for d in diags}
    assert got == set(case.expect), "\n".join(
        f"{d['code']} {d['line']}:{d['col']} {d['file']}: {d['message']}" for d in diags
    )
    assert rc == case.exit_code
    for d in diags:
        assert d["severity"] == ("warning" if d["code"].startswith("W") and "--strict" not in case.args else "error")
        assert d["message"]
    for text in case.texts:
        assert any(text in d["message"] or text in (d["help"] or "") for d in diags), (text, diags)


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_broken_spec_text(path, capsys):
    """The text rendering names `file:line:col: severity[CODE]` and shows a caret under the column."""
    case = read_case(path)
    rc, _out, err = _run(capsys, ["validate", str(path), "--color", "never", *case.args])
    assert rc == case.exit_code
    for code, file, line, col in case.expect:
        sev = "warning" if code.startswith("W") and "--strict" not in case.args else "error"
        header = f"{file}:{line}:{col}: {sev}[{code}]"
        assert header in err, err
        block = err[err.index(header) :].split("\n\n")[0].splitlines()
        src_lines = case.source(file).split("\n")
        if 1 <= line <= len(src_lines):
            # header, gutter, then source lines (the primary's among those of secondary labels), each followed
            # by its underline row; the source is shown with control characters escaped
            row = next(i for i, text in enumerate(block) if re.match(rf"^ +{line} \|( |$)", text))
            src = src_lines[line - 1].expandtabs(1)
            caret = block[row + 1]
            bar = caret.index("|")
            if len(src) <= MAX_LINE:
                shown = escape(src).rstrip()
                assert block[row].endswith(shown), "\n".join(block)
                assert caret[bar + 2 :].index("^") == len(escape(src[: col - 1])), "\n".join(block)
            else:  # a long line: a window of it around the caret, which stays under the character it points at
                text = block[row][bar + 2 :]
                assert "..." in text and len(text) < len(src), "\n".join(block)
                at = caret[bar + 2 :].index("^")
                assert text[at:at + 8] == escape(src[col - 1 : col + 7]), "\n".join(block)
