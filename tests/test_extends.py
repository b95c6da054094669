"""`extends:`: merge rules, bases in subdirectories, chains, and positions that point into the right file."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from mithril_spec import cli
from mithril_spec.diagnostics import DiagnosticError
from mithril_spec.extends import _merge, load_spec_file
from mithril_spec.frontend import compile_file

BASE = textwrap.dedent(
    """\
    version: 1
    name: base
    description: the base spec
    dims: {features: 16, hidden: 32, classes: 4}
    model:
      inputs:
        x: {shape: [batch, features]}
        y: {shape: [batch], dtype: int32}
      layers:
        - {op: linear, name: fc1, dimension: hidden, input: x}
        - {op: relu, name: act}
        - {op: linear, name: head, dimension: classes}
      loss: {op: cross_entropy, logits: head, targets: y}
    meshes:
      default: {data: 2}
      four: {data: 4}
    sharding:
      rules: {batch: data}
    training:
      batch_size: 8
      steps: 3
      optimizer: {name: adamw, lr: 0.001, weight_decay: 0.1}
    """
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def tree(tmp_path) -> Path:
    write(tmp_path / "bases" / "mlp.yaml", BASE)
    return tmp_path


def validate_json(capsys, path) -> tuple[int, list[dict]]:
    rc = cli.main(["validate", str(path), "--format", "json"])
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip() else []


# ---------------------------------------------------------------- merge rules


def test_merge_rules_unit():
    base = {"a": 1, "m": {"x": 1, "y": {"p": 1, "q": 2}}, "l": [1, 2, 3], "gone": {"k": 1}, "keep": "s"}
    over = {"a": 2, "m": {"y": {"q": 3, "r": 4}}, "l": [9], "gone": None, "new": [1]}
    assert _merge(base, over) == {
        "a": 2,
        "m": {"x": 1, "y": {"p": 1, "q": 3, "r": 4}},  # mappings merge key by key, recursively
        "l": [9],  # lists are replaced whole
        "keep": "s",
        "new": [1],
    }  # and null removes `gone`
    assert base["m"]["y"] == {"p": 1, "q": 2}  # inputs are not modified
    assert _merge({"a": {"b": 1}}, {"a": 5}) == {"a": 5}  # a scalar replaces a mapping
    assert _merge({"a": 5}, {"a": {"b": 1}}) == {"a": {"b": 1}}
    assert _merge({"a": 1}, {"b": None}) == {"a": 1}  # removing an absent key is fine


def test_mapping_merge_list_replace_null_remove(tree, capsys):
    spec = write(
        tree / "derived.yaml",
        """\
        extends: bases/mlp.yaml
        name: derived
        description: null          # removed
        dims: {hidden: 64}         # merged: features and classes stay
        model:
          layers:                  # replaced whole
            - {op: linear, name: head, dimension: classes, input: x}
        training:
          optimizer: {lr: 0.01}    # merged into the base optimizer
        """,
    )
    doc = load_spec_file(spec)
    assert "extends" not in doc.data
    assert "description" not in doc.data
    assert doc.data["dims"] == {"features": 16, "hidden": 64, "classes": 4}
    assert doc.data["training"]["optimizer"] == {"name": "adamw", "lr": 0.01, "weight_decay": 0.1}
    assert len(doc.data["model"]["layers"]) == 1
    assert doc.data["model"]["inputs"]["y"] == {"shape": ["batch"], "dtype": "int32"}
    c = compile_file(spec)
    assert c.spec.name == "derived" and c.spec.description is None
    assert [p.name for p in c.graph.params] == ["head.weight", "head.bias"]
    assert c.spec.training.optimizer.lr == 0.01
    # `hidden` is now unused but defined: fine. The plan works on every mesh.
    rc, diags = validate_json(capsys, spec)
    assert (rc, diags) == (0, [])


def test_null_removes_a_whole_section(tree, capsys):
    spec = write(tree / "derived.yaml", "extends: bases/mlp.yaml\nname: single\nmeshes: null\nsharding: null\n")
    c = compile_file(spec)
    assert c.spec.meshes is None and c.plan.mesh.devices == 1
    assert cli.main(["plan", str(spec), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["mesh"]["devices"] == 1


def test_null_for_a_key_no_base_has(tree, capsys):
    # a key the section has: removing it when absent is fine
    ok = write(tree / "ok.yaml", "extends: bases/mlp.yaml\nname: ok\ntraining: {checkpoint: null}\neval: null\n")
    assert validate_json(capsys, ok) == (0, [])
    # a misspelt key: it removed nothing and was dropped silently; now E010 where it is written, also when a spec
    # extends the spec that wrote it, and not when a later spec sets it (then it is checked as any value)
    write(tree / "mid.yaml", "extends: bases/mlp.yaml\nname: mid\ntraining:\n  optimiser: null\n")
    top = write(tree / "top.yaml", "extends: mid.yaml\nname: top\n")
    rc, diags = validate_json(capsys, top)
    assert rc == 1
    assert [(d["code"], Path(d["file"]).name, d["line"], d["col"], d["key"], d["help"]) for d in diags] == [
        ("E010", "mid.yaml", 4, 3, "optimiser", "did you mean `optimizer`?")]
    again = write(tree / "again.yaml", "extends: mid.yaml\nname: again\ntraining: {optimiser: {lr: 1}}\n")
    rc, diags = validate_json(capsys, again)
    assert [(d["code"], Path(d["file"]).name, d["line"]) for d in diags] == [("E010", "again.yaml", 3)]


def test_extends_path_too_long_for_the_file_system(tree, capsys):
    # (was exit 2 "derived.yaml: cannot read: File name too long", blaming the spec file and not its `extends`)
    spec = write(tree / "derived.yaml", f"extends: {'a' * 300}/base.yaml\nname: derived\n")
    rc, diags = validate_json(capsys, spec)
    assert rc == 1
    assert [(d["code"], d["line"], d["col"]) for d in diags] == [("E004", 1, 10)]
    assert "is not a usable path (File name too long)" in diags[0]["message"]


def test_base_in_subdirectory_validates_and_plans(tree, capsys):
    spec = write(tree / "derived.yaml", "extends: bases/mlp.yaml\nname: derived\ntraining: {batch_size: 16}\n")
    assert cli.main(["validate", str(spec)]) == 0
    capsys.readouterr()
    assert cli.main(["plan", str(spec), "--mesh", "four"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan for derived on mesh `four`: data=4 (4 device(s))")
    assert "16 global" in out and "4 per device" in out


def test_chain_and_toml_extending_yaml(tree, capsys):
    write(tree / "bases" / "wide.yaml", "extends: mlp.yaml\ndims: {hidden: 128}\n")
    spec = write(tree / "derived.toml", 'extends = "bases/wide.yaml"\nname = "chained"\n[training]\nsteps = 7\n')
    c = compile_file(spec)
    assert (c.spec.name, c.spec.dims["hidden"], c.spec.training.steps) == ("chained", 128, 7)
    assert c.graph.params[0].shape == (16, 128)


def test_directory_validation_skips_underscore_bases(tmp_path, capsys):
    write(tmp_path / "_base.yaml", BASE.replace("name: base", "name: base\nunfinished: true"))
    write(tmp_path / "a.yaml", "extends: _base.yaml\nname: a\nunfinished: null\n")
    rc = cli.main(["validate", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    assert "1 spec(s) checked" in capsys.readouterr().err


# ---------------------------------------------------------------- errors and positions


def test_error_inside_the_base_points_into_the_base(tree, capsys):
    write(tree / "bases" / "mlp.yaml", BASE.replace("dimension: hidden", "dimension: hiden"))
    spec = write(tree / "derived.yaml", "# derived\nextends: bases/mlp.yaml\nname: derived\n")
    rc, diags = validate_json(capsys, spec)
    assert rc == 1
    assert [(d["code"], Path(d["file"]).name, d["line"], d["col"]) for d in diags] == [("E020", "mlp.yaml", 10, 42)]
    assert diags[0]["file"] == str(tree / "bases" / "mlp.yaml")
    # the text rendering shows the base file's line
    assert cli.main(["validate", str(spec), "--color", "never"]) == 1
    err = capsys.readouterr().err
    assert f"{tree / 'bases' / 'mlp.yaml'}:10:42: error[E020]: undefined dim `hiden`" in err
    assert "    - {op: linear, name: fc1, dimension: hiden, input: x}" in err


def test_error_in_the_override_points_into_the_derived_spec(tree, capsys):
    spec = write(tree / "derived.yaml", "extends: bases/mlp.yaml\nname: derived\ntraining:\n  steps: many\n")
    _rc, diags = validate_json(capsys, spec)
    assert [(d["code"], d["file"], d["line"], d["col"]) for d in diags] == [("E012", str(spec), 4, 10)]


def test_overridden_value_position_and_kept_value_position(tree, capsys):
    """An override that breaks a base value: the position follows where each value came from."""
    spec = write(tree / "derived.yaml", "extends: bases/mlp.yaml\nname: d\nmeshes:\n  four: {data: 3}\n")
    rc, diags = validate_json(capsys, spec)
    assert rc == 1
    # batch 8 over data=3: E043 points at batch_size, which the base defines
    assert [(d["code"], Path(d["file"]).name, d["line"]) for d in diags] == [("E043", "mlp.yaml", 20)]
    assert "(mesh `four`)" in diags[0]["message"]


def test_syntax_error_in_a_toml_base(tree, capsys):
    write(tree / "bases" / "broken.toml", 'version = 1\nname = "x\n')
    spec = write(tree / "derived.yaml", "extends: bases/broken.toml\n")
    _rc, diags = validate_json(capsys, spec)
    assert [(d["code"], Path(d["file"]).name, d["line"]) for d in diags] == [("E002", "broken.toml", 2)]


@pytest.mark.parametrize(
    "extends, message",
    [
        ("../outside.yaml", "leaves the directory"),
        ("bases/../../outside.yaml", "leaves the directory"),
        ("/etc/passwd", "leaves the directory"),
        ("bases/none.yaml", "no such file"),
        ("bases/mlp.json", "is not a .yaml, .yml or .toml file"),
        ("derived.yaml", "forms a cycle"),
        ("''", "must be a relative path"),
        ("3", "must be a relative path"),
    ],
)
def test_bad_extends(tree, capsys, extends, message):
    write(tree.parent / "outside.yaml", BASE)
    spec = write(tree / "derived.yaml", f"name: d\nextends: {extends}\n")
    rc, diags = validate_json(capsys, spec)
    assert rc == 1
    assert [(d["code"], d["line"], d["col"]) for d in diags] == [("E004", 2, 10)]
    assert message in diags[0]["message"]


def test_indirect_cycle(tree, capsys):
    write(tree / "bases" / "a.yaml", "extends: b.yaml\n")
    write(tree / "bases" / "b.yaml", "name: b\nextends: a.yaml\n")
    spec = write(tree / "derived.yaml", "extends: bases/a.yaml\n")
    _rc, diags = validate_json(capsys, spec)
    assert [(d["code"], Path(d["file"]).name, d["line"]) for d in diags] == [("E004", "b.yaml", 2)]


def test_base_that_is_not_a_mapping(tree, capsys):
    write(tree / "bases" / "list.yaml", "- 1\n- 2\n")
    spec = write(tree / "derived.yaml", "name: d\nextends: bases/list.yaml\n")
    with pytest.raises(DiagnosticError) as e:
        load_spec_file(spec)
    assert [(d.code, Path(d.pos.file).name, d.pos.line) for d in e.value.diagnostics] == [("E005", "list.yaml", 1)]
    write(tree / "bases" / "empty.yaml", "# nothing\n")
    spec = write(tree / "derived.yaml", "name: d\nextends: bases/empty.yaml\n")
    _rc, diags = validate_json(capsys, spec)
    assert [(d["code"], Path(d["file"]).name) for d in diags] == [("E005", "empty.yaml")]
