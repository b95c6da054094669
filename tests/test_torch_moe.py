"""Mixture of experts and expert parallelism in the PyTorch target (templates/torch/ops.py.j2 `moe`), with gloo
ranks on CPU.

Equivalence: the moe-dp example (top-2 routing over 4 experts, per-sample capacity, load-balancing loss)
built for data=2 x expert=2 (4 ranks) and data=2 x expert=4 (8 ranks: experts sharded over `expert`, tokens
dispatched and combined with all-to-all, the rest data parallel over data x expert), and for data=2 alone
(experts replicated, DDP), gives the loss trajectory of the one-process build, max abs difference below
1e-5 over 5 steps, float32. So does tensor parallelism (the experts' hidden features over `tensor`, Megatron
style: the router and the dispatch whole on every rank, the experts' partial sums all-reduced) on tensor=2,
data=2 x tensor=2 and tensor=2 with the sequence split too (sequence parallelism: the moe layer gathers the
sequence). Also: the exported parameters are the plan's (175,744 of them, canonical layouts), every rank holds
what the plan predicts, a checkpoint written with sharded experts resumes on one process, and the E049s for
expert layouts the torch target does not run.
"""

from __future__ import annotations

import pytest
from program_files import program_text
from torch_runs import SPECS, WORK, build, max_diff, max_param_diff, report, run, run_many, spec_variant

from mithril_spec.frontend import compile_file
from mithril_spec.lowering import check_target

MOE_DP = SPECS / "moe-dp.yaml"
STEPS = 5
CKPT = WORK / "ckpt-moe-four"
CASES = [  # (what, mesh)
    ("data=2 x expert=2 (4 ranks)", "four"),
    ("data=2 x expert=4 (8 ranks)", None),
    ("data=2, experts replicated (DDP)", "data=2"),
]


# Tensor parallelism: the spec with Megatron's rules (heads, kv_heads and the experts' hidden features over
# `tensor`), and meshes for it; "seq" also splits the blocks' sequence over `tensor` (sequence parallelism).
TP_RULES = "{heads: tensor, kv_heads: tensor, mlp: tensor}"
TP_MESHES = "meshes:\n  tp: {tensor: 2}\n  dtp: {data: 2, tensor: 2}"
TP_CASES = [  # (what, mesh, edits); tensor=2 alone, and with the sequence split: the capability matrix
    ("data=2 x tensor=2", "dtp", (("meshes:", f"sharding:\n  rules: {TP_RULES}\n{TP_MESHES}"),)),
]


def _args(mesh):
    args = ("--steps", str(STEPS))
    if mesh == "four":  # also the checkpoint the resume test starts from
        args += ("--checkpoint-dir", str(CKPT), "--checkpoint-every", "3")
    return args


def reference():
    return run(build(MOE_DP, "single"), "--steps", str(STEPS))


def parallel(mesh):
    return run(build(MOE_DP, mesh), *_args(mesh))


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    run_many([(build(MOE_DP, "single"), "--steps", str(STEPS))] + [(build(MOE_DP, m), *_args(m)) for _, m in CASES]
             + [(build(MOE_DP, m, e), "--steps", str(STEPS)) for _, m, e in TP_CASES])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[1] or "default" for c in CASES])
def test_expert_parallel_equals_one_process(case):
    what, mesh = case
    ref, par = reference(), parallel(mesh)
    assert len(par.losses) == len(ref.losses) == STEPS
    dl = max_diff(par.losses, ref.losses)
    dg = max_diff(par.grad_norms, ref.grad_norms)
    dp = max_param_diff(par.params, ref.params)
    report(f"torch moe {what} vs 1 process", max_dloss=dl, max_dgrad_norm=dg, max_dparam=dp, steps=STEPS,
           seconds=round(par.seconds, 1))
    assert dl < 1e-5, f"{what}: losses differ from one process by {dl:.2e}"
    assert dg < 1e-4 and dp < 1e-4, (dg, dp)
    assert "Traceback" not in par.output and "terminate called" not in par.output


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [None, "four", "single"], ids=["default", "four", "single"])
def test_parameters_and_memory_are_the_plans(mesh):
    """The program exports exactly the plan's parameters (count and canonical shapes), and every rank holds
    the bytes the plan predicts: E / expert experts of each moe layer, everything else whole."""
    plan = compile_file(MOE_DP, mesh).plan
    got = reference() if mesh == "single" else parallel(mesh)
    assert sorted(got.params) == sorted(p.name for p in plan.params)
    assert all(got.params[p.name].shape == p.param.shape for p in plan.params)
    assert sum(a.size for a in got.params.values()) == plan.param_count == 175_744
    predicted = {"params": plan.memory.params, "grads": plan.memory.grads, "optimizer": plan.memory.optimizer,
                 "buffers": plan.memory.buffers}
    memory = got.memory
    report(f"torch moe memory {mesh or 'default'}", planned=predicted, ranks=len(memory["ranks"]))
    assert memory["planned"] == predicted
    for rank, held in enumerate(memory["ranks"]):
        assert held == predicted, f"rank {rank}: holds {held}, plan says {predicted}"


@pytest.mark.slow
@pytest.mark.parametrize("case", TP_CASES, ids=["dtp"])
def test_tensor_parallel_experts_equal_one_process_and_hold_the_plan(case):
    """Each rank keeps half of every expert's hidden features (experts.fc on its outputs, experts.proj on its
    inputs); the losses, gradient norms and parameters are those of one process, and every rank holds the
    bytes the plan predicts."""
    what, mesh, edits = case
    program = build(MOE_DP, mesh, edits)
    assert '"blocks.*.moe": "experts' in program_text(program)  # (experts_sp: the sequence split)
    ref, par = reference(), run(program, "--steps", str(STEPS))
    dl = max_diff(par.losses, ref.losses)
    dg = max_diff(par.grad_norms, ref.grad_norms)
    dp = max_param_diff(par.params, ref.params)
    plan = compile_file(spec_variant(MOE_DP, edits), mesh).plan
    fc = plan.param("blocks.0.moe.experts.fc.weight")
    assert [list(d) for d in fc.spec] == [[], [], ["tensor"]]  # the hidden features split, as planned
    predicted = {"params": plan.memory.params, "grads": plan.memory.grads, "optimizer": plan.memory.optimizer,
                 "buffers": plan.memory.buffers}
    report(f"torch moe tensor parallel {what} vs 1 process", max_dloss=dl, max_dgrad_norm=dg, max_dparam=dp,
           steps=STEPS, planned=predicted)
    assert len(par.losses) == len(ref.losses) == STEPS
    assert dl < 1e-5, f"{what}: losses differ from one process by {dl:.2e}"
    assert dg < 1e-4 and dp < 1e-4, (dg, dp)
    for rank, held in enumerate(par.memory["ranks"]):
        assert held == predicted, f"{what}: rank {rank} holds {held}, plan says {predicted}"


@pytest.mark.slow
def test_checkpoint_with_sharded_experts_resumes_on_one_process():
    parallel("four")
    second = run(build(MOE_DP, "single"), "--steps", str(STEPS), "--resume", str(CKPT / "step_00000003"))
    ref = reference()
    d = max_diff(second.losses, ref.losses[3:])
    report("torch moe checkpoint data=2 x expert=2 -> 1 process, steps 4-5", max_dloss=d)
    assert len(second.losses) == STEPS - 3 and d < 1e-5
    assert max_param_diff(second.params, ref.params) < 1e-4


@pytest.mark.runs
def test_rendered_program():
    text = program_text(build(MOE_DP))
    assert "all_to_all_single_autograd" in text and "def expert_parallel(" in text
    assert "capacity=10" in text  # ceil(1.25 * 16 tokens * top-2 / 4 experts), decided by the plan
    assert "return loss_fn(lm_head, targets) + moe_aux_loss(self)" in text
    single = program_text(build(MOE_DP, "single"))
    assert "def expert_parallel(" not in single and "class MoE(nn.Module)" in single


def e049(mesh=None, edits=()) -> list[tuple[str, int, int]]:
    c = compile_file(spec_variant(MOE_DP, edits), mesh)
    return [(d.message, d.pos.line, d.pos.col) for d in check_target(c.plan, c.doc, "torch") if d.code == "E049"]


@pytest.mark.runs
def test_unsupported_expert_layouts_are_e049_with_their_position():
    assert e049() == [] and e049("four") == [] and e049("single") == []
    # with fsdp too, whose default rules split the experts over expert x fsdp on dimension 0 (test_moe_mesh.py)
    assert e049("expert=2,fsdp=2") == [] and e049("expert=2,fsdp=2,tensor=2") == []
    # 2 experts on expert=2 x fsdp=2: fsdp splits their features, which the torch target does not gather
    (layout, line, col), = e049("expert=2,fsdp=2", (("experts: 4,", "experts: 2,"),))
    assert "splits a moe layer's experts on dimension 0 over `expert`" in layout and "[expert, fsdp, -]" in layout
    assert (line, col) == (19, 25)  # the moe layer's name
    # the experts' hidden dimension split over `data`
    rules = (("meshes:", "sharding:\n  rules: {batch: [data, expert], experts: expert, mlp: data}\nmeshes:"),)
    found = e049(None, rules)
    assert any("splits a moe layer's experts" in msg and "[expert, -, data]" in msg and (line, col) == (19, 25)
               for msg, line, col in found), found
    assert any("parameters split over the `data` axis" in msg for msg, _, _ in found)  # (it replicates over data)
    assert len(found) == 2


@pytest.mark.runs
def test_tensor_parallel_experts_split_only_on_their_hidden_features():
    """Over `tensor` the torch target splits a moe layer's experts on their hidden features (TP_CASES) or not
    at all: the experts themselves over `tensor` are E049, at the moe layer."""
    (_what, _mesh, rules), = TP_CASES
    sequence = (("meshes:", f"sharding:\n  rules: {TP_RULES[:-1]}, seq: tensor}}\n{TP_MESHES}"),)
    assert e049("tp", rules) == [] and e049("tp", sequence) == []
    rules = (("meshes:", f"sharding:\n  rules: {{experts: tensor}}\n{TP_MESHES}"),)
    (msg, line, col), = e049("tp", rules)
    assert "splits a moe layer's experts on their hidden features" in msg and (line, col) == (19, 25)
