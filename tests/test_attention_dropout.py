"""Attention dropout (the `attention` operator's `dropout`): the plan's activations per target kernel, what the
targets refuse (E049), and in every target a tiny GPT with dropout 0.1 on a parallel mesh equal to its
one-process build (the masks do not depend on the mesh), while the dropout really changes the losses.

The Korthikanti et al. figures with and without attention dropout are in tests/test_costs.py."""

from __future__ import annotations

import json
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import pytest
import torch_runs as tr
from program_files import program_text

from mithril_spec import cli
from mithril_spec.extends import load_spec_file
from mithril_spec.frontend import compile_document
from mithril_spec.overrides import apply as apply_settings
from mithril_spec.planner.costs import CostOptions, estimate, estimate_targets
from mithril_spec.targets import TARGETS, attention_kernels

SPEC = Path(__file__).parent / "specs" / "attention-dropout.yaml"
KORTH = Path(__file__).parent / "specs" / "cost" / "gpt-korthikanti.yaml"
NO_DROPOUT = ((", dropout: 0.1}", "}"),)
STEPS = "4"


def korthikanti(rate: float, mesh: str = "single"):
    doc = apply_settings(load_spec_file(KORTH), [f"model.blocks.layer.1.dropout={rate}"])
    return compile_document(doc, mesh).plan


def per_layer(plan, fused: bool) -> int:
    (block,) = estimate(plan, options=CostOptions(fused_attention=fused)).worst.activations.blocks
    return block.per_copy


# ---------------------------------------------------------------- the plan


def test_targets_declare_their_attention_kernels():
    assert attention_kernels(TARGETS) == {"jax": False, "torch": True, "mlx": False}


def test_fused_attention_stores_no_probabilities():
    """Korthikanti's layer (s = 512, h = 1024, a = 16, b = 4, 16-bit): torch's F.scaled_dot_product_attention
    keeps the log-sum-exp (fp32 per query and head) instead of the 2as^2b bytes of probabilities (its
    output is the o projection's input, counted already); with attention dropout every target computes
    (and keeps) the probabilities itself."""
    s, b, h, a = 512, 4, 1024, 16
    plain = korthikanti(0)
    assert per_layer(plain, False) == s * b * h * 34 + 2 * a * s * s * b
    assert per_layer(plain, True) == s * b * h * 34 + 4 * a * s * b
    dropped = korthikanti(0.1)
    assert per_layer(dropped, True) == per_layer(dropped, False) == s * b * h * 34 + 5 * a * s * s * b
    t = 4  # tensor parallel: the fused kernel's tensors are split over the heads too
    tp = korthikanti(0, "tp")
    assert per_layer(tp, False) - per_layer(tp, True) == (2 * a * s * s * b - 4 * a * s * b) // t


def test_plan_costs_the_largest_target_and_notes_the_fused_one():
    plan = korthikanti(0)
    both = estimate_targets(plan, attention_kernels(["jax", "torch"]))
    torch_only = estimate_targets(plan, attention_kernels(["jax", "torch"]), target="torch")
    assert both.target is None and torch_only.target == "torch"
    assert both.peak == estimate(plan).peak > torch_only.peak == estimate(plan, options=CostOptions(
        fused_attention=True)).peak
    (note,) = [n for n in both.notes if "fused attention" in n]
    assert "jax target" in note and "plan --target torch" in note
    # with attention dropout nothing differs: no note
    dropped = korthikanti(0.1)
    assert not [n for n in estimate_targets(dropped, attention_kernels(["jax", "torch"])).notes if "fused" in n]


def test_plan_command_target_option(capsys):
    rc = cli.main(["plan", str(SPEC), "--mesh", "single", "--format", "json", "--set",
                   "model.blocks.decoder.1.dropout=0", "--target", "torch"])
    torch_doc = json.loads(capsys.readouterr().out)
    rc2 = cli.main(["plan", str(SPEC), "--mesh", "single", "--format", "json", "--set",
                    "model.blocks.decoder.1.dropout=0"])
    both = json.loads(capsys.readouterr().out)
    assert rc == rc2 == 0
    assert torch_doc["costs"]["target"] == "torch" and both["costs"]["target"] is None
    assert torch_doc["costs"]["peak_bytes"] < both["costs"]["peak_bytes"]
    assert any("plan --target torch" in n for n in both["costs"]["notes"])


def test_what_the_targets_accept(tmp_path, capsys):
    """Attention dropout runs inside a pipeline (each micro-batch's masks are its rows of the micro-step's)
    and under torch's sequence parallelism (the probabilities span the gathered sequence), with its tied output
    layer on another stage than the table too. mlx runs it under tensor parallelism (each process keeps its
    heads' mask)."""
    text = SPEC.read_text()
    path = tmp_path / "s.yaml"
    path.write_text(text + "pipeline: {microbatches: 2, schedule: gpipe}\n")
    assert cli.main(["validate", str(path), "--mesh", "pipe=2"]) == 0, capsys.readouterr().err
    untied = text.replace(", tie: wte}", "}") + "pipeline: {microbatches: 2, schedule: gpipe}\n"
    path.write_text(untied)
    assert cli.main(["validate", str(path), "--mesh", "pipe=2"]) == 0, capsys.readouterr().err
    path.write_text(text.replace("    mlp: tensor\n", "    mlp: tensor\n    seq: tensor\n"))
    assert cli.main(["validate", str(path), "--mesh", "tensor=2"]) == 0, capsys.readouterr().err
    path.write_text(text.replace("name: attention-dropout", "name: attention-dropout\ntargets: [jax, torch, mlx]"))
    assert cli.main(["validate", str(path), "--mesh", "tensor=2"]) == 0, capsys.readouterr().err


def test_rate_zero_keeps_the_fused_kernel():
    one = tr.build(SPEC, "single", NO_DROPOUT)
    assert "def dropped" not in program_text(one)
    code = program_text(tr.build(SPEC, "dp_tp"))
    assert "def dropped" in code and "scaled_dot_product_attention" in code


# ---------------------------------------------------------------- the programs: mesh-independent masks


def _check(target: str, one, parallel, plain, what: str) -> None:
    d = jr.max_diff(one.losses, parallel.losses)
    dp = jr.max_param_diff(one.params, parallel.params)
    off = jr.max_diff(one.losses, plain.losses)
    jr.report(f"{target} attention dropout 0.1: {what} vs one", max_dloss=d, max_dparam=dp, dloss_vs_rate0=off)
    assert len(one.losses) == int(STEPS)
    assert d < 1e-5 and dp < 1e-5
    assert off > 1e-4  # the dropout is really there


# The jax program's masks on every mesh: tests/test_capability_matrix.py (its dropout cells hold attention
# dropout; data, fsdp, tensor, sequence, expert, zero against one device).


@pytest.mark.slow
def test_torch_masks_do_not_depend_on_the_mesh():
    one, par, plain = tr.run_many([
        (tr.build(SPEC, "single"), "--steps", STEPS),
        (tr.build(SPEC, "dp_tp"), "--steps", STEPS),
        (tr.build(SPEC, "single", NO_DROPOUT), "--steps", STEPS),
    ])
    _check("torch", one, par, plain, "data=2 x tensor=2 (4 ranks)")


@pytest.mark.slow
def test_mlx_masks_do_not_depend_on_the_processes():
    """MLX does not combine `tensor` with `data`: data=2 and tensor=2, 2 processes each."""
    one = mr.run(mr.build(SPEC, "single"), "--steps", STEPS)
    plain = mr.run(mr.build(SPEC, "single", NO_DROPOUT), "--steps", STEPS)
    for mesh in ("data=2", "tensor=2"):
        _check("mlx", one, mr.run(mr.build(SPEC, mesh), "--steps", STEPS, processes=2), plain, mesh)
