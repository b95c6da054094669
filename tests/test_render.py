"""Rendering: deterministic, formatted, parseable, escaped, golden-file reviewed, atomic."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from render_cases import ROOT, case_id, cases
from ruff.__main__ import find_ruff_bin

from mithril_spec import cli
from mithril_spec.frontend import compile_file
from mithril_spec.render.build import render_files
from mithril_spec.render.environment import py

CASES = cases()
GOLDEN = ROOT / "tests" / "golden"


def test_there_are_cases():
    targets = {t for _, t in CASES}
    assert {"jax", "torch"} <= targets, f"render cases cover only {targets}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_golden(case):
    """The rendered program equals the reviewed golden copy (UPDATE_GOLDEN=1 rewrites it)."""
    spec, target = case
    files = render_files(compile_file(spec), target, str(spec.relative_to(ROOT)))
    gdir = GOLDEN / f"{spec.stem}-{target}"
    if os.environ.get("UPDATE_GOLDEN"):
        gdir.mkdir(parents=True, exist_ok=True)
        for old in gdir.iterdir():
            old.unlink()
        for name, text in files.items():
            (gdir / name).write_text(text)
    assert gdir.is_dir(), f"no golden files for {gdir.name}: run UPDATE_GOLDEN=1 pytest tests/test_render.py"
    assert sorted(files) == sorted(p.name for p in gdir.iterdir())
    for name, text in files.items():
        assert text == (gdir / name).read_text(), f"{gdir.name}/{name} differs from golden (UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_deterministic_parses_and_ruff_clean(case, tmp_path):
    spec, target = case
    a = render_files(compile_file(spec), target, spec.name)
    b = render_files(compile_file(spec), target, spec.name)
    assert a == b
    for name, text in a.items():
        if name.endswith(".py"):
            ast.parse(text)
            (tmp_path / name).write_text(text)
    proc = subprocess.run([find_ruff_bin(), "format", "--isolated", "--line-length", "100", "--check", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_program_imports_only_stdlib_numpy_and_framework(case):
    spec, target = case
    text = render_files(compile_file(spec), target, spec.name)["train.py"]
    allowed = {"jax": {"jax", "optax", "orbax", "numpy"}, "torch": {"torch", "numpy"}}[target]
    for node in ast.walk(ast.parse(text)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        for n in names:
            top = n.split(".")[0]
            assert top in allowed or top in sys.stdlib_module_names, f"{target} program imports {n}"
            assert top != "mithril_spec"


def test_spec_text_is_escaped(tmp_path):
    """Strings from the spec reach the program only through repr: a hostile name or path stays data."""
    src = (ROOT / "specs" / "mlp-dp.yaml").read_text()
    evil = 'x"; import os; os.system("echo pwned") #\\n\'\'\''
    spec = tmp_path / "evil.yaml"
    # A JSON string is a valid YAML double-quoted scalar.
    spec.write_text(src.replace("data: {kind: synthetic}", f"data: {{kind: arrays, path: {json.dumps(evil)}}}"))
    c = compile_file(spec)
    for target in ("jax", "torch"):
        if not (ROOT / "templates" / target / "train.py.j2").exists():
            continue
        text = render_files(c, target, spec.name)["train.py"]
        tree = ast.parse(text)
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        assert evil in strings, "the path must appear as one string literal"
        assert not any(isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "system" for n in ast.walk(tree))


def test_py_filter_round_trips():
    for v in [0, -3, 1.5, 1e-8, 3.0e-4, "a'b\"c\\n", None, True, [1, "x"], {"k": [0.1, None]}]:
        assert ast.literal_eval(py(v)) == v


def test_failed_build_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    spec = tmp_path / "bad.yaml"
    spec.write_text((ROOT / "specs" / "mlp-tp.yaml").read_text().replace("mlp: tensor", "mlp: tensr"))
    code = cli.main(["build", str(spec), "--target", "jax", "-o", str(out)])
    assert code == 1
    assert not out.exists()
    assert "E040" in capsys.readouterr().err


def test_build_never_imports_frameworks(tmp_path):
    code = (
        "import sys; from mithril_spec import cli; "
        f"rc = cli.main(['build', {str(ROOT / 'specs' / 'gpt-tiny.yaml')!r}, '--target', 'jax', '-o', {str(tmp_path)!r}]); "
        "bad = [m for m in ('jax', 'torch', 'optax') if m in sys.modules]; "
        "print('BAD', bad) if bad else None; sys.exit(rc or (1 if bad else 0))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
