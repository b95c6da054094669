"""Spec names never shadow Python names in the generated programs (lowering/common.py, RESERVED).

A spec whose layers are named after every Python builtin (`range`, `len`, `print`, `__import__`, ...) and
every name a generated program defines at module level or imports (np, jax, jnp, torch, nn, F, dist, mx,
os, json, forward, Data, PARAMS, ...: read with `ast` from the train.py of every render case
(tests/render_cases.py), rendered from the templates, so the list does not come from the code under test,
RESERVED), plus the names the model functions use locally (x, p, pre, block, ...), with a repeated block
whose class would be `Exception`:

- `validate` accepts it (torch refuses names of torch.nn.Module attributes: the torch variant leaves them out);
- in the programs built for jax, torch and mlx, no variable that a spec name introduces is a builtin or
  a module-level name of the program, and every module-level name of the program is reserved;
- each program trains 2 steps to a finite loss (one process each), and the canonical names stay:
  `range.weight` (say) is in the exported parameters.
"""

from __future__ import annotations

import ast
import builtins
import functools
import keyword
import re
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import numpy as np
import pytest
import torch_runs as tr
from program_files import program_text
from render_cases import cases, program

from mithril_spec.cli import main as cli
from mithril_spec.lowering.common import RESERVED
from mithril_spec.render.build import format_python
from mithril_spec.render.environment import environment
from mithril_spec.spec.common import IDENT_PATTERN
from mithril_spec.targets.torch import FSDP_MODULE_ATTRS, TORCH_MODULE_ATTRS

# names the model functions use locally (besides the module-level ones)
LOCALS = ["x", "p", "pre", "block", "batch", "buffers", "key", "i", "h", "self", "params", "loss", "logits",
          "block_fn", "row", "shared", "name", "aux", "out", "q", "k", "v"]
INPUTS = ("input", "len")  # the model's inputs: features and class labels
REPEAT, BLOCK = "iter", "exception"  # a repeated block: its torch class would be `Exception`
BLOCK_LAYERS = ("print", "p", "pre", "x")


def valid(name: str) -> bool:
    return bool(re.match(IDENT_PATTERN, name)) and len(name) <= 64 and not (
        keyword.iskeyword(name) or keyword.issoftkeyword(name))


def module_names(source: str) -> set[str]:
    """What a program defines or imports at module level (functions, classes, assignments, imports)."""
    out: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def stored_names(source: str) -> set[str]:
    """Every name the program binds anywhere (assignments, arguments, loop targets, functions, classes)."""
    tree = ast.parse(source)
    out = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    out |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
            for a in [*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg] if a}
    return out | {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


@functools.cache
def program_names() -> frozenset[str]:
    """The module-level names of every render case's train.py, as the build writes it (only one case per
    target keeps its whole program as a golden file)."""
    env = environment()
    out: set[str] = set()
    for case in cases():
        prog = program(case)
        template = next(t for t, name in prog.files if name == "train.py")
        out |= module_names(format_python(env.get_template(template).render(**prog.context()), "train.py"))
    return frozenset(out)


def all_names() -> list[str]:
    golden = program_names()
    taken = {*INPUTS, REPEAT}
    names = sorted(n for n in set(dir(builtins)) | golden | set(LOCALS) if valid(n) and n not in taken)
    return ["range", *(n for n in names if n != "range")]  # the first layer: a linear, `range.weight`


def torch_names() -> list[str]:
    return [n for n in all_names() if n not in TORCH_MODULE_ATTRS and n not in FSDP_MODULE_ATTRS
            and not n.startswith("_")]


def spec_text(names: list[str], targets: str, tag: str = "names", block_name: str = BLOCK,
              repeat: str = REPEAT, inputs: tuple[str, str] = INPUTS) -> str:
    """An MLP-like chain over `names` (element-wise layers, a linear every few), the repeated block in the
    middle, a linear head; cross-entropy against the `len` input."""
    ops = ["relu", "linear", "tanh", "add", "silu", "sigmoid", "linear", "mul"]
    layers = [f"    - {{op: linear, name: {names[0]}, dimension: width, input: {inputs[0]}}}"]
    placed = False
    for k, name in enumerate(names[1:-1], start=1):
        op = ops[k % len(ops)]
        if op == "linear":
            layers.append(f"    - {{op: linear, name: {name}, dimension: width}}")
        elif op in ("add", "mul"):
            layers.append(f"    - {{op: {op}, name: {name}, inputs: [{names[k - 1]}, {names[k - 2]}]}}")
        else:
            layers.append(f"    - {{op: {op}, name: {name}}}")
        # the repeated block from the middle on, before a layer that reads the previous output (not add/mul)
        if k >= len(names) // 2 and not placed and ops[(k + 1) % len(ops)] not in ("add", "mul"):
            layers.append(f"    - {{repeat: 2, block: {block_name}, name: {repeat}}}")
            placed = True
    layers.append(f"    - {{op: linear, name: {names[-1]}, dimension: classes}}")
    block = [f"      - {{op: linear, name: {BLOCK_LAYERS[0]}, dimension: width}}",
             f"      - {{op: relu, name: {BLOCK_LAYERS[1]}}}",
             f"      - {{op: tanh, name: {BLOCK_LAYERS[2]}}}",
             f"      - {{op: add, name: {BLOCK_LAYERS[3]}, inputs: [block_input, {BLOCK_LAYERS[2]}]}}"]
    return "\n".join([
        "version: 1", f"name: {tag}", f"targets: [{targets}]", "dims: {width: 8, classes: 3}",
        "model:", "  inputs:",
        f"    {inputs[0]}: {{shape: [batch, width], dtype: float32}}",
        f"    {inputs[1]}: {{shape: [batch], dtype: int32}}",
        "  blocks:", f"    {block_name}:", *block,
        "  layers:", *layers,
        f"  loss: {{op: cross_entropy, logits: {names[-1]}, targets: {inputs[1]}}}",
        "meshes:", "  default: {data: 1}",
        "training:", "  batch_size: 4", "  steps: 2", "  optimizer: {name: adamw, lr: 1.0e-3}", "  seed: 0",
        "data: {kind: synthetic}", "",
    ])


SPECS = jr.WORK / "names-specs"


def spec_file(tag: str, names: list[str], targets: str, neutral: bool = False) -> Path:
    """The spec over `names`, or (neutral) the same model with names that are no Python name."""
    SPECS.mkdir(exist_ok=True)
    path = SPECS / f"{tag}.yaml"
    text = (spec_text([f"layer{i}" for i in range(len(names))], targets, tag, "blk", "rep", ("features", "labels"))
            if neutral
            else spec_text(names, targets, tag))
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def programs(target: str) -> tuple[Path, Path]:
    """(the names program, the same model with neutral names) for `target` (builds memoised)."""
    names = torch_names() if target == "torch" else all_names()
    targets = "torch" if target == "torch" else "jax, mlx"
    build = {"jax": jr.build, "torch": tr.build, "mlx": mr.build}[target]
    named = build(spec_file(f"names-{'torch' if target == 'torch' else 'all'}", names, targets))
    plain = build(spec_file(f"plain-{'torch' if target == 'torch' else 'all'}", names, targets, neutral=True))
    return named, plain


def test_the_spec_holds_every_builtin_and_module_name():
    names = set(all_names()) | {*INPUTS, REPEAT}
    assert {"range", "len", "print", "__import__", "__debug__", "np", "jnp", "jax", "torch", "nn", "F", "dist",
            "mx", "os", "sys", "json", "math", "Data", "forward", "PARAMS"} <= names
    assert {n for n in dir(builtins) if valid(n)} <= names
    assert "range" in torch_names() and "type" not in torch_names()  # torch.nn.Module.type


@pytest.mark.parametrize("targets", ["jax, mlx", "torch"])
def test_validate_accepts_builtin_names(targets, tmp_path, capsys):
    names = torch_names() if targets == "torch" else all_names()
    path = tmp_path / "names.yaml"
    path.write_text(spec_text(names, targets))
    rc = cli(["validate", str(path)])
    assert rc == 0, capsys.readouterr().err[-3000:]


@pytest.mark.parametrize("target", ["jax", "torch", "mlx"])
def test_no_spec_name_becomes_a_python_name(target):
    """The names a spec brings (what the names program binds beyond the neutral one: variables, block
    functions and classes) are never a builtin, an import or another module-level name of the program;
    every module-level name that does not come from the spec is reserved."""
    named, plain = (program_text(p) for p in programs(target))
    module, fixed = module_names(named), module_names(named) & module_names(plain)
    introduced = stored_names(named) - stored_names(plain)
    assert {"range_", "np_", "len_"} <= introduced
    clash = introduced & (set(dir(builtins)) | fixed)
    assert not clash, f"{target}: spec names that shadow Python names: {sorted(clash)}"
    assert fixed <= RESERVED, f"{target}: module-level names not reserved: {sorted(fixed - RESERVED)}"
    assert len(module - fixed) == len(introduced & module)  # (the block's functions or class)


@pytest.mark.slow
def test_programs_with_builtin_names_train():
    named = {t: programs(t)[0] for t in ("jax", "torch", "mlx")}
    runs = {"torch": tr.run(named["torch"], "--steps", "2", ranks=1)}
    runs["jax"], runs["mlx"] = jr.run_many([(named["jax"], "--steps", "2"), (named["mlx"], "--steps", "2")])
    for target, r in runs.items():
        assert len(r.losses) == 2 and np.isfinite(r.losses).all(), f"{target}: {r.output[-3000:]}"
        assert "range.weight" in r.params and "iter.1.print.weight" in r.params, target  # canonical names
    jr.report("spec names = every builtin and program name", layers=len(all_names()),
              losses={t: [round(float(x), 4) for x in r.losses] for t, r in runs.items()})
