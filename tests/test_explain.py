"""`mithril-spec explain`: every code's title, text and example; the examples really trigger their code;
docs/diagnostics.md is generated from the catalog; a closed output pipe ends the command quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mithril_spec import cli, docs_gen
from mithril_spec.codes import CATALOG

ROOT = Path(__file__).resolve().parent.parent
CODES = list(CATALOG)


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err
    return rc, out, err


@pytest.mark.parametrize("code", CODES)
def test_example_reports_its_code(code, tmp_path):
    """Each catalog example, written to a directory and validated with its arguments, reports its code (and
    nothing else), with a span inside the example's files (or its `--set` arguments)."""
    ex = CATALOG[code].example
    files = {ex.file: ex.spec, **dict(ex.files)}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    args = [str(tmp_path / a) if a.endswith(".yaml") else a for a in ex.args]
    out = _validate_json(tmp_path / ex.file, args, ex.command)
    diags = json.loads(out)
    assert {d["code"] for d in diags} == {code}, [(d["code"], d["message"]) for d in diags]
    settings = [b for a, b in zip(ex.args, ex.args[1:]) if a == "--set"]
    for d in diags:
        if d["file"].startswith("--set #"):  # in a `--set` argument
            text = settings[int(d["file"].removeprefix("--set #")) - 1]
        else:
            rel = Path(d["file"]).relative_to(tmp_path).as_posix()
            assert rel in files
            text = files[rel]
        lines = text.split("\n")
        assert 1 <= d["line"] <= len(lines) and 1 <= d["col"] <= len(lines[d["line"] - 1]) + 1


def _validate_json(path: Path, args, command=("validate",)) -> str:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([*command, str(path), *args, "--format", "json"])
    assert rc in (0, 1), err.getvalue()
    assert "Traceback" not in err.getvalue()
    return out.getvalue()


@pytest.mark.parametrize("code", CODES)
def test_explain_prints_title_text_and_example(code, capsys):
    entry = CATALOG[code]
    rc, out, err = run(capsys, "explain", code.lower())
    assert rc == 0 and err == ""
    kind = "warning" if code.startswith("W") else "error"
    assert out.startswith(f"{code} ({kind}): {entry.title}\n\n{entry.text}\n\nExample:\n\n")
    ex = entry.example
    for text in (ex.spec, *(t for _, t in ex.files)):
        assert "\n".join(("    " + ln).rstrip() for ln in text.rstrip("\n").split("\n")) in out
    assert f"    $ mithril-spec {' '.join(ex.command)} {ex.file}" in out
    # what the example reports, with the file name as written in the example
    assert f"    {ex.file}:" in out or any(f"    {rel}:" in out for rel, _ in ex.files) or "    --set #1:" in out
    assert f"[{code}]: " in out


def test_explain_lists_every_code_with_its_title(capsys):
    rc, out, _err = run(capsys, "explain")
    assert rc == 0
    assert out.splitlines() == [f"{code}  {entry.title}" for code, entry in CATALOG.items()]


def test_catalog_content():
    assert "E050" in CATALOG and CATALOG["E050"].title == "does not fit in device memory"
    assert CATALOG["E046"].title == "mesh size does not match the device count"
    assert "positive integer" in CATALOG["E047"].text  # `mesh: {data: 0}` is E047, not E013
    assert list(CATALOG) == sorted(CATALOG, key=lambda c: (c[0] == "W", c))  # in order, warnings last


def test_diagnostics_doc_is_generated_from_the_catalog():
    committed = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    assert committed == docs_gen.render_doc(), "docs/diagnostics.md is stale: run `python -m mithril_spec.docs_gen`"
    assert "do not edit" in committed.splitlines()[2]
    for code, entry in CATALOG.items():
        assert f"#### {code}\n\n**{entry.title}**" in committed
        assert entry.text in committed
        assert entry.example.spec.rstrip("\n") in committed


def test_docs_gen_check(tmp_path):
    stale = tmp_path / "diagnostics.md"
    stale.write_text("old\n", encoding="utf-8")
    assert docs_gen.main(["--check", "-o", str(stale)]) == 1
    assert docs_gen.main(["-o", str(stale)]) == 0
    assert docs_gen.main(["--check", "-o", str(stale)]) == 0


# ---------------------------------------------------------------- a reader that goes away (`| head`)


def _closed_stdout(*argv: str) -> subprocess.CompletedProcess:
    """Runs mithril-spec with a stdout whose reader is already gone: every write fails with EPIPE."""
    r, w = os.pipe()
    os.close(r)
    try:
        code = "import sys; from mithril_spec.cli import main; sys.exit(main(sys.argv[1:]))"
        return subprocess.run(
            [sys.executable, "-c", code, *argv],
            stdout=w,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            timeout=120,
            text=True,
            check=False,
        )
    finally:
        os.close(w)


@pytest.mark.skipif(os.name != "posix", reason="pipes and SIGPIPE as on POSIX")
@pytest.mark.parametrize(
    "argv",
    [
        ("explain",),
        ("explain", "E042"),
        ("validate", "tests/specs/broken/unknown_op.yaml", "--format", "json"),
        ("validate", "tests/specs/broken/unknown_op.yaml", "--format", "github"),
        ("schema", "-o", "-"),
        ("--help",),
    ],
)
def test_a_closed_output_pipe_ends_quietly(argv):
    p = _closed_stdout(*argv)
    assert p.stderr == "", p.stderr
    assert p.returncode == cli.EXIT_PIPE or (argv == ("--help",) and p.returncode in (0, cli.EXIT_PIPE))


@pytest.mark.skipif(os.name != "posix", reason="pipes as on POSIX")
def test_head_of_explain_in_a_shell():
    py = f"'{sys.executable}' -c 'import sys; from mithril_spec.cli import main; sys.exit(main(sys.argv[1:]))'"
    p = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {py} explain | head -2; echo rc=$?"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = p.stdout.splitlines()
    assert lines[:2] == [f"{code}  {CATALOG[code].title}" for code in CODES[:2]]
    assert lines[2] in ("rc=0", f"rc={cli.EXIT_PIPE}")  # 0 when the writer finished before head closed
    assert p.stderr == "", p.stderr
