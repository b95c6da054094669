"""Diagnostics like ruff's and rustc's: spans, secondary labels, structured fields, escaped user text, and
de-duplication by fields (never by parsing messages); each spec resolved once per command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mithril_spec import cli
from mithril_spec.diagnostics import Diagnostic, Label, Position, escape, render_json, render_text
from mithril_spec.source import load_text

ROOT = Path(__file__).resolve().parent.parent
BROKEN = ROOT / "tests" / "specs" / "broken"
SPECS = ROOT / "specs"


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err
    return rc, out, err


def validate_json(capsys, *argv) -> list[dict]:
    _rc, out, _err = run(capsys, "validate", *argv, "--format", "json")
    return json.loads(out)


def text_at(text: str, p: Position) -> str:
    """The source text a single-line span covers."""
    assert p.end_line == p.line
    return text.split("\n")[p.line - 1][p.col - 1 : p.end_col - 1]


# ---------------------------------------------------------------- spans from the loaders

YAML = """\
version: 1
model:
  layers:
    - {op: linear, name: fc1, dimension: 32}
    - op: relu
      name: "act"
  tags: [a, "b c"]
"""

TOML = """\
version = 1
b.c = "x"   # dotted key
arr = [1, [2, 3], { e = 4 }]
[tab]
x = 1.5
"""


def test_yaml_spans():
    doc = load_text(YAML, "s.yaml")
    assert text_at(YAML, doc.span(("model", "layers", 0, "name"))) == "fc1"
    assert text_at(YAML, doc.span(("model", "layers", 0, "name"), key=True)) == "name"
    assert text_at(YAML, doc.span(("model", "layers", 0))) == "{op: linear, name: fc1, dimension: 32}"
    assert text_at(YAML, doc.span(("model", "layers", 1, "name"))) == '"act"'
    assert text_at(YAML, doc.span(("model", "tags"))) == '[a, "b c"]'
    assert doc.pos(("model", "layers", 1)).end_line > doc.pos(("model", "layers", 1)).line  # a block mapping
    assert not doc.pos(()).has_end  # the document itself: its start only


def test_toml_spans():
    doc = load_text(TOML, "s.toml")
    assert text_at(TOML, doc.span(("b", "c"))) == '"x"'
    assert text_at(TOML, doc.span(("b", "c"), key=True)) == "c"
    assert text_at(TOML, doc.span(("b",), key=True)) == "b"
    assert text_at(TOML, doc.span(("arr",))) == "[1, [2, 3], { e = 4 }]"
    assert text_at(TOML, doc.span(("arr", 1))) == "[2, 3]"
    assert text_at(TOML, doc.span(("arr", 2, "e"))) == "4"
    assert text_at(TOML, doc.span(("tab",))) == "[tab]"
    assert text_at(TOML, doc.span(("tab",), key=True)) == "tab"
    assert text_at(TOML, doc.span(("tab", "x"))) == "1.5"


def test_path_at_finds_the_node_of_a_span():
    doc = load_text(YAML, "s.yaml")
    for path in [("model", "layers", 0, "name"), ("model", "tags", 1), ("model", "layers", 1)]:
        assert doc.path_at(doc.pos(path)) == path
    assert doc.path_at(doc.pos(("model", "layers"), key=True)) == ("model", "layers")
    assert doc.path_at(Position("s.yaml", 99, 1)) is None


@pytest.mark.parametrize(
    "text, file, first",
    [
        ("a: 1\nb: 2\na: 3\n", "s.yaml", (1, 1, 2)),
        ("a = 1\nb = 2\na = 3\n", "s.toml", (1, 1, 2)),
        ("[t]\nx = 1\n[t]\n", "s.toml", (1, 1, 4)),
        ("x = {a = 1, a = 2}\n", "s.toml", (1, 6, 7)),
    ],
)
def test_duplicate_keys_label_the_first_definition(text, file, first):
    from mithril_spec.diagnostics import DiagnosticError

    with pytest.raises(DiagnosticError) as e:
        load_text(text, file)
    (d,) = e.value.diagnostics
    assert d.code == "E003" and d.pos.has_end
    (label,) = d.labels
    assert label.message == "first defined here"
    assert (label.pos.line, label.pos.col, label.pos.end_col) == first


# ---------------------------------------------------------------- text rendering


def test_text_underlines_the_span_and_shows_labels_rustc_style():
    src = "a: 1\nlayers: [{name: fc}, {name: fc}]\n"
    d = Diagnostic(
        "E025",
        "duplicate name `fc`",
        Position("s.yaml", 2, 30, 2, 32),
        labels=(Label(Position("s.yaml", 2, 17, 2, 19), "first defined here"),),
    )
    lines = render_text([d], {"s.yaml": src}).splitlines()
    assert lines == [
        "s.yaml:2:30: error[E025]: duplicate name `fc`",
        "   |",
        " 2 | layers: [{name: fc}, {name: fc}]",
        "   |                 --           ^^",
        "   |                 |",
        "   |                 first defined here",
    ]
    # a label right of the primary span sits on the underline row
    d = Diagnostic(
        "E025", "m", Position("s.yaml", 2, 17, 2, 19), labels=(Label(Position("s.yaml", 2, 30, 2, 32), "x"),)
    )
    assert "   |                 ^^           -- x" in render_text([d], {"s.yaml": src}).splitlines()


def test_text_shows_labels_in_other_files_and_other_lines():
    d = Diagnostic(
        "E020",
        "undefined dim",
        Position("base.yaml", 3, 5, 3, 8),
        labels=(Label(Position("top.yaml", 1, 10, 1, 19), "the base spec is extended here"),),
    )
    out = render_text([d], {"base.yaml": "a\nb\n    bad\n", "top.yaml": "extends: base.yaml\n"})
    assert "  ::: top.yaml:1:10\n" in out
    assert " 1 | extends: base.yaml\n   |          --------- the base spec is extended here\n" in out
    # several lines of one file, in order, with `...` for a gap
    d = Diagnostic(
        "E003", "dup", Position("s.yaml", 5, 1, 5, 2), labels=(Label(Position("s.yaml", 1, 1, 1, 2), "first"),)
    )
    out = render_text([d], {"s.yaml": "a: 1\nb: 2\nc: 3\nd: 4\na: 5\n"})
    assert " 1 | a: 1\n   | - first\n...\n 5 | a: 5\n   | ^\n" in out


def test_text_escapes_control_characters_of_user_text():
    evil = "name: \x1b[2Jx\u202e\n"
    d = Diagnostic(
        "E013",
        "invalid name '\x1b[2Jx\u202e'",
        Position("s.yaml", 1, 11, 1, 12),
        help="not `\x07`",
        notes=("\x1b]0;title\x07",),
        labels=(Label(Position("s.yaml", 1, 7, 1, 8), "\x1bhere"),),
    )
    out = render_text([d], {"s.yaml": evil})
    assert not any(ord(c) < 32 and c != "\n" for c in out), out
    assert "\u202e" not in out
    assert "invalid name '\\x1b[2Jx\\u202e'" in out
    assert " 1 | name: \\x1b[2Jx\\u202e" in out
    src_row, marks = [ln for ln in out.splitlines() if ln.startswith((" 1 |", "   |"))][1:3]
    # the caret stays under the character it points at (after the escape before it)
    assert src_row[marks.index("^")] == "x" and src_row[marks.index("-")] == "\\"
    assert escape("tab\there\r\n") == "tab\\there\\r\\n" and escape("ok ü 中") == "ok ü 中"
    # colour codes are the renderer's own, the user's are escaped
    colored = render_text([d], {"s.yaml": evil}, color=True)
    assert "\x1b[2J" not in colored and "\x1b[1;31m" in colored


def test_json_has_spans_labels_and_fields():
    d = Diagnostic(
        "E010",
        "unknown key `x`",
        Position("s.yaml", 2, 3, 2, 4),
        path=["a", "x"],
        key="x",
        mesh="m",
        labels=[Label(Position("s.yaml", 1, 1), "l")],
    )
    (j,) = json.loads(render_json([d]))
    assert (j["line"], j["col"], j["end_line"], j["end_col"]) == (2, 3, 2, 4)
    assert j["labels"] == [{"message": "l", "file": "s.yaml", "line": 1, "col": 1, "end_line": None, "end_col": None}]
    assert (j["path"], j["key"], j["mesh"], j["spec"]) == (["a", "x"], "x", "m", None)
    assert j["message"] == "unknown key `x` (mesh `m`)"


# ---------------------------------------------------------------- structured fields from the command line


def test_validation_diagnostics_carry_path_and_key(capsys, tmp_path):
    spec = (BROKEN / "unknown_key_optimizer.yaml").read_text()
    diags = validate_json(capsys, BROKEN / "unknown_key_optimizer.yaml")
    (d,) = diags
    assert d["code"] == "E010" and d["key"] and d["path"][-1] == d["key"] and d["path"][0] == "training"
    assert spec.split("\n")[d["line"] - 1][d["col"] - 1 : d["end_col"] - 1] == d["key"]
    # `optimiser:` is an unknown key that means `optimizer`: no E011 for the missing `optimizer` too
    p = tmp_path / "s.yaml"
    p.write_text(re.sub(r"optimizer:", "optimiser:", (SPECS / "mlp-dp.yaml").read_text()), encoding="utf-8")
    diags = validate_json(capsys, p)
    assert [(d["code"], d["key"], d["path"]) for d in diags] == [("E010", "optimiser", ["training", "optimiser"])]


def test_planner_diagnostics_get_their_path_from_the_span(capsys):
    (d,) = validate_json(capsys, BROKEN / "size_not_divisible.yaml")
    assert d["code"] == "E042" and d["path"] == ["sharding", "rules", "vocab"]


def test_duplicate_name_labels_the_first_definition(capsys):
    (d,) = validate_json(capsys, BROKEN / "duplicate_name_input.yaml")
    (label,) = d["labels"]
    assert label["message"] == "first defined here" and label["line"] < d["line"]
    assert d["path"][-1] == "name"


def test_base_spec_diagnostics_name_the_spec_and_the_extends(capsys):
    top = BROKEN / "extends_base_error.yaml"
    (d,) = validate_json(capsys, top)
    assert d["file"].endswith("bases/undefined_dim.yaml") and d["spec"] == str(top)
    (label,) = d["labels"]
    assert (label["file"], label["line"], label["message"]) == (str(top), 4, "the base spec is extended here")
    # also when the base spec cannot even be read
    (d,) = validate_json(capsys, BROKEN / "extends_base_syntax_error.yaml")
    assert d["code"] == "E001" and d["spec"] == str(BROKEN / "extends_base_syntax_error.yaml")
    assert [lab["message"] for lab in d["labels"]][-1] == "the base spec is extended here"
    _rc, _out, err = run(capsys, "validate", top, "--color", "never")
    assert f"::: {top}:4:10" in err


def test_an_override_labels_the_base_value_it_replaces(capsys):
    (d,) = validate_json(capsys, BROKEN / "extends_override_error.yaml")
    assert d["spec"] is None and d["path"] == ["training", "batch_size"]
    (label,) = d["labels"]
    assert label["file"].endswith("bases/mlp.yaml") and label["message"] == "the value it replaces in the base spec"


def test_every_named_mesh_is_planned_and_named(capsys):
    diags = validate_json(capsys, SPECS / "gpt-tiny.yaml", "--devices", "4")
    assert sorted((d["code"], d["mesh"]) for d in diags) == [("E046", "default"), ("E046", "single")]
    for d in diags:
        assert d["message"].endswith(f" (mesh `{d['mesh']}`)")
    # --mesh: one mesh, named in the field when it is a named mesh
    diags = validate_json(capsys, SPECS / "gpt-tiny.yaml", "--devices", "4", "--mesh", "single")
    assert [(d["code"], d["mesh"]) for d in diags] == [("E046", "single")]
    diags = validate_json(capsys, SPECS / "gpt-tiny.yaml", "--devices", "4", "--mesh", "data=2")
    assert [(d["code"], d["mesh"]) for d in diags] == [("E046", None)]


def test_the_same_problem_on_several_meshes_is_reported_once(capsys, tmp_path):
    text = (SPECS / "gpt-tiny.yaml").read_text()
    text = text.replace("sharding:\n", "sharding:\n  params:\n    nothing.weight: [null]\n", 1)
    p = tmp_path / "s.yaml"
    p.write_text(text, encoding="utf-8")
    diags = validate_json(capsys, p)
    e045 = [d for d in diags if d["code"] == "E045"]
    assert len(e045) == 1 and e045[0]["mesh"] == "default", diags


def test_no_module_parses_diagnostic_messages():
    for name in ("cli.py", "validate.py", "diagnostics.py"):
        src = (ROOT / "mithril_spec" / name).read_text()
        assert not re.search(r"message\.(r?split|startswith|endswith|partition|find|index)\b", src), name
        assert not re.search(r"\bin [a-z_]+\.message\b", src), name


# ---------------------------------------------------------------- once per command


def test_each_spec_is_resolved_once_and_planned_per_mesh(capsys, monkeypatch):
    from mithril_spec import frontend, graph, validate
    from mithril_spec.planner import plan

    calls: dict[str, list] = {"validate": [], "resolve": [], "make_plan": []}

    def counting(name, fn):
        def wrapper(*a, **kw):
            calls[name].append(a[3] if name == "make_plan" and len(a) > 3 else kw.get("mesh_choice"))
            return fn(*a, **kw)

        return wrapper

    for module, name in ((validate, "validate"), (graph, "resolve"), (plan, "make_plan")):
        wrapper = counting(name, getattr(module, name))
        monkeypatch.setattr(module, name, wrapper)
        monkeypatch.setattr(frontend, name, wrapper)  # (the front end's own binding: it stages the compile)
    rc, _out, err = run(capsys, "validate", SPECS / "gpt-tiny.yaml", "--hardware", "h100-sxm-80gb")
    assert rc == 0, err
    assert len(calls["validate"]) == 1 and len(calls["resolve"]) == 1
    assert sorted(calls["make_plan"], key=str) == sorted([None, "fsdp_tp", "single"], key=str)  # once per mesh


# ---------------------------------------------------------------- hostile text: escaped, shortened, where it stands


def _spec_with(tmp_path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_control_characters_are_escaped_in_every_output_format(capsys, tmp_path):
    src = (SPECS / "gpt-tiny.yaml").read_text().replace("  steps: 20", '  "st\\e[2Jeps\\a": 20')
    path = _spec_with(tmp_path, "ctrl.yaml", src)
    for fmt in ("text", "github", "json"):
        rc, out, err = run(capsys, "validate", path, "--format", fmt, "--color", "never")
        assert rc == 1
        assert not any(ord(c) < 32 and c != "\n" for c in out + err), (fmt, out + err)
    rc, out, _err = run(capsys, "validate", path, "--format", "github")
    assert "unknown key `st\\x1b[2Jeps\\x07` in training" in out


def test_github_format_escapes_control_characters():
    from mithril_spec.diagnostics import render_github

    d = Diagnostic("E010", "unknown key `\x1b]0;x\x07`", Position("s\x1b.yaml", 1, 2), help="not \x1b[2J")
    out = render_github([d])
    assert out == "::error file=s\\x1b.yaml,line=1,col=2,title=E010::unknown key `\\x1b]0;x\\x07` (help: not \\x1b[2J)\n"


def test_lone_surrogates_are_refused_where_they_stand(capsys, tmp_path):
    path = _spec_with(tmp_path, "s.yaml", 'version: 1\nname: x\n"\\udc80": 1\nb: "\\ud800"\n')
    (d,) = validate_json(capsys, path)
    assert (d["code"], d["line"], d["col"]) == ("E001", 3, 1) and "lone surrogate" in d["message"]
    rc, _out, err = run(capsys, "validate", path)  # text output: the escape shown, never a raw surrogate
    assert rc == 1 and "\\udc80" in err


def test_a_long_line_is_shown_as_a_window_around_the_caret():
    src = "x: [" + ", ".join(f"v{i}" for i in range(400)) + "]"
    col = src.index("v300") + 1
    d = Diagnostic("E013", "bad", Position("s.yaml", 1, col, 1, col + 4))
    out = render_text([d], {"s.yaml": src})
    row, marks = [ln for ln in out.splitlines() if ln.startswith((" 1 |", "   |"))][1:3]
    assert row.count("...") == 2 and len(row) < 200
    at = marks.index("^")
    assert row[at : at + 4] == "v300" and marks.count("^") == 4


def test_huge_values_are_shortened_in_messages(capsys, tmp_path):
    big = "x" * 100_000
    src = (SPECS / "gpt-tiny.yaml").read_text().replace("remat: none", "").replace(
        "  seed: 0", f"  seed: 0\n  remat: {big}")
    rc, _out, err = run(capsys, "validate", _spec_with(tmp_path, "s.yaml", src))
    assert rc == 1 and "E013" in err and len(err) < 3000, len(err)


@pytest.mark.parametrize(
    "edit, code, at",
    [
        # an invalid mapping key: at the key, not at its value
        (('dims: {vocab: 256,', 'dims: {"bad key": 3, vocab: 256,'), "E013", '"bad key"'),
        # a negative stage: at `stage`, not as a bad `repeat`
        (("{repeat: layers, block: decoder, name: blocks}", "{repeat: layers, block: decoder, name: blocks, stage: -1}"),
         "E013", "-1}"),
        # an unclosed quote: where it opens, not at the end of the file
        (("name: gpt-tiny", 'name: "gpt-tiny'), "E001", '"gpt-tiny'),
        # a 10,000-deep nesting: at the bracket past the limit, not at 1:1
        (("data: {kind: synthetic}", "data: " + "[" * 10_000 + "]" * 10_000), "E006", "[[[["),
    ],
)
def test_positions_point_at_the_offending_node(capsys, tmp_path, edit, code, at):
    src = (SPECS / "gpt-tiny.yaml").read_text()
    assert edit[0] in src
    path = _spec_with(tmp_path, "s.yaml", src.replace(edit[0], edit[1]))
    diags = validate_json(capsys, path)
    assert [d["code"] for d in diags] == [code], diags
    d = diags[0]
    line = path.read_text().split("\n")[d["line"] - 1]
    assert line[d["col"] - 1 :].startswith(at), (line[:80], d)
