"""`--set KEY=VALUE` on validate, plan and build (docs/spec.md "Overrides"): applied after `extends`, in
order, YAML-typed; diagnostics about an overridden value point at the argument; malformed arguments are
usage errors. An override names something: KEY=VALUE a key the spec has, +KEY=VALUE one it lacks, ++KEY=VALUE
either; otherwise E007 at the argument."""

from __future__ import annotations

import json
import re
from pathlib import Path

from program_files import program_text
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
    text = program_text(out)
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
        ("+=3", "expected KEY=VALUE"),
        ("training..steps=3", "dotted path"),
        ("+++dims.x=3", "dotted path"),
        ("model.layers.0=null", "list entries cannot be removed"),
        # `extends` is merged before the overrides: `+extends=x.yaml` was accepted and changed nothing, and
        # `extends=x.yaml` was E007 with the help "write `--set +extends=x.yaml`"
        ("+extends=_base.yaml", "`extends` is merged before the overrides"),
        ("extends=_base.yaml", "`extends` is merged before the overrides"),
        ("++extends.x=1", "`extends` is merged before the overrides"),
    ):
        rc, _out, err = run(capsys, "validate", GPT, "--set", arg)
        assert rc == 2, (arg, err)
        assert says in err and err.count("\n") == 1, (arg, err)


def test_validate_applies_overrides_to_every_file(capsys):
    rc, _out, err = run(capsys, "validate", GPT, ROOT / "specs" / "mlp-dp.yaml", "--set", "training.steps=0")
    assert rc == 1
    assert err.count("error[E013]") == 2, err


def diagnose(capsys, *settings, spec=GPT):
    """validate with `settings`: (exit code, the JSON diagnostics, the text rendering)."""
    rc, out, _err = run(capsys, "validate", spec, "--format", "json", *settings)
    rc_text, _out, err = run(capsys, "validate", spec, "--color", "never", *settings)
    assert rc == rc_text
    return rc, json.loads(out), err


def test_a_key_the_spec_lacks_is_an_error_at_the_argument(capsys):
    rc, out, err = run(capsys, "plan", GPT, "--color", "never", "--set", "dims.nope=2")
    assert rc == 1 and out == ""
    assert err.startswith("--set #1:1:6: error[E007]: `dims.nope` is not in the spec: `dims` has no key `nope`\n")
    assert " | dims.nope=2\n" in err and "\n   |      ^^^^\n" in err  # the carets under `nope`
    assert "`dims` is defined here" in err  # a label on the spec's `dims`
    assert "= help: to add `dims.nope`, write `--set +dims.nope=2`" in err
    assert "= note: `dims` has the keys `d`, `ff`, `heads`, `layers`, `seq`, `vocab`" in err
    # a misspelling: the closest key, in a later --set
    rc, (d,), _err = diagnose(capsys, "--set", "dims.layers=2", "--set", "training.optimzer.lr=1")
    assert rc == 1 and d["code"] == "E007"
    assert (d["file"], d["line"], d["col"], d["end_col"]) == ("--set #2", 1, 10, 18)
    assert d["help"] == "did you mean `training.optimizer.lr`?"
    assert d["notes"] == ["to add `training.optimzer.lr`, write `--set +training.optimzer.lr=1`"]
    # a key the spec language has but this spec does not is not added by a plain --set either
    rc, (d,), _err = diagnose(capsys, "--set", "training.grad_accum=2")
    assert rc == 1 and d["code"] == "E007" and "`--set +training.grad_accum=2`" in d["help"]


def test_paths_through_lists_and_scalars(capsys):
    got = plan(capsys, GPT, "--set", "model.blocks.decoder.4.hidden=256", "--set", "training.optimizer.betas.1=0.9")
    (fc,) = [p for p in got["repeats"][0]["params"] if p["name"] == "mlp.fc.weight"]
    assert fc["shape"] == [128, 256]  # the block's 5th layer, the mlp
    for arg, col, says in (
        ("model.layers.9.dim=3", 14, "`model.layers` is a list of 5 entries (indices 0 to 4)"),
        ("model.layers.5={op: relu}", 14, "`model.layers` is a list of 5 entries"),
        ("model.layers.x.dim=3", 14, "`model.layers` is a list (indices 0 to 4), indexed by number"),
        ("training.optimizer.lr.x=1", 23, "`training.optimizer.lr` is a number, not a mapping or a list"),
    ):
        rc, (d,), _err = diagnose(capsys, "--set", arg)
        assert rc == 1 and d["code"] == "E007", arg
        assert (d["file"], d["line"], d["col"]) == ("--set #1", 1, col) and says in d["message"], (arg, d)
    rc, (d,), _err = diagnose(capsys, "--set", "model.layers.5={op: relu}")
    assert d["help"] == "to append an entry, write `--set '+model.layers.5={op: relu}'`"


def test_plus_adds_a_key_and_only_a_new_one(capsys):
    base = plan(capsys, GPT)
    got = plan(capsys, GPT, "--set", "+training.grad_accum=2", "--set", "+dims.new=3")
    assert got["batch"]["grad_accum"] == 2 and base["batch"]["grad_accum"] == 1
    rc, _diags, err = diagnose(capsys, "--set", "+dims.layers=2")
    assert rc == 1
    assert "--set #1:1:1: error[E007]: `dims.layers` is already in the spec: `+` adds a key that is not there" in err
    assert " | +dims.layers=2\n" in err and "| ^^^^^^^^^^^^\n" in err
    assert ("= help: to change it, write `--set dims.layers=2` (`--set ++dims.layers=2` sets it whether it is there "
            "or not)") in err
    # mappings on the way are created, and what the addition holds is checked where it stands
    rc, (d,), _err = diagnose(capsys, "--set", "+training.optimzer.lr=1")
    assert rc == 1 and (d["code"], d["file"], d["col"], d["end_col"]) == ("E010", "--set #1", 2, 19)
    assert d["help"] == "did you mean `optimizer`?"
    # a list's length appends: the new layer is there (its output unused, where it stands)
    rc, (d,), _err = diagnose(capsys, "--set", "+model.layers.5={op: relu, name: r}")
    assert (d["code"], d["file"], d["col"]) == ("E027", "--set #1", 17)
    # `+KEY=null` adds nothing
    rc, (d,), _err = diagnose(capsys, "--set", "+dims.new=null")
    assert rc == 1 and d["code"] == "E007" and "adds nothing" in d["message"]


def test_plus_plus_sets_a_key_either_way(capsys):
    got = plan(capsys, GPT, "--set", "++dims.layers=3", "--set", "++training.grad_accum=2", "--set",
               "++dims.nope=null", "--set", "++training.checkpoint=null")
    assert [r["count"] for r in got["repeats"]] == [3] and got["batch"]["grad_accum"] == 2
    # an added key can then be changed, and removed, by the plain spelling
    plan(capsys, GPT, "--set", "+dims.new=3", "--set", "dims.new=4", "--set", "dims.new=null")


def test_removing_a_key_the_spec_lacks_is_an_error(capsys):
    rc, (d,), _err = diagnose(capsys, "--set", "data.knd=null")
    assert rc == 1 and d["code"] == "E007"
    assert (d["file"], d["col"]) == ("--set #1", 6) and d["message"].endswith("has no key `knd` to remove")
    assert d["help"] == "did you mean `data.kind`?"


def test_a_removed_key_that_is_missing_names_the_override(capsys):
    rc, (d,), err = diagnose(capsys, "--set", "name=null")
    assert rc == 1 and d["code"] == "E011" and d["file"] == str(GPT)
    assert [(lab["file"], lab["col"], lab["message"]) for lab in d["labels"]] == [
        ("--set #1", 1, "removed by this --set")]
    assert " | name=null\n" in err


def test_an_invalid_value_is_underlined_in_the_argument(capsys):
    for arg, code, col, end in (
        ("training.optimizer.lr=abc", "E012", 23, 26),
        ("dims.layers=-1", "E013", 13, 15),
        ("training.optimizer={name: adamw, lr: x}", "E012", 38, 39),
        ("training.optimizer.betas=[0.9, 2]", "E013", 32, 33),
        ("meshes.default={data: 2, tensr: 2}", "E040", 26, 31),
    ):
        rc, diags, err = diagnose(capsys, "--set", arg)
        assert rc == 1, arg
        (d,) = [d for d in diags if d["code"] == code]
        assert (d["file"], d["line"], d["col"], d["end_col"]) == ("--set #1", 1, col, end), (arg, d)
        assert f"--set #1:1:{col}: error[{code}]" in err
        assert f" | {arg}\n" in err and re.search(rf"\n +\| {' ' * (col - 1)}\^{{{end - col}}}\n", err), err


def test_a_build_records_its_overrides_as_written():
    from mithril_spec.render.build import origin

    assert origin("specs/gpt-tiny.yaml", ["+dims.new=3", "++training.seed=1", "data.path=data/train.bin",
                                          "meshes.default={data: 4}"]) == (
        "gpt-tiny.yaml --set +dims.new=3 --set ++training.seed=1 --set data.path=data/train.bin "
        "--set 'meshes.default={data: 4}'")
