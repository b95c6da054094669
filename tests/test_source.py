"""Loading: plain data plus a position for every key and value, in YAML and in TOML."""

from __future__ import annotations

import json
import math
import re
import tomllib

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mithril_spec.diagnostics import DiagnosticError
from mithril_spec.source import load_text


def at(text: str, pos) -> str:
    """The text from a position to the end of its line."""
    return text.splitlines()[pos.line - 1][pos.col - 1 :]


# ---------------------------------------------------------------- YAML


YAML = """\
# comment
version: 1
model:
  layers:
    - {op: linear, name: fc1}
    - op: relu
      name: act
  tags: [a, "b c"]
lr: 1e-3
big: 3.0e-4
"""


def test_yaml_values_and_positions():
    doc = load_text(YAML, "s.yaml")
    assert doc.data["model"]["layers"][0] == {"op": "linear", "name": "fc1"}
    assert doc.data["lr"] == 0.001 and doc.data["big"] == 0.0003  # 1e-3 is a float (YAML 1.2, like TOML)
    assert at(YAML, doc.pos(("model", "layers", 0, "name"))) == "fc1}"
    assert at(YAML, doc.pos(("model", "layers", 0, "name"), key=True)) == "name: fc1}"
    assert at(YAML, doc.pos(("model", "layers", 1))) == "op: relu"
    assert at(YAML, doc.pos(("model", "layers", 1, "name"))) == "act"
    assert at(YAML, doc.pos(("model", "tags", 1))) == '"b c"]'
    assert at(YAML, doc.pos(("version",), key=True)) == "version: 1"
    # a missing path falls back to its nearest ancestor
    assert doc.pos(("model", "layers", 1, "nope")) == doc.pos(("model", "layers", 1))
    assert doc.pos(("nope",)) == doc.pos(())


def test_yaml_keys_are_their_text_as_written():
    # (`null:` was the key "None", `on:` and `True:` "true", `0x1F:` "31": a dim `on` became `true`)
    doc = load_text("1: a\ntrue: b\nnull: c\non: d\nTrue: e\n~: f\n0x1F: g\n\"q r\": h\n", "s.yaml")
    assert doc.data == {"1": "a", "true": "b", "null": "c", "on": "d", "True": "e", "~": "f", "0x1F": "g", "q r": "h"}
    with pytest.raises(DiagnosticError) as e:
        load_text("on: 1\n'on': 2\n", "s.yaml")
    assert [(d.code, d.pos.line) for d in e.value.diagnostics] == [("E003", 2)]


def test_yaml_dates_and_bad_scalars_stay_text():
    doc = load_text("a: 2001-01-01\nb: 2001-02-30\nc: !!float abc\nd: !!str 5\n", "s.yaml")
    assert doc.data == {"a": "2001-01-01", "b": "2001-02-30", "c": "abc", "d": "5"}


@pytest.mark.parametrize("text", [
    "d: !!binary aGk=\n",  # (was the text "b'hi'")
    "d: !!python/object:os.system {kind: synthetic}\n",  # a tag on a mapping or list was ignored
    "d: !!set {a: 1}\n",
    "d: !!omap [a: 1]\n",
    "d: !local x\n",
    "d: !!timestamp 2001-01-01\n",
])
def test_yaml_tags_other_than_the_standard_ones_are_refused(text):
    with pytest.raises(DiagnosticError) as e:
        load_text(text, "s.yaml")
    [d] = e.value.diagnostics
    assert (d.code, d.pos.line, d.pos.col) == ("E001", 1, 4)
    assert "is not supported" in d.message and d.help.startswith("remove the tag")


@pytest.mark.parametrize("text, value", [
    ("1:20", "1:20"),  # YAML 1.1's base 60 (was the integer 80)
    ("1:20.5", "1:20.5"),  # (was 80.5)
    ("017", "017"),  # YAML 1.1's octal (was 15)
    ("0o17", 15), ("0x1F", 31), ("0b101", 5), ("1_000", 1000), ("+5", 5), ("-0", 0),  # as in TOML
    ("1e-3", 0.001), ("1.5E+3", 1500.0), ("-.5", -0.5), ("1.", 1.0), ("-.inf", -math.inf),
])
def test_yaml_numbers_without_yaml_1_1_surprises(text, value):
    assert load_text(f"a: {text}\n", "s.yaml").data["a"] == value


def test_yaml_merge_keys():
    doc = load_text("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n", "s.yaml")
    assert doc.data["other"] == {"x": 1, "y": 3}


@pytest.mark.parametrize(
    "text, code, line, col",
    [
        ("a: [1, 2\n", "E001", 1, 4),  # the `[` never closed (the file ends at 1:9)
        ("a: 1\na: 2\n", "E003", 2, 1),
        ("a:\n  b: 1\n  b: 2\n", "E003", 3, 3),
        ("? [a]\n: 1\n", "E001", 1, 3),
        ("a: !!python/name:os.system x\n", "E001", 1, 4),
        ("a: *nope\n", "E001", 1, 4),
        ("a: 1\n---\nb: 2\n", "E001", 2, 1),
        ("a: 'x\x07'\n", "E001", 1, 6),
    ],
)
def test_yaml_errors(text, code, line, col):
    with pytest.raises(DiagnosticError) as e:
        load_text(text, "s.yaml")
    (d,) = e.value.diagnostics
    assert (d.code, d.pos.line, d.pos.col) == (code, line, col), d


# ---------------------------------------------------------------- TOML

TOML = """\
# comment
version = 1
b.c = "x"   # dotted key
"q k".d = [1,
  2, { e = 3 }]
s = \"\"\"multi
line\"\"\"
lit = 'say "hi"'
esc = "tab\\there"

[tab]
x = 1
[tab.sub]
y = [ [1], [2, 3] ]

[[arr]]
n = 1
[[arr]]
n = 2
[arr.inner]
m = 3
[[arr.list]]
when = 2020-01-01T00:00:00Z
k = 1
"""


def test_toml_values_and_positions():
    doc = load_text(TOML, "s.toml")
    assert doc.data == tomllib.loads(TOML)
    assert at(TOML, doc.pos(("b", "c"))) == '"x"   # dotted key'
    assert at(TOML, doc.pos(("b", "c"), key=True)) == 'c = "x"   # dotted key'
    assert at(TOML, doc.pos(("q k",), key=True)).startswith('"q k".d')
    assert at(TOML, doc.pos(("q k", "d", 1))) == "2, { e = 3 }]"
    assert at(TOML, doc.pos(("q k", "d", 2, "e"))) == "3 }]"
    assert at(TOML, doc.pos(("esc",))) == '"tab\\there"'
    assert at(TOML, doc.pos(("tab", "sub", "y", 1, 1))) == "3] ]"
    assert at(TOML, doc.pos(("arr", 1, "n"))) == "2"
    assert doc.pos(("arr", 1, "n")).line == 19
    assert at(TOML, doc.pos(("arr", 1, "inner", "m"))) == "3"
    assert doc.pos(("arr", 1, "list", 0, "k")).line == 24  # [[arr.list]] belongs to the second [[arr]]
    assert at(TOML, doc.pos(("arr", 1, "list", 0, "when"))) == "2020-01-01T00:00:00Z"
    assert doc.pos(("tab",), key=True).line == 11


@pytest.mark.parametrize(
    "text, code, line, col, message",
    [
        ("a = \n", "E002", 1, 5, "TOML syntax error"),
        ('a = "x\n', "E002", 1, 5, "TOML syntax error"),  # the quote never closed (the line ends at 1:7)
        ("a = 1\na = 2\n", "E003", 2, 1, "`a` is already defined"),
        ("a = 1\n  b = 2\n  a = [1,\n 2]\n", "E003", 3, 3, "`a` is already defined"),
        ("[t]\nx = 1\n[t]\n", "E003", 3, 1, "table `[t]` is declared twice"),
        ("x = {a = 1, a = 2}\n", "E003", 1, 13, "duplicate key `a` in an inline table"),
        # an inline table or array extended later (was E002 "Cannot mutate immutable namespace" at the line's
        # end with a syntax help, or "table `[t.a.b]` is declared twice" of a table declared once)
        ("a = {x = 1}\na.y = 2\n", "E003", 2, 1, "`a` is an inline table, written whole at line 1"),
        ("[t]\na = {x = 1}\n[t.a.b]\n", "E003", 3, 1, "`t.a` is an inline table, written whole at line 2"),
        ("a = [1]\n[[a]]\nx = 1\n", "E003", 2, 1, "`a` is an array, written whole at line 1"),
    ],
)
def test_toml_errors(text, code, line, col, message):
    with pytest.raises(DiagnosticError) as e:
        load_text(text, "s.toml")
    (d,) = e.value.diagnostics
    assert (d.code, d.pos.line, d.pos.col) == (code, line, col), d
    assert message in d.message


# ---------------------------------------------------------------- syntax errors: where the mistake is

# The cases measured in issue 35 (item 7), in specs like specs/mlp-dp.yaml and specs/mlp-dp.toml: before,
# each was reported where the parser stopped (4:6, 17:3, 12:1, 2:13).
HEAD_YAML = "version: 1\nname: mlp\n"
MODEL_YAML = """model:
  inputs:
    x: {shape: [batch, features], dtype: float32}
    y: {shape: [batch], dtype: int32}
  layers:
    - {op: linear, name: fc1, dimension: hidden, input: x}
    - {op: relu, name: act1}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
"""
UNCLOSED_BRACE_YAML = HEAD_YAML + "dims: {features: 64, hidden: 256, classes: 10\n" + MODEL_YAML
STEPS_YAML = (HEAD_YAML + "dims: {features: 64, hidden: 256, classes: 10}\n" + MODEL_YAML
              + "meshes: {default: {data: 8}}\ntraining:\n  batch_size: 64\n  steps 20\n"
              "  optimizer: {name: adamw, lr: 1.0e-3}\n")
LAYERS_TOML = """version = 1
name = "mlp"
[dims]
features = 64
classes = 10
[model]
inputs = { x = { shape = ["batch", "features"] }, y = { shape = ["batch"], dtype = "int32" } }
layers = [
  { op = "linear", name = "head", dimension = "classes", input = "x" },
  { op = "relu", name = "act" }

[model.loss]
op = "cross_entropy"
"""
ESCAPE_TOML = 'version = 1\nname = "ab\\qc"\n'


@pytest.mark.parametrize(
    "file, text, primary, secondary, says",
    [
        # YAML: brackets and quotes never closed, where they open; the label where the parser stopped
        ("s.yaml", UNCLOSED_BRACE_YAML, (3, 7), (4, 6), "this `{` is never closed"),
        ("s.yaml", "targets: [jax, torch\nmodel:\n", (1, 10), (2, 6), "this `[` is never closed"),
        ("s.yaml", "dims: {features: 16, classes: [4}\n", (1, 31), (1, 33), "this `[` is never closed"),
        ("s.yaml", "a: [1, 2\n", (1, 4), (1, 9), "this `[` is never closed"),
        ("s.yaml", "x: [\"]\", 'it''s]', # ]\n  1\n", (1, 4), (2, 4), "this `[` is never closed"),
        ("s.yaml", 'version: 1\nname: "x\nmodel: {}\n', (2, 7), (3, 10), "a quoted string is never closed"),
        ("s.yaml", "version: 1\nname: 'x\nmodel: {}\n", (2, 7), (3, 10), "a quoted string is never closed"),
        # YAML: a key without its `:`, at the key
        ("s.yaml", STEPS_YAML, (16, 3), (17, 3), "a key without its `:`"),
        ("s.yaml", "training\n  batch_size: 16\n", (1, 1), (2, 13), "a key without its `:`"),
        ("s.yaml", "model:\n  inputs\n    x: 1\n", (2, 3), (3, 6), "a key without its `:`"),
        ("s.yaml", "model:\n  inputs\n\n  # x\n    x: 1\n", (2, 3), (5, 5), "a key without its `:`"),
        ("s.yaml", "- foo\n  bar: 1\n", (1, 3), (2, 6), "a key without its `:`"),
        # YAML: a tab, where it stands; a closed bracket with a mistake inside: the mistake, and where it opens
        ("s.yaml", "a: 1\n\tb: 2\n", (2, 1), None, "a tab indents this line"),
        ("s.yaml", "a: {b: 1 c: 2}\n", (1, 11), (1, 4), "expected ',' or '}'"),
        ("s.yaml", "a: b: c\n", (1, 5), None, "mapping values are not allowed here"),
        # TOML: brackets and strings never closed, where they open
        ("s.toml", LAYERS_TOML, (8, 10), (12, 1), "this `[` is never closed"),
        ("s.toml", "x = [1,\n", (1, 5), (1, 8), "this `[` is never closed"),
        ("s.toml", "x = {a = [1, 2}\n", (1, 10), (1, 15), "this `[` is never closed"),
        ("s.toml", 'dims = { a = 1, b = 2\nname = "x"\n', (1, 8), (1, 22), "this `{` is not closed on its line"),
        ("s.toml", "x = {a = 1,\n b = 2}\n", (1, 5), (1, 12), "this `{` is not closed on its line"),
        ("s.toml", 'x = {a = "}", b = 2\n', (1, 5), (1, 20), "this `{` is not closed on its line"),
        ("s.toml", "[dims\nx = 1\n", (1, 1), (1, 6), "this table header is not closed on its line"),
        ('s.toml', 'name = "abc\nx = 1\n', (1, 8), (1, 12), "this string is never closed"),
        ("s.toml", "x = 'abc\n", (1, 5), (1, 9), "this string is never closed"),
        ("s.toml", 'x = """abc\ny = 1\n', (1, 5), (2, 6), "this string is never closed"),
        # TOML: escapes at their backslash; a key without its `=`, at the key
        ("s.toml", ESCAPE_TOML, (2, 11), None, "`\\q` is not an escape"),
        ("s.toml", 'x = "a\\u12"\n', (1, 7), None, "`\\u12` is not an escape"),
        ("s.toml", 'x = "\\\\\\q"\n', (1, 8), None, "`\\q` is not an escape"),
        ("s.toml", 'version = 1\nname "x"\n', (2, 1), (2, 6), "a key without its `=`"),
        ("s.toml", "x = {a = 1, b 2}\n", (1, 13), (1, 15), "a key without its `=`"),
        # TOML: a closed array with a mistake inside: the mistake, and where the array opens
        ("s.toml", "x = [1, 2 3]\n", (1, 11), (1, 5), "expected `,` or `]`"),
        ("s.toml", "[a.b c]\n", (1, 6), None, "Expected ']'"),
    ],
)
def test_syntax_errors_point_where_the_mistake_is(file, text, primary, secondary, says):
    with pytest.raises(DiagnosticError) as e:
        load_text(text, file)
    (d,) = e.value.diagnostics
    assert d.code == ("E001" if file.endswith(".yaml") else "E002")
    assert (d.pos.line, d.pos.col) == primary, d
    assert [(lab.pos.line, lab.pos.col) for lab in d.labels] == ([secondary] if secondary else []), d
    assert says in d.message and d.help, d


def test_syntax_error_spans_and_help_lines():
    def diag(text: str, file: str):
        with pytest.raises(DiagnosticError) as e:
            load_text(text, file)
        return e.value.diagnostics[0]

    d = diag(STEPS_YAML, "s.yaml")  # the whole key line, without its comment
    assert (d.pos.end_line, d.pos.end_col) == (16, 11) and d.help == "add `:` after the key: `steps: 20`"
    assert d.labels[0].message == "the parser stopped here"
    d = diag(UNCLOSED_BRACE_YAML, "s.yaml")
    assert (d.pos.end_line, d.pos.end_col) == (3, 8) and d.help == "close the `{` opened here with `}`"
    d = diag("a: [1, 2  # ]\n", "s.yaml")
    assert d.labels[0].message == "the file ends before the `[` is closed"
    d = diag(ESCAPE_TOML, "s.toml")
    assert (d.pos.end_line, d.pos.end_col) == (2, 13) and "`\\\\` for a backslash" in d.help
    d = diag('version = 1\nname "x"\n', "s.toml")
    assert (d.pos.end_line, d.pos.end_col) == (2, 5) and d.help == 'add `=` after the key: `name = "x"`'
    d = diag('name = "abc\nx = 1\n', "s.toml")
    assert d.labels[0].message == "the line ends before its closing quote"
    d = diag("x = [\n", "s.toml")
    assert d.labels[0].message == "the file ends before it is closed"


def test_a_syntax_error_renders_both_places():
    from mithril_spec.diagnostics import render_github, render_text

    with pytest.raises(DiagnosticError) as e:
        load_text(LAYERS_TOML, "s.toml")
    assert render_text(e.value.diagnostics, {"s.toml": LAYERS_TOML}) == """\
s.toml:8:10: error[E002]: TOML syntax error: this `[` is never closed (expected `,` or `]`)
    |
  8 | layers = [
    |          ^
...
 12 | [model.loss]
    | - the parser stopped here
  = help: close the `[` opened here with `]`
"""
    assert render_github(e.value.diagnostics) == (
        "::error file=s.toml,line=8,col=10,title=E002::TOML syntax error: this `[` is never closed (expected `,` "
        "or `]`) (the parser stopped here: line 12, column 1) (help: close the `[` opened here with `]`)\n")


def test_the_bracket_scanners_skip_strings_and_comments():
    from mithril_spec.syntax import _TOML_TOKENS, _YAML_TOKENS, _closers, _toml_scan

    text = 'a = ["]", \'[\', """\n]"""  # ]\n, [1]]\n'
    assert _closers(_TOML_TOKENS, text, 4) == {4: len(text) - 2, text.index("[1"): text.index("1]") + 1}
    assert _closers(_TOML_TOKENS, "a = [1, {b = 2]", 4) == {}  # `]` does not close `{`: neither is closed
    text = 'a = {b = "x\\"y]", c = \'z}\', d = [1, 2'
    scan = _toml_scan(text, len(text))
    assert [(c, at) for c, at, _ in scan.open] == [("{", 4), ("[", text.index("[1"))] and scan.inside is None
    assert scan.unclosed is None and _toml_scan("x = {a = 1, b 2}", 14).key_from == 11
    scan = _toml_scan('a = "x\nb = 1\n', 6)
    assert scan.unclosed == (4, 1) and scan.inside == (4, 6)
    text = "x: [it's, \"a]\", 'b]' # ]\n  ]\n"
    assert _closers(_YAML_TOKENS, text, 3) == {3: len(text) - 2}


# A property: for any document, the TOML scanner's positions point at each value's text (written in
# several TOML styles: tables, arrays of tables, dotted keys, inline tables, multi-line arrays).

KEY = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True) | st.sampled_from(["with space", "dot.ted", "é"])
SCALAR = (
    st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
DOC = st.recursive(
    SCALAR, lambda c: st.lists(c, max_size=3) | st.dictionaries(KEY, c, min_size=1, max_size=3), max_leaves=12
)


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k, ensure_ascii=False)


def _scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, int):
        return str(v)
    return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")


def _inline(v, rnd) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_inline(x, rnd)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        sep = ",\n  " if rnd.random() < 0.3 else ", "
        return "[" + sep.join(_inline(x, rnd) for x in v) + "]"
    return _scalar(v)


def _write(table: dict, header: list[str], rnd, out: list[str], aot: bool = False) -> None:
    later = []
    if header:
        out.append(("[[" if aot else "[") + ".".join(map(_key, header)) + ("]]" if aot else "]"))
    for k, v in table.items():
        if isinstance(v, dict) and rnd.random() < 0.5:
            later.append((k, v, False))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v) and rnd.random() < 0.5:
            later.append((k, v, True))
        else:
            out.append(f"{_key(k)} = {_inline(v, rnd)}")
    for k, v, is_aot in later:
        if is_aot:
            for item in v:
                _write(item, header + [k], rnd, out, aot=True)
        else:
            _write(v, header + [k], rnd, out)


def _leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, path + (i,))
    else:
        yield path, node


@settings(max_examples=150, deadline=None, database=None)
@given(st.dictionaries(KEY, DOC, min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_toml_positions_point_at_values(data, rnd):
    lines: list[str] = []
    _write(data, [], rnd, lines)
    text = "\n".join(lines) + "\n"
    parsed = tomllib.loads(text)
    doc = load_text(text, "p.toml")
    assert doc.data == parsed
    offsets = [0]
    for line in text.split("\n"):  # TOML lines end at "\n" only (a NEL or U+2028 in a string is no break)
        offsets.append(offsets[-1] + len(line) + 1)
    for path, value in _leaves(parsed):
        assert path in doc.values, (path, text)
        pos = doc.values[path]
        start = offsets[pos.line - 1] + pos.col - 1
        assert text[start:].startswith(_scalar(value)), (path, value, text[start : start + 20], text)
        for i in range(1, len(path) + 1):
            if isinstance(path[i - 1], str):
                kpos = doc.pos(path[:i], key=True)
                kstart = offsets[kpos.line - 1] + kpos.col - 1
                assert text[kstart:].startswith(_key(path[i - 1])) or text[kstart] == "[", (path[:i], text)


# Strings such as `1e3` are left out: PyYAML dumps them unquoted (its floats need a dot) and the loader
# reads them back as numbers, as YAML 1.2 and TOML do (on purpose: `lr: 1e-3` is a number to a spec author).
YAML_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=8).filter(
    lambda s: not re.match(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$", s.strip())
)
YAML_DOC = st.recursive(
    st.booleans() | st.integers(-(10**20), 10**20) | YAML_TEXT,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(KEY, c, min_size=1, max_size=3),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None, database=None)
@given(st.dictionaries(KEY, YAML_DOC, min_size=1, max_size=4))
def test_yaml_positions_point_at_values(data):
    """(Values come from DOC: YAML folds NEL and U+2028 in scalars, so those are left out below.)"""
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=None, width=60)
    doc = load_text(text, "p.yaml")
    assert doc.data == data
    for path, value in _leaves(data):
        pos = doc.values[path]
        line = text.splitlines()[pos.line - 1]
        assert pos.col <= len(line) + 1
        if isinstance(value, bool):
            assert line[pos.col - 1 :].startswith(str(value).lower())
        elif isinstance(value, int):
            assert line[pos.col - 1 :].startswith(str(value))
