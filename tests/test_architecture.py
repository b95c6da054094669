"""Structural rules of the compiler (the architecture issue): an operator's knowledge lives in its `ops/`
file, so no other module compares operator names; and the modules of `mithril_spec` import each other
without cycles, counting every import, in layers that import one way (source, operators, capabilities,
spec, graph, plan, lowering, render, cli); and every operator has its macros in each target's ops template."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mithril_spec.ops import LOSSES, OPS
from mithril_spec.targets import TARGET_NAMES, TARGETS

PKG = Path(__file__).resolve().parent.parent / "mithril_spec"
NAMES = set(OPS) | set(LOSSES)


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _op_names_in(node: ast.AST) -> list[str]:
    """Operator names written as string constants in `node` (a comparison operand or a literal container)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in _op_names_in(e)]
    return []


def op_name_uses(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += [(node.lineno, n) for n in _op_names_in(operand)]
        elif isinstance(node, ast.Dict):  # tables keyed by operator (what each op handles, etc.)
            found += [(node.lineno, n) for k in node.keys if k is not None for n in _op_names_in(k)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            found += [(node.lineno, n) for a in node.args[:1] for n in _op_names_in(a)]
    return found


def test_the_checker_finds_op_name_comparisons():
    code = 'if node.op == "attention": pass\nif op in ("relu", "gelu"): pass\nT = {"linear": 1}\nd.get("mlp")\n'
    assert [n for _, n in op_name_uses(ast.parse(code))] == ["attention", "relu", "gelu", "linear", "mlp"]
    assert op_name_uses(ast.parse('if x == "weight": pass\nOPS[node.op].elementwise\n')) == []


def test_no_operator_name_comparisons_outside_ops():
    offenders = []
    for name, path in _modules().items():
        if name.startswith("mithril_spec.ops"):
            continue
        for line, op in op_name_uses(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(PKG.parent)}:{line}: `{op}`")
    assert not offenders, "operator names compared outside mithril_spec/ops:\n" + "\n".join(offenders)


TEMPLATES = PKG.parent / "templates"


def template_op_name_uses(source: str) -> list[tuple[int, str]]:
    """Operator names written as string constants in a Jinja template's comparisons (`l.op == "mlp"`, `"moe"
    in ops`), tests (`is eq "mlp"`), filter arguments (`select("in", ["mlp"])`) and dict keys."""
    import jinja2
    from jinja2 import nodes

    def names(n) -> list[str]:
        if isinstance(n, nodes.Const) and isinstance(n.value, str) and n.value in NAMES:
            return [n.value]
        if isinstance(n, (nodes.Tuple, nodes.List)):
            return [x for e in n.items for x in names(e)]
        return []

    tree = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"]).parse(source)
    found = [(c.lineno, x) for c in tree.find_all(nodes.Compare)
             for x in names(c.expr) + [y for o in c.ops for y in names(o.expr)]]
    found += [(d.lineno, x) for d in tree.find_all(nodes.Dict) for it in d.items for x in names(it.key)]
    found += [(t.lineno, x) for t in tree.find_all((nodes.Test, nodes.Filter)) for a in t.args for x in names(a)]
    return sorted(found)


def test_the_template_checker_finds_op_name_comparisons():
    src = ('{% if l.op == "attention" %}{% endif %}{% if "moe" in t.ops %}{% endif %}'
           '{{ xs | selectattr("op", "eq", "mlp") | list }}{{ xs | select("in", ["relu", "x"]) | list }}')
    assert sorted(n for _, n in template_op_name_uses(src)) == ["attention", "mlp", "moe", "relu"]
    assert template_op_name_uses('{% if "gather_places" in t.helpers %}{{ ops[l.op](l) }}{% endif %}') == []


def test_no_operator_name_comparisons_in_templates_outside_the_ops_macros():
    """An operator's template code is its macros in templates/<target>/ops.py.j2 (named after it); the other
    templates ask the lowering (ops/base.py: `helpers`, `constrain_output`, ...), not for an operator's name."""
    offenders = []
    for path in sorted(TEMPLATES.rglob("*.j2")):
        rel = path.relative_to(TEMPLATES).as_posix()
        if path.name == "ops.py.j2":
            continue
        offenders.extend(f"templates/{rel}:{line}: `{op}`" for line, op in template_op_name_uses(path.read_text()))
    assert not offenders, "operator names compared in templates outside their macros:\n" + "\n".join(offenders)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of the package that `name` imports: at module level, for type checking (under `if
    TYPE_CHECKING:`) and inside functions alike (a function-local or type-only import is a dependency too,
    and hid the planner <-> targets circle the issue found)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod in modules:
                out.add(mod)
            for a in node.names:  # `from . import codes`
                if f"{mod}.{a.name}" in modules:
                    out.add(f"{mod}.{a.name}")
    # importing a module runs its packages' __init__ first
    for mod in list(out):
        parts = mod.split(".")
        out.update(".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in modules)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (every import: see `_imports`)."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # a package's own __init__ importing its submodules is how packages work, not a cycle
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return cycles


def test_the_import_reader_counts_every_import(tmp_path):
    pkg = tmp_path / "mithril_spec"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "a.py", "b.py", "c.py", "sub/__init__.py", "sub/d.py"):
        (pkg / f).write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n"
                              "def f():\n    from . import c\n    import mithril_spec.sub.d\n")
    modules = {"mithril_spec": pkg / "__init__.py", "mithril_spec.a": pkg / "a.py", "mithril_spec.b": pkg / "b.py",
               "mithril_spec.c": pkg / "c.py", "mithril_spec.sub": pkg / "sub/__init__.py",
               "mithril_spec.sub.d": pkg / "sub/d.py"}
    assert _imports("mithril_spec.a", pkg / "a.py", modules) == {
        "mithril_spec", "mithril_spec.b", "mithril_spec.c", "mithril_spec.sub", "mithril_spec.sub.d"}
    assert find_cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b", "a"]]


def test_no_import_cycles():
    """No circle between the package's modules, counting every import (module-level, type-only and
    function-local)."""
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# The layers of the compiler, lowest first (docs/architecture.md): a module imports only from its own layer
# and the layers below. A module belongs to the layer of the longest prefix that names it (`NAME=`: that
# module alone, not its submodules).
LAYERS = (
    ("source", ("codes", "diagnostics", "syntax", "limits", "source", "pyast", "atomic", "axes", "extends",
                "template_files")),
    ("operators", ("ops", "spec.common", "spec=")),  # `spec=`: the package's (empty) __init__ alone
    ("capabilities", ("targets",)),  # what each target declares it can run: below the spec, which names them
    ("spec", ("spec", "validate", "hf_import")),
    ("graph", ("graph",)),
    ("plan", ("planner", "overrides", "frontend", "schema", "data_prepare")),  # target-neutral
    ("lowering", ("lowering", "auto", "probe")),  # per target: checks (E049), costs, the Program
    ("render", ("render", "calibrate")),
    ("cli", ("cli", "docs_gen")),
)


def test_the_layers_table_of_the_docs_is_layers():
    """docs/architecture.md's table names the layers of LAYERS, in order, each with its modules (`planner/` for
    the package `planner`, `spec/common.py` for `spec.common`; `spec=`, the package's __init__, left out)."""
    table = (PKG.parent / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\w+) \| (`.*?`) \|", table, re.MULTILINE)
    documented = [(layer, {m.removesuffix("/").removesuffix(".py").replace("/", ".")
                           for m in re.findall(r"`([^`]+)`", mods)}) for layer, mods in rows]
    assert documented == [(layer, {m for m in mods if not m.endswith("=")}) for layer, mods in LAYERS]


def layer_of(module: str) -> int:
    rel = module.removeprefix("mithril_spec").removeprefix(".")
    best, length = 0 if rel == "" else None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            exact = p.endswith("=")
            p = p.rstrip("=")
            if (rel == p or (not exact and rel.startswith(p + "."))) and len(p) + exact > length:
                best, length = i, len(p) + exact
    assert best is not None, f"{module} is in no layer of LAYERS"
    return best


def test_layers_import_one_way():
    """source -> operators -> capabilities -> spec -> graph -> plan -> lowering -> render -> cli: no module
    imports (in any way) from a layer above its own."""
    upward = []
    for mod, imported in sorted(import_graph().items()):
        for m in sorted(imported):
            if layer_of(m) > layer_of(mod):
                upward.append(f"{mod} ({LAYERS[layer_of(mod)][0]}) imports {m} ({LAYERS[layer_of(m)][0]})")
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_target_names_come_from_the_registry():
    from mithril_spec.schema import schema_text
    from mithril_spec.spec.root import Spec

    assert TARGET_NAMES == tuple(TARGETS) and set(TARGET_NAMES) >= {"jax", "torch"}
    items = Spec.model_json_schema()["properties"]["targets"]["items"]
    assert sorted(items["enum"]) == sorted(TARGET_NAMES)
    assert all(f'"{t}"' in schema_text() for t in TARGET_NAMES)


def test_targets_doc_is_generated_from_the_registry():
    from mithril_spec.lowering.docs import capability_markdown

    committed = (PKG.parent / "docs" / "targets.md").read_text()
    assert committed == capability_markdown(), (
        "docs/targets.md is stale: run `python -m mithril_spec.lowering.docs > docs/targets.md`")
    for t in TARGETS.values():
        assert f"`{t.name}`" in committed


# The macros every operator needs in each target's templates/<target>/ops.py.j2 (name -> parameters), and
# those of every loss; `{kind}` stands for the operator's name.
OP_MACROS = {
    "jax": {"{kind}_def": "uses", "{kind}": "l"},
    "torch": {"{kind}_def": "", "{kind}_init": "l", "{kind}": "l"},
    "mlx": {"{kind}_def": "uses", "{kind}": "l, blk"},
}
LOSS_MACROS = {"jax": {"{kind}_def": "uses"}, "torch": {"{kind}": "pred, targets"}, "mlx": {"{kind}_def": "uses"}}
MACRO = re.compile(r"{%-?\s*macro\s+(\w+)\s*\(([^)]*)\)\s*-?%}")


def template_macros(target: str) -> dict[str, str]:
    """`{% macro NAME(PARAMS) %}` of a target's ops template: name -> parameters (spaces normalised)."""
    text = (PKG.parent / "templates" / target / "ops.py.j2").read_text()
    return {m[1]: ", ".join(a.strip() for a in m[2].split(",") if a.strip()) for m in MACRO.finditer(text)}


def test_the_macro_parser():
    text = '{% macro a(l, blk) %}x{% endmacro %}\n{%- macro b_def( ) -%}{% endmacro %}'
    assert {m[1]: m[2] for m in MACRO.finditer(text)} == {"a": "l, blk", "b_def": " "}


def test_every_operator_has_its_macros_in_every_target():
    assert set(OP_MACROS) == set(TARGETS)
    missing = []
    for target, op_macros in OP_MACROS.items():
        have = template_macros(target)
        ops = TARGETS[target].capabilities.ops  # the operators it renders (the others are E049)
        for kinds, wanted in (([k for k in OPS if ops is None or k in ops], op_macros), (LOSSES, LOSS_MACROS[target])):
            for kind in kinds:
                for pattern, params in wanted.items():
                    name = pattern.format(kind=kind)
                    if name not in have:
                        missing.append(f"templates/{target}/ops.py.j2: no `{{% macro {name}({params}) %}}`")
                    elif have[name] != params:
                        missing.append(f"templates/{target}/ops.py.j2: `{name}({have[name]})`, expected ({params})")
    assert not missing, "\n".join(missing)
