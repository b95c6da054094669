"""YAML and TOML twins mean the same thing: the same validated spec and byte-identical plans on every mesh."""

from __future__ import annotations

from pathlib import Path

import pytest

from mithril_spec import cli
from mithril_spec.frontend import compile_file

ROOT = Path(__file__).resolve().parent.parent
TWINS = [
    (ROOT / "specs" / "mlp-dp.yaml", ROOT / "specs" / "mlp-dp.toml"),
    (ROOT / "specs" / "gpt-tiny.yaml", ROOT / "tests" / "specs" / "twins" / "gpt-tiny.toml"),
]
IDS = [f"{y.stem}" for y, _ in TWINS]


def _plan(capsys, spec: Path, mesh: str | None) -> str:
    argv = ["plan", str(spec), "--format", "json"] + (["--mesh", mesh] if mesh else [])
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


@pytest.mark.parametrize("yaml_spec, toml_spec", TWINS, ids=IDS)
def test_twins_validate_to_the_same_spec(yaml_spec, toml_spec):
    a, b = compile_file(yaml_spec), compile_file(toml_spec)
    assert a.spec.model_dump() == b.spec.model_dump(), (
        f"{toml_spec.relative_to(ROOT)} no longer matches {yaml_spec.relative_to(ROOT)}: update the twin"
    )
    assert a.graph == b.graph


@pytest.mark.parametrize("yaml_spec, toml_spec", TWINS, ids=IDS)
def test_twins_plan_byte_identical_on_every_mesh(yaml_spec, toml_spec, capsys):
    meshes = list(compile_file(yaml_spec).spec.meshes or {})
    assert meshes == list(compile_file(toml_spec).spec.meshes or {})
    for mesh in [None, *meshes]:
        assert _plan(capsys, yaml_spec, mesh) == _plan(capsys, toml_spec, mesh), mesh
    # the text table too
    for spec in (yaml_spec, toml_spec):
        cli.main(["plan", str(spec)])
    a, b = capsys.readouterr().out.split("plan for ")[1:]
    assert a == b


@pytest.mark.parametrize("yaml_spec, toml_spec", TWINS, ids=IDS)
def test_twins_validate_clean(yaml_spec, toml_spec, capsys):
    assert cli.main(["validate", str(yaml_spec), str(toml_spec), "--strict"]) == 0


def test_same_error_same_code_in_both_languages(tmp_path, capsys):
    """A mistake gives the same diagnostic (code and message) whichever language the spec is written in."""
    yaml_text = (ROOT / "specs" / "mlp-dp.yaml").read_text().replace("dimension: classes", "dimension: clases")
    toml_text = (ROOT / "specs" / "mlp-dp.toml").read_text().replace('dimension = "classes"', 'dimension = "clases"')
    (tmp_path / "a.yaml").write_text(yaml_text)
    (tmp_path / "a.toml").write_text(toml_text)
    import json

    got = []
    for name in ("a.yaml", "a.toml"):
        assert cli.main(["validate", str(tmp_path / name), "--format", "json"]) == 1
        got.append([(d["code"], d["message"], d["help"]) for d in json.loads(capsys.readouterr().out)])
    assert got[0] == got[1] == [("E020", "undefined dim `clases`", "did you mean `classes`?")]


@pytest.mark.parametrize("target", ["jax", "torch", "mlx"])
@pytest.mark.parametrize("yaml_spec, toml_spec", TWINS, ids=IDS)
def test_twins_build_the_same_programs(yaml_spec, toml_spec, target):
    """Every file of the build is the same but for the spec file's name (so the program tests, e.g. the
    coverage of the examples, run one of the twins)."""
    from mithril_spec.diagnostics import DiagnosticError
    from mithril_spec.render.build import render_files

    def files(spec):
        try:
            return render_files(compile_file(spec), target, "SPEC")
        except DiagnosticError as e:  # a target that refuses the spec refuses both twins alike
            return str(e)

    a, b = files(yaml_spec), files(toml_spec)
    if isinstance(a, str):
        assert a == b
        return
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name] == b[name], name
