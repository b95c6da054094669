"""Rendering the PyTorch target (no program runs): the build never imports torch, names from the spec
never collide with the program's own, the tensor-parallel plan follows the planner's layouts, and
plans the torch target cannot run are E049 diagnostics at build time."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from program_files import program_text
from torch_runs import ROOT, SPECS, TESTS, spec_variant

from mithril_spec.diagnostics import DiagnosticError
from mithril_spec.frontend import compile_file
from mithril_spec.lowering.torch_program import attr_path
from mithril_spec.render.build import render_files

GPT = SPECS / "gpt-tiny.yaml"


def render(spec, mesh=None, edits=()):
    return render_files(compile_file(spec_variant(spec, tuple(edits)), mesh), "torch", "spec.yaml")


def config(text: str, name: str):
    """The value of a module-level constant of a rendered program; a per-parameter table (one row per block
    parameter, `every_copy(top, blocks, REPEATS)`) expanded to canonical names as the program does."""
    values = {node.targets[0].id: node.value for node in ast.parse(text).body
              if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    value = values[name]
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "every_copy":
        top, blocks = (ast.literal_eval(a) for a in value.args[:2])
        repeats = ast.literal_eval(values["REPEATS"])
        each = {f"{r}.{i}.{k}": (rows[k] if isinstance(rows, dict) else True)
                for r, rows in blocks.items() for i in range(repeats[r]) for k in rows}
        return top | set(each) if isinstance(top, set) else {**top, **each}
    return ast.literal_eval(value)


def e049(spec, mesh=None, edits=()):
    with pytest.raises(DiagnosticError) as e:
        render(spec, mesh, edits)
    return [d for d in e.value.diagnostics if d.code == "E049"]


@pytest.mark.runs
def test_build_never_imports_torch(tmp_path):
    code = (
        "import sys; from mithril_spec import cli; "
        f"rc = cli.main(['build', {str(GPT)!r}, '--target', 'torch', '-o', {str(tmp_path)!r}]); "
        "bad = [m for m in ('torch', 'jax', 'numpy') if m in sys.modules]; "
        "print('BAD', bad) if bad else None; sys.exit(rc or (1 if bad else 0))"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md", "build-manifest.json", "checkpoint.py", "config.py", "data.py", "generate.py", "launch.sbatch",
        "launch.sh", "model.py", "parallel.py", "plan.json", "runtime", "train.py"]
    for script in ("launch.sh", "launch.sbatch"):
        assert (tmp_path / script).stat().st_mode & 0o111
        assert subprocess.run(["bash", "-n", str(tmp_path / script)], check=False).returncode == 0


def test_tensor_parallel_plan_and_fsdp_dims_follow_the_plan():
    text = program_text(render(GPT, "fsdp_tp"))
    assert config(text, "TP_PLAN") == {
        "blocks.*.attn.q": "colwise", "blocks.*.attn.k": "colwise", "blocks.*.attn.v": "colwise",
        "blocks.*.attn.o": "rowwise", "blocks.*.mlp.fc": "colwise", "blocks.*.mlp.proj": "rowwise",
        "blocks.*.attn": "replicate_input",  # q, k and v read one DTensor: one input-gradient all-reduce
    }
    dims = config(text, "FSDP_DIMS")
    # canonical q.weight [embed(fsdp), heads(tensor)] is nn.Linear [heads, embed]: fsdp on torch dim 1
    assert dims["blocks.0.attn.q.weight"] == 1 and dims["blocks.0.attn.o.weight"] == 0
    assert dims["wte.weight"] == 1  # embedding tables keep the canonical layout
    assert "blocks.0.attn.q.weight" in config(text, "TRANSPOSED") and "wte.weight" not in config(text, "TRANSPOSED")
    assert config(text, "MESH") == {"data": 1, "fsdp": 2, "tensor": 2} and config(text, "WORLD") == 4


def test_sequence_parallel_where_the_rules_split_the_sequence():
    plan = config(program_text(render(GPT, "fsdp_tp", (("    mlp: tensor\n", "    mlp: tensor\n    seq: tensor\n"),))),
                  "TP_PLAN")
    assert plan["blocks.*.ln1"] == "sequence" and plan["blocks.*.attn"] == "gather_input"
    assert plan["blocks.*.attn.o"] == "rowwise_sp" and plan["blocks.*.mlp.proj"] == "rowwise_sp"
    assert plan["blocks.0"] == "split_sequence" and plan["blocks.3"] == "gather_sequence"


def test_one_process_and_ddp_builds_carry_no_sharding_code():
    single = program_text(render(GPT, "data=1"))
    assert "def parallelize" not in single and "init_process_group" not in single
    ddp = program_text(render(SPECS / "mlp-dp.yaml", "four"))
    assert "DistributedDataParallel" in ddp and "fully_shard" not in ddp and "no_sync" in ddp


def test_names_never_collide_with_the_programs_own():
    """Layers named like the program's locals get a trailing `_`; blocks named like its classes get `Block`."""
    edits = (("    decoder:\n", "    attention:\n"), ("block: decoder", "block: attention"),
             ("name: ln1}", "name: F}"), ("name: attn,", "name: block,"),
             ("inputs: [block_input, attn]", "inputs: [block_input, block]"))
    text = program_text(render(GPT, "data=1", edits))
    tree = ast.parse(text)
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert "AttentionBlock" in classes and classes.count("Attention") == 1
    assert "F_ = self.F(block_input)" in text and "block_ = self.block(F_)" in text


def test_attr_path():
    assert attr_path("wte.weight") == "wte.weight"
    assert attr_path("blocks.3.attn.q.weight") == "blocks[3].attn.q.weight"


def test_all_ops_renders_every_operator():
    text = program_text(render(TESTS / "specs" / "all-ops.yaml", "single"))
    for needle in ("class Attention", "def rope", "class RMSNorm", "class LayerNorm", "class BatchNorm",
                   "class PosEmbedding", "class MLP", "F.max_pool2d", "F.avg_pool2d", "nn.Conv2d", "torch.softmax",
                   "torch.tanh", "torch.sigmoid", "F.silu", 'approximate="none"', ".reshape(", ".flatten(1)",
                   "nn.Conv1d", "torch.cat(", "[:, :, 16:32]"):
        assert needle in text, needle


def test_unsupported_plans_are_e049():
    assert "class BatchNorm" in program_text(render(TESTS / "specs" / "all-ops.yaml", "two"))  # batch_norm over data: runs
    diags = e049(GPT, None, (("precision: {params: float32, compute: float32}", "precision: {params: bfloat16}"),))
    assert "float32 with bfloat16 parameters" in diags[0].message
    # sequence parallelism needs tensor-parallel attention and mlp
    diags = e049(GPT, "fsdp_tp", (("    heads: tensor\n    kv_heads: tensor\n    mlp: tensor\n", "    seq: tensor\n"),))
    assert any("under sequence parallelism" in d.message for d in diags)
    # FSDPModule methods would shadow a layer of that name
    diags = e049(GPT, None, (("name: ln1}", "name: reshard}"),))
    assert any("FSDPModule" in d.message for d in diags)
