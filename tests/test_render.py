"""Rendering: deterministic, formatted and ruff-clean, parseable, escaped, golden-file reviewed, atomic."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest
from program_files import program_text
from render_cases import (
    GOLDEN,
    ROOT,
    WHOLE_PROGRAM,
    case_id,
    cases,
    golden_files,
    golden_paths,
    ruff_problems,
    snapshot_path,
    whole_program,
)

from mithril_spec import cli
from mithril_spec.frontend import compile_file
from mithril_spec.render.build import render_files
from mithril_spec.render.environment import py
from mithril_spec.render.link import PROGRAM_FILES

CASES = cases()
UPDATE = "run `.venv/bin/python scripts/update_goldens.py` and review `git diff tests/golden`"


def test_there_are_cases():
    targets = {t for _, t in CASES}
    assert {"jax", "torch"} <= targets, f"render cases cover only {targets}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_golden(case):
    """The lowering's snapshot equals the reviewed one and, for one case per target, the whole rendered build
    equals the reviewed golden copy (scripts/update_goldens.py writes both)."""
    for path, text in golden_files(case).items():
        name = path.relative_to(GOLDEN)
        assert path.is_file(), f"no golden file {name}: {UPDATE}"
        assert text == path.read_text(encoding="utf-8"), f"{name} differs from the golden file: {UPDATE}"


def test_golden_tree_holds_only_what_the_cases_render():
    """A lowering snapshot of each (spec, target); the whole build (its plan.json among them, costed for the
    target) of one case per target that has cases; nothing stale."""
    want = {p for case in CASES for p in golden_paths(case)}
    have = {p for p in GOLDEN.rglob("*") if p.is_file()}
    assert not have - want, f"golden files no case renders: {sorted(str(p.relative_to(GOLDEN)) for p in have - want)}"
    assert not want - have, f"missing golden files: {UPDATE}"
    assert {p for p in have if p.suffix == ".json" and p.parent.name == "lowering"} == {
        snapshot_path(case) for case in CASES}
    whole = [case for case in CASES if whole_program(case)]
    assert sorted(t for _, t in whole) == sorted({t for _, t in CASES}), (
        f"WHOLE_PROGRAM {WHOLE_PROGRAM} names no example (or two) of some target")
    assert {p.parent.name for p in have if p.name == "plan.json"} == {case_id(case) for case in whole}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_parses_and_ruff_clean(case, tmp_path):
    """Every generated Python file parses, is formatted, and `ruff check` finds nothing in it."""
    spec, target = case
    assert ruff_problems(render_files(compile_file(spec), target, spec.name), tmp_path) == ""


def test_output_ignores_ruff_configuration_and_hash_seed(tmp_path):
    """Builds are byte-identical whatever directory they run from (a ruff config there, or a directory named
    like a package the program imports) and whatever the hash seed; ruff's RUFF_* variables do not matter."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ruff]\nline-length = 40\n[tool.ruff.format]\nquote-style = "single"\nindent-style = "tab"\n'
        '[tool.ruff.lint]\nselect = ["ALL"]\n[tool.ruff.lint.isort]\nforce-single-line = true\n'
    )
    (tmp_path / "ruff.toml").write_text("line-length = 50\n")
    for package in ("numpy", "jax", "torch"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    spec = ROOT / "specs" / "gpt-tiny.yaml"
    code = (
        "import json, sys; from mithril_spec.frontend import compile_file; "
        "from mithril_spec.render.build import render_files; "
        f"c = compile_file({str(spec)!r}); "
        f"json.dump({{t: render_files(c, t, {spec.name!r}) for t in ('jax', 'torch')}}, sys.stdout)"
    )
    env = {
        **os.environ,
        "PYTHONHASHSEED": "12345",
        "RUFF_OUTPUT_FORMAT": "json",
        "RUFF_NO_CACHE": "false",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    there = json.loads(proc.stdout)
    for target in ("jax", "torch"):
        assert there[target] == render_files(compile_file(spec), target, spec.name), target


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_program_imports_only_stdlib_numpy_and_framework(case):
    """train.py imports the standard library, numpy, its framework and the build's own runtime/ package,
    which imports only the standard library and numpy (and itself) at module level (runtime/<target>/: its
    framework too); the optional packages of a feature (parameter files, a tokenizer, --tensorboard, --wandb)
    only inside the function that needs them."""
    spec, target = case
    files = render_files(compile_file(spec), target, spec.name)
    allowed = {"jax": {"jax", "optax", "orbax", "numpy"}, "torch": {"torch", "numpy"}, "mlx": {"mlx", "numpy"}}[target]
    optional = {"safetensors", "tokenizers", "tensorboardX", "wandb"}
    for name, text in files.items():
        if name.startswith("runtime/"):
            own = allowed | {"runtime"} if name.startswith(f"runtime/{target}/") else set()
            tree = ast.parse(text)
            module_level = {id(n) for n in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level:
                    continue  # from .errors import require
                for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                          [node.module] if isinstance(node, ast.ImportFrom) else []):
                    inside = set() if id(node) in module_level else optional
                    assert n.split(".")[0] in sys.stdlib_module_names | {"numpy"} | own | inside, (name, n)
    allowed |= {"runtime"} | {f[:-3] for f in PROGRAM_FILES}  # and the build's own files
    tree = ast.parse(program_text(files))
    module_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if id(node) not in module_level and isinstance(node, ast.ImportFrom) and (node.module or "").startswith("safetensors"):
            continue  # parameter files: imported inside the function that reads or writes one, only when used
        if id(node) not in module_level and isinstance(node, ast.Import | ast.ImportFrom) and any(
                (getattr(node, "module", None) or a.name).startswith(("tensorboardX", "wandb")) for a in node.names):
            continue  # --tensorboard's and --wandb's optional dependencies: imported only when asked for
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
    evil = "x\"; import os; os.system(\"echo pwned\") #\\n'''"
    spec = tmp_path / "evil.yaml"
    # A JSON string is a valid YAML double-quoted scalar.
    spec.write_text(src.replace("data: {kind: synthetic}", f"data: {{kind: arrays, path: {json.dumps(evil)}}}"))
    c = compile_file(spec)
    for target in ("jax", "torch"):
        if not (ROOT / "templates" / target / "train.py.j2").exists():
            continue
        text = program_text(render_files(c, target, spec.name))
        tree = ast.parse(text)
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        # (resolved against the spec's directory: the program holds the absolute path)
        assert os.path.normpath(tmp_path / evil) in strings, "the path must appear as one string literal"
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
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
