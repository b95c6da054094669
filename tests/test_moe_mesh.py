"""Expert parallelism beside fsdp and tensor, in both targets (docs/program.md "Equivalence").

A Mixtral-style moe transformer (specs/moe-shared.yaml: bias-free swiglu experts, top-2 gates renormalised,
a shared expert with a sigmoid gate, the router z-loss) with Megatron's rules (heads, kv_heads and the
experts' hidden features over `tensor`) on expert=2 x fsdp=2 x tensor=2, 8 ranks: the planner splits the 4
experts of every moe layer over expert x fsdp on dimension 0 (each rank one expert, tokens sent to it by
all-to-all over those 4 ranks) and their hidden features over `tensor`; everything else is sharded over
fsdp. Trained by plain SGD (a wrong gradient scale shows in the update), the first step's gradients and 3
steps' losses equal the one-device build's, in torch (8 gloo ranks) and jax (8 CPU devices), and every
torch rank (jax: device 0) holds the bytes the plan predicts; the torch run's checkpoint resumes on one process.

In a torch pipeline too: 1f1b over pipe=2 x expert=2 with a moe layer before the repeated block and one after
it (each stage splits its own experts over `expert`) equals the one-stage build (jax: tests/test_jax_moe.py).
And the `expert` axis beside pipe, fsdp or tensor in a model without moe layers (it splits the batch only).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gradients import assert_same_gradients

import jax_runs
import torch_runs
from mithril_spec.frontend import compile_file
from mithril_spec.lowering import matrix as mx

SPEC = jax_runs.SPECS / "moe-shared.yaml"
MESH = "expert=2,fsdp=2,tensor=2"
SGD = (("optimizer: {name: adamw, lr: 1.0e-3}", "optimizer: {name: sgd, lr: 0.5}"),)
RULES = (("meshes:", "sharding:\n  rules: {heads: tensor, kv_heads: tensor, mlp: tensor}\nmeshes:"),)
ARGS = ("--steps", "3", "--export-grads", "grads.npz")


CKPT = torch_runs.WORK / "ckpt-moe-mesh"  # the torch mesh run's checkpoint after step 2


def mesh_args(runner) -> tuple:
    return ARGS + (("--checkpoint-dir", str(CKPT), "--checkpoint-every", "2") if runner is torch_runs else ())


@pytest.fixture(scope="module")
def runs():
    """target -> (one device, the 8-rank mesh): (run, first-step gradients)."""
    out = {}
    for runner in (torch_runs, jax_runs):
        done = runner.run_many([(runner.build(SPEC, "single", SGD), *ARGS),
                                (runner.build(SPEC, MESH, SGD + RULES), *mesh_args(runner))])
        out[runner] = [(r, dict(np.load(r.cwd / "grads.npz"))) for r in done]
    return out


def test_the_plan_splits_the_experts_over_expert_fsdp_and_tensor():
    plan = compile_file(jax_runs.spec_variant(SPEC, SGD + RULES), MESH).plan
    layout = {p.name: [list(d) for d in p.spec] for p in plan.params}
    assert layout["layers.0.moe.experts.gate.weight"] == [["expert", "fsdp"], [], ["tensor"]]
    assert layout["layers.0.moe.experts.down.weight"] == [["expert", "fsdp"], ["tensor"], []]
    assert layout["layers.0.attn.q.weight"] == [["fsdp"], ["tensor"]]


@pytest.mark.slow
@pytest.mark.parametrize("runner", [torch_runs, jax_runs], ids=["torch", "jax"])
def test_expert_fsdp_tensor_equals_one_device(runs, runner):
    (one, g1), (par, gp) = runs[runner]
    what = f"moe-shared {runner.__name__} {MESH}"
    dg = assert_same_gradients(g1, gp, 1e-5, what)
    dl = float(np.abs(par.losses - one.losses).max())
    runner.report(f"{what} vs 1 device (plain SGD)", max_rel_dgrad=dg, max_dloss=dl)
    assert len(par.losses) == 3 and dl < 1e-5, (par.losses, one.losses)
    assert any(k.endswith("moe.experts.gate.weight") for k in gp) and any(k.endswith("shared_gate.weight") for k in gp)
    target = "torch" if runner is torch_runs else "jax"
    plan = compile_file(runner.spec_variant(SPEC, SGD + RULES), MESH).plan.memory_for(target)
    planned = {"params": plan.params, "grads": plan.grads, "optimizer": plan.optimizer, "buffers": plan.buffers}
    if runner is torch_runs:
        assert len(par.memory["ranks"]) == 8
        for rank, held in enumerate(par.memory["ranks"]):
            assert held == planned, f"rank {rank} holds {held}, the plan says {planned}"
    else:
        held = par.memory["device0"]
        assert {k: held[k] for k in ("params", "optimizer", "buffers")} == {
            k: planned[k] for k in ("params", "optimizer", "buffers")}, (held, planned)



@pytest.mark.slow
def test_torch_checkpoint_of_the_mesh_resumes_on_one_process(runs):
    """The experts saved as DTensors over expert x fsdp x tensor (DCP): one process resumes at step 2 on the
    trajectory of the one-process run."""
    (one, _), _ = runs[torch_runs]
    resumed = torch_runs.run(torch_runs.build(SPEC, "single", SGD), "--steps", "3", "--resume", str(CKPT / "step_00000002"))
    dl = float(np.abs(resumed.losses - one.losses[2:]).max())
    torch_runs.report(f"moe-shared torch {MESH} checkpoint -> 1 process, step 3", max_dloss=dl)
    assert len(resumed.losses) == 1 and dl < 1e-5
    assert torch_runs.max_param_diff(resumed.params, one.params) < 1e-5


PIPE = (("training:", "pipeline: {microbatches: 4, schedule: 1f1b}\n\ntraining:"),
        ("    - {repeat: layers, block: decoder, name: layers}\n    - {op: rms_norm, name: norm}",
         "    - {op: moe, name: pre_moe, experts: experts, top_k: 1, hidden: ff, activation: swiglu, aux_loss_weight: 0.01}\n"
         "    - {repeat: layers, block: decoder, name: layers}\n"
         "    - {op: moe, name: post_moe, experts: experts, top_k: 2, hidden: ff, activation: swiglu, aux_loss_weight: 0.01}\n"
         "    - {op: rms_norm, name: norm}"))


@pytest.mark.slow
def test_torch_pipeline_with_experts_split_equals_one_stage():
    one, par = torch_runs.run_many([(torch_runs.build(SPEC, m, SGD + PIPE), *ARGS) for m in ("single", "pipe=2,expert=2")])
    g1, gp = (dict(np.load(r.cwd / "grads.npz")) for r in (one, par))
    dg = assert_same_gradients(g1, gp, 1e-5, "moe-shared torch 1f1b pipe=2 x expert=2")
    dl = float(np.abs(par.losses - one.losses).max())
    torch_runs.report("moe-shared torch 1f1b pipe=2 x expert=2 vs one stage (plain SGD)", max_rel_dgrad=dg, max_dloss=dl)
    assert len(par.losses) == 3 and dl < 1e-5
    assert "pre_moe.experts.gate.weight" in gp and "post_moe.experts.down.weight" in gp
    planned = compile_file(torch_runs.spec_variant(SPEC, SGD + PIPE), "pipe=2,expert=2").plan.memory_for("torch")
    fullest = max(par.memory["ranks"], key=lambda r: sum(r.values()))  # (the plan's figure: the fullest stage's)
    assert fullest == {"params": planned.params, "grads": planned.grads, "optimizer": planned.optimizer,
                       "buffers": planned.buffers}


# The `expert` axis beside fsdp, tensor or pipe in a model without moe layers: it only splits the batch, and
# the program averages FSDP2's gradients over it too (the capability matrix's tiny transformer, plain SGD).
NO_EXPERTS = [("pipe", "pipe=2,expert=2"), ("fsdp", "fsdp=2,expert=2"), ("tensor", "expert=2,tensor=2")]


def _matrix_spec(row: str, sharded: bool) -> Path:
    spec = mx.cell_spec(row, "none")
    spec["training"]["optimizer"] = {"name": "sgd", "lr": 0.5}
    if not sharded:
        spec.pop("sharding", None)
    path = torch_runs.WORK / f"no-experts-{row}-{sharded}.yaml"
    path.write_text(json.dumps(spec, indent=1))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("case", NO_EXPERTS, ids=[m for _, m in NO_EXPERTS])
def test_torch_expert_axis_without_experts_equals_one_device(case):
    row, mesh = case
    one, par = torch_runs.run_many([(torch_runs.build(_matrix_spec(row, False), "data=1"), *ARGS),
                                    (torch_runs.build(_matrix_spec(row, True), mesh), *ARGS)])
    assert "expert" in compile_file(_matrix_spec(row, True), mesh).plan.batch_axes
    g1, gp = (dict(np.load(r.cwd / "grads.npz")) for r in (one, par))
    dg = assert_same_gradients(g1, gp, 1e-5, f"torch no experts {mesh}")
    dl = float(np.abs(par.losses - one.losses).max())
    torch_runs.report(f"torch expert axis without experts {mesh} vs 1 device (plain SGD)", max_rel_dgrad=dg, max_dloss=dl)
    assert len(par.losses) == 3 and dl < 1e-5
