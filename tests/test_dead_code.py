"""No dead code ships: every function, class and method a build renders (train.py, generate.py) is used by
the build's own files. Methods the framework calls by protocol (`forward`, autograd's `backward`, FSDP2's
comm hooks' `allocate`) count as used; the shared runtime/ is checked over all builds
(tests/test_program_runtime.py)."""

from __future__ import annotations

import ast

import pytest
from render_cases import case_id, cases

from mithril_spec.frontend import compile_file
from mithril_spec.render.build import render_files

CASES = cases()
PROTOCOL = {"forward", "backward", "allocate", "setup_context"}  # called by torch, not by the program


def used_names(trees: list[ast.AST]) -> set[str]:
    used: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module == "train":
                used.update(a.name for a in node.names)  # generate.py imports train.py's code
    return used


def unused(files: dict[str, str]) -> list[str]:
    trees = {name: ast.parse(text) for name, text in files.items() if name.endswith(".py")}
    used = used_names(list(trees.values()))
    out = []
    for name, tree in trees.items():
        if name.startswith("runtime/"):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name not in used:
                out.append(f"{name}: {node.name}")
            if isinstance(node, ast.ClassDef):
                out += [f"{name}: {node.name}.{m.name}" for m in node.body
                        if isinstance(m, ast.FunctionDef) and not m.name.startswith("__")
                        and m.name not in used | PROTOCOL]
    return out


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_function_a_build_renders_is_used(case):
    spec, target = case
    assert unused(render_files(compile_file(spec), target, spec.name)) == []


def test_the_check_finds_a_function_nothing_calls():
    files = {"train.py": "def used():\n    pass\n\n\ndef dead():\n    pass\n\n\nclass M:\n    def forward(self):\n"
                         "        pass\n\n    def helper(self):\n        pass\n\n\nused()\nM()\n"}
    assert unused(files) == ["train.py: dead", "train.py: M.helper"]
