"""`--set KEY=VALUE` on validate, plan and build (docs/spec.md "Overrides"): applied after `extends`, in
order, YAML-typed; diagnostics about an overridden value point at the argument; malformed arguments are
usage errors."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli import run

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "specs" / "gpt-tiny.yaml"


def plan(capsys, spec, *settings):
    rc, out, err = run(capsys, "plan", spec, "--format", "json", *settings)
    assert rc == 0, err
    return json.loads(out)


def test_overrides_change_the_plan(capsys):
    base = plan(capsys, GPT)
    got = plan(capsys, GPT, "--set", "dims.layers=3", "--set", "training.batch_size=32", "--set",
               "meshes.default={data: 4}")
    assert [r["count"] for r in base["repeats"]] == [4]
    assert [r["count"] for r in got["repeats"]] == [3]
    assert got["batch"]["global"] == 32 and base["batch"]["global"] == 16
    assert got["mesh"]["axes"] == {"data": 4} and base["mesh"]["axes"] != {"data": 4}


def test_later_overrides_win_and_values_are_yaml(capsys, tmp_path):
    out = tmp_path / "b"
    rc, _out, err = run(capsys, "build", GPT, "--target", "jax", "-o", out, "--set", "training.optimizer.lr=1",
                        "--set", "training.optimizer.lr=1e-3", "--set", "training.checkpoint=null")
    assert rc == 0, err
    text = (out / "train.py").read_text()
    assert "\nLR = 0.001\n" in text  # `1e-3` is a float, and the later --set won
    assert "\nCHECKPOINT_DIR = None  #" in text  # `null` removed the spec's checkpoint section
    assert ('SPEC_FILE = "gpt-tiny.yaml --set training.optimizer.lr=1 --set training.optimizer.lr=1e-3 '
            '--set training.checkpoint=null"') in text


def test_an_override_applies_after_extends(capsys, tmp_path):
    (tmp_path / "_base.yaml").write_text(GPT.read_text())
    child = tmp_path / "child.yaml"
    child.write_text("extends: _base.yaml\ndims: {layers: 2}\n")
    assert [r["count"] for r in plan(capsys, child)["repeats"]] == [2]
    assert [r["count"] for r in plan(capsys, child, "--set", "dims.layers=5")["repeats"]] == [5]


def test_a_bad_overridden_value_points_at_the_argument(capsys):
    rc, out, _err = run(capsys, "validate", GPT, "--format", "json", "--set", "training.optimizer.lr=-1")
    assert rc == 1
    (d,) = json.loads(out)
    assert d["code"] == "E013"
    assert (d["file"], d["line"], d["col"]) == ("--set #1", 1, 23)
    assert any(lab["file"] == str(GPT) and "replaces" in lab["message"] for lab in d["labels"])
    rc, _out, err = run(capsys, "validate", GPT, "--color", "never", "--set", "dims.d=64",
                        "--set", "training.optimizer.lr=-1")
    assert rc == 1
    assert "--set #2:1:23: error[E013]" in err
    assert " | training.optimizer.lr=-1\n" in err and "^" in err


def test_a_value_that_is_not_yaml_is_a_syntax_error_at_the_argument(capsys):
    rc, out, _err = run(capsys, "validate", GPT, "--format", "json", "--set", "dims={a: [1,")
    assert rc == 1
    (d,) = json.loads(out)
    assert d["code"] == "E001" and d["file"] == "--set #1"


def test_malformed_overrides_are_usage_errors(capsys):
    for arg, says in (
        ("training.steps", "expected KEY=VALUE"),
        ("=3", "expected KEY=VALUE"),
        ("training..steps=3", "dotted path"),
        ("training.optimizer.lr.x=1", "`training.optimizer.lr` is a float in the spec"),
        ("model.layers.99.dim=3", "is a list of"),
        ("model.layers.0=null", "list entries cannot be removed"),
    ):
        rc, _out, err = run(capsys, "validate", GPT, "--set", arg)
        assert rc == 2, (arg, err)
        assert says in err and err.count("\n") == 1, (arg, err)


def test_validate_applies_overrides_to_every_file(capsys):
    rc, _out, err = run(capsys, "validate", GPT, ROOT / "specs" / "mlp-dp.yaml", "--set", "training.steps=0")
    assert rc == 1
    assert err.count("error[E013]") == 2, err
