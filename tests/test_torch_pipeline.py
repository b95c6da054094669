"""Pipeline parallelism in the PyTorch target (torch.distributed.pipelining; templates/torch/pipeline_*.py.j2),
with gloo ranks on CPU.

Equivalence: each schedule (gpipe, 1f1b, interleaved with 2 virtual stages) gives the loss trajectory of the
one-process build (`--mesh data=1`, which runs the same micro-batches one after the other), max abs
difference below 1e-5 over 5 steps, float32: 1f1b on the example's default mesh pipe=2 x data=2 x tensor=2
(pipeline with data and tensor parallelism, 8 ranks), gpipe on pipe=2 x fsdp=2 (FSDP2 inside the stages),
interleaved on pipe=2 x data=2 (DDP inside the stages) and 1f1b on pipe=4; with moe layers in the stages
(their load-balancing losses part of the loss and its gradient), gpipe on pipe=2 and 1f1b on pipe=2 x
fsdp=2; vocab-parallel (the table and the logits split over `tensor`, a parallel cross-entropy on the last
stage), 1f1b on pipe=2 x tensor=2 and gpipe on pipe=2 x data=2 x tensor=2. Also: gradient accumulation
around the pipeline, canonical export (the plan's parameter count), the memory each rank holds, checkpoints
(DCP, canonical names, a flat optimizer state) resumed on their own mesh equal to the uninterrupted run (the
default mesh's 8 ranks and pipe=4) and on another (pipe=2 x data=2 x tensor=2 on pipe=4, pipe=4 on one
process), and the E049s for what the torch pipeline does not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_edits import BATCH_NORM, GPIPE, REMAT
from program_files import program_text
from torch_runs import SPECS, WORK, build, max_diff, max_param_diff, report, run, run_many, spec_variant

from mithril_spec.frontend import compile_file
from mithril_spec.lowering import check_target

GPT_PIPE = SPECS / "gpt-pipe.yaml"
STEPS = 5
INTERLEAVED = (("schedule: 1f1b}", "schedule: interleaved, virtual_stages: 2}"),)
CKPT = WORK / "ckpt-gpt-pipe4"
CKPT_DEFAULT = WORK / "ckpt-gpt-pipe"  # the default mesh's (pipe=2 x data=2 x tensor=2)
CASES = [  # (what, mesh (None: the spec's default, pipe=2,data=2,tensor=2), spec edits)
    ("1f1b pipe=2 x data=2 x tensor=2", None, ()),
    ("gpipe pipe=2 x fsdp=2", "pipe=2,fsdp=2", GPIPE),
    ("interleaved pipe=2 x 2 virtual x data=2", "pipe=2,data=2", INTERLEAVED),
    ("1f1b pipe=4", "pipe4", ()),
]  # (grad accumulation in a pipeline, with every other training feature: the capability matrix's pipe row)
# the blocks' mlp as a moe layer (4 experts, top-2) with a load-balancing loss of weight 0.01 (NO_AUX: 0)
MLP = "- {op: mlp, name: mlp, hidden: ff, activation: gelu}"
MOE_LAYER = "- {op: moe, name: mlp, experts: 4, top_k: 2, hidden: ff, capacity_factor: 1.25, aux_loss_weight: 0.01}"
MOE = ((MLP, MOE_LAYER),)
NO_AUX = ((MLP, MOE_LAYER.replace("0.01", "0.0")),)
MOE_CASES = [  # (what, mesh, spec edits besides MOE); 1f1b on pipe=2: the capability matrix
    ("gpipe pipe=2", "pipe=2", GPIPE),
]
# vocab-parallel (Megatron's): the embedding table (stage 0) split on its rows over `tensor`, the output layer
# (the last stage) on its output features, its logits into loss_parallel's cross-entropy
VOCAB = (("    mlp: tensor\n", "    mlp: tensor\n    vocab: tensor\n"),
         ("name: lm_head, dimension: vocab, bias: false}", "name: lm_head, dimension: vocab, axis: vocab, bias: false}"))
VOCAB_CASES = [  # (what, mesh, spec edits besides VOCAB)
    ("1f1b pipe=2 x tensor=2", "pipe=2,tensor=2", ()),  # without FSDP2: the table keeps its gradient's rows
]  # (gpipe on pipe=2 x data=2 x tensor=2, FSDP2 over data inside the stages, matched too: 8 ranks, left out
# of the suite for its time)


def reference():
    return run(build(GPT_PIPE, "single"), "--steps", str(STEPS))


def _args(mesh, edits):
    args = ("--steps", str(STEPS))
    ckpt = {"pipe4": CKPT, None: CKPT_DEFAULT}.get(mesh) if not edits else None
    if ckpt:  # also the checkpoints the resume tests start from (step 3)
        args += ("--checkpoint-dir", str(ckpt), "--checkpoint-every", "3")
    return args


def parallel(mesh, edits):
    return run(build(GPT_PIPE, mesh, edits), *_args(mesh, edits))


def resumed():
    """The one-process build resumed from the pipe=4 run's step-3 checkpoint, to step 5."""
    parallel("pipe4", ())
    return run(build(GPT_PIPE, "single"), "--steps", str(STEPS), "--resume", str(CKPT / "step_00000003"))


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    run_many([(build(GPT_PIPE, "single"), "--steps", str(STEPS))]
             + [(build(GPT_PIPE, mesh, edits), *_args(mesh, edits)) for _, mesh, edits in CASES]
             + [(build(GPT_PIPE, "single", e), "--steps", str(STEPS)) for e in (MOE, NO_AUX)]
             + [(build(GPT_PIPE, mesh, MOE + edits), "--steps", str(STEPS)) for _, mesh, edits in MOE_CASES]
             + [(build(GPT_PIPE, mesh, VOCAB + edits), "--steps", str(STEPS)) for _, mesh, edits in
                [("", "single", ())] + VOCAB_CASES]
             + [bn_job(mesh, edits) for mesh, edits in BN_RUNS])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0].split()[0] + "-" + (c[1] or "default") for c in CASES])
def test_schedule_equals_one_process(case):
    what, mesh, edits = case
    ref, par = reference(), parallel(mesh, edits)
    assert len(par.losses) == len(ref.losses) == STEPS
    dl = max_diff(par.losses, ref.losses)
    dg = max_diff(par.grad_norms, ref.grad_norms)
    dp = max_param_diff(par.params, ref.params)
    report(f"torch pipeline {what} vs 1 process", max_dloss=dl, max_dgrad_norm=dg, max_dparam=dp, steps=STEPS,
           seconds=round(par.seconds, 1))
    assert dl < 1e-5, f"{what}: losses differ from one process by {dl:.2e}"
    assert dg < 1e-4 and dp < 1e-4, (dg, dp)
    assert "Traceback" not in par.output and "terminate called" not in par.output


@pytest.mark.slow
@pytest.mark.parametrize("case", MOE_CASES, ids=[c[0].split()[0] + "-" + c[1] for c in MOE_CASES])
def test_moe_in_the_stages_equals_one_process(case):
    """moe layers on both stages: each stage's load-balancing losses get their gradient at the stage's output
    (CarryAuxLoss) and join the logged loss; the one-process build adds them to each micro-batch's loss."""
    what, mesh, edits = case
    ref = run(build(GPT_PIPE, "single", MOE), "--steps", str(STEPS))
    par = run(build(GPT_PIPE, mesh, MOE + edits), "--steps", str(STEPS))
    without = run(build(GPT_PIPE, "single", NO_AUX), "--steps", str(STEPS))
    dl = max_diff(par.losses, ref.losses)
    dg = max_diff(par.grad_norms, ref.grad_norms)
    dp = max_param_diff(par.params, ref.params)
    # the load-balancing losses are in the loss: before the first update the two differ by exactly them
    # (4 moe layers, weight 0.01, each about 1 near balance); their gradient changes the training after it
    aux = par.losses[0] - without.losses[0]
    moved = max_param_diff(par.params, without.params)
    report(f"torch pipeline moe {what} vs 1 process", max_dloss=dl, max_dgrad_norm=dg, max_dparam=dp,
           aux_loss=round(float(aux), 5), dparam_without_aux=moved)
    assert dl < 1e-5, f"{what}: losses differ from one process by {dl:.2e}"
    assert dg < 1e-4 and dp < 1e-4, (dg, dp)
    assert 0.02 < aux < 0.1, aux
    assert moved > 1e-3, moved  # (7e-3: far more than the pipeline and the one process differ)


def held_by_stage(plan, memory) -> None:
    """Every rank holds the planned bytes of its pipe rank's stages (ranks are pipe-major), the fullest
    what the plan reports."""
    predicted = {"params": plan.memory.params, "grads": plan.memory.grads, "optimizer": plan.memory.optimizer,
                 "buffers": plan.memory.buffers}
    assert memory["planned"] == predicted
    assert max(memory["ranks"], key=lambda r: sum(r.values())) == predicted
    pp = plan.pipeline
    stage_params = [sum(p.local_bytes for p in plan.params if p.stage % pp.pipe == r) for r in range(pp.pipe)]
    per_pipe_rank = len(memory["ranks"]) // pp.pipe
    for r, held in enumerate(memory["ranks"]):
        assert held["params"] == stage_params[r // per_pipe_rank], (r, held)


@pytest.mark.slow
@pytest.mark.parametrize("case", VOCAB_CASES, ids=[c[0].split()[0] for c in VOCAB_CASES])
def test_vocab_parallel_in_the_stages_equals_one_process(case):
    """The table's stage sends its whole lookups on; the last stage's logits stay split over `tensor` (a
    DTensor) into its loss_fn, which loss_parallel around the schedule's step makes a parallel
    cross-entropy."""
    what, mesh, edits = case
    spec = spec_variant(GPT_PIPE, VOCAB + edits)
    plan = compile_file(spec, mesh).plan
    assert plan.param("wte.weight").spec[0] == ("tensor",) and plan.param("lm_head.weight").spec[1] == ("tensor",)
    text = program_text(build(GPT_PIPE, mesh, VOCAB + edits))
    assert '"wte": "vocab_rows"' in text and '"lm_head": "colwise_logits"' in text and "with loss_parallel():" in text
    ref = run(build(GPT_PIPE, "single", VOCAB), "--steps", str(STEPS))
    par = run(build(GPT_PIPE, mesh, VOCAB + edits), "--steps", str(STEPS))
    dl = max_diff(par.losses, ref.losses)
    dg = max_diff(par.grad_norms, ref.grad_norms)
    dp = max_param_diff(par.params, ref.params)
    report(f"torch pipeline vocab-parallel {what} vs 1 process", max_dloss=dl, max_dgrad_norm=dg, max_dparam=dp,
           ranks=[r["params"] for r in par.memory["ranks"]])
    assert len(par.losses) == STEPS and dl < 1e-5, f"{what}: losses differ from one process by {dl:.2e}"
    assert dg < 1e-4 and dp < 1e-4, (dg, dp)
    held_by_stage(plan, par.memory)


@pytest.mark.slow
def test_export_is_canonical_and_counts_the_plans_parameters():
    plan = compile_file(GPT_PIPE).plan
    got = parallel(None, ()).params
    assert sorted(got) == sorted(p.name for p in plan.params)
    assert all(got[p.name].shape == p.param.shape for p in plan.params)
    assert sum(a.size for a in got.values()) == plan.param_count == 233_856


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [None, "pipe4"], ids=["default", "pipe4"])
def test_memory_each_rank_holds_its_stages(mesh):
    """Each rank holds only its stages' parameters (TP shards of them); the plan reports the fullest pipe
    rank, which is what that rank holds (params, grads, adamw's two slots)."""
    plan = compile_file(GPT_PIPE, mesh).plan
    memory = parallel(mesh, ()).memory
    predicted = {"params": plan.memory.params, "grads": plan.memory.grads, "optimizer": plan.memory.optimizer,
                 "buffers": plan.memory.buffers}
    assert memory["planned"] == predicted
    fullest = max(memory["ranks"], key=lambda r: sum(r.values()))
    report(f"torch pipeline memory {mesh or 'default'}", fullest=fullest, planned=predicted,
           ranks=[r["params"] for r in memory["ranks"]])
    assert fullest == predicted
    pp = plan.pipeline
    stage_params = [sum(p.local_bytes for p in plan.params if p.stage % pp.pipe == r) for r in range(pp.pipe)]
    per_pipe_rank = len(memory["ranks"]) // pp.pipe  # ranks are pipe-major
    for r, held in enumerate(memory["ranks"]):
        assert held["params"] == stage_params[r // per_pipe_rank], (r, held)


@pytest.mark.slow
def test_checkpoint_from_pipe4_resumes_on_one_process():
    """DCP under canonical names: a checkpoint written by 4 pipeline stages loads into the one-process build
    and continues on the uninterrupted trajectory."""
    second = resumed()
    ref = reference()
    assert len(second.losses) == STEPS - 3
    d = max_diff(second.losses, ref.losses[3:])
    report("torch pipeline checkpoint pipe=4 -> 1 process, steps 4-5", max_dloss=d)
    assert d < 1e-5
    assert max_param_diff(second.params, ref.params) < 1e-4


@pytest.mark.slow
def test_pipe4_resumes_on_its_own_mesh():
    """Each stage keeps its own optimizer settings in the checkpoint (a flat optimizer state dict): the
    pipe=4 build resumed from its step-3 checkpoint continues on its uninterrupted trajectory."""
    first = parallel("pipe4", ())
    again = run(build(GPT_PIPE, "pipe4"), "--steps", str(STEPS), "--resume", str(CKPT / "step_00000003"))
    assert len(again.losses) == STEPS - 3
    d = max_diff(again.losses, first.losses[3:])
    report("torch pipeline pipe=4 resumed on pipe=4, steps 4-5", max_dloss=d)
    assert d < 1e-6
    assert max_param_diff(again.params, first.params) < 1e-6


@pytest.mark.slow
def test_default_mesh_resumes_on_its_own_mesh():
    """pipe=2 x data=2 x tensor=2 (8 ranks: tensor-parallel DTensors replicated over data inside each stage)
    resumed from its step-3 checkpoint: every stage loads its own parameters and optimizer state (slots and
    settings) and continues on the uninterrupted trajectory, bit for bit."""
    first = parallel(None, ())
    step3 = CKPT_DEFAULT / "step_00000003"  # (the directory's newest is the run's last step, 5)
    again = run(build(GPT_PIPE), "--steps", str(STEPS), "--resume", str(step3))
    assert f"resumed from {step3} at step 3" in again.output
    assert len(again.losses) == STEPS - 3
    d = max_diff(again.losses, first.losses[3:])
    dp = max_param_diff(again.params, first.params)
    report("torch pipeline pipe=2 x data=2 x tensor=2 resumed on its own mesh, steps 4-5", max_dloss=d,
           max_dparam=dp, uninterrupted=first.losses[3:].tolist(), resumed=again.losses.tolist())
    assert d < 1e-6 and dp < 1e-6, (d, dp)


@pytest.mark.slow
def test_checkpoint_from_default_mesh_resumes_on_pipe4():
    """DCP reshards the default mesh's checkpoint (2 stages, tensor shards, data replicas) onto 4 stages of
    whole tensors: the pipe=4 build continues on the uninterrupted trajectory (of either mesh: up to the
    rounding in which the two meshes differ)."""
    first = parallel(None, ())
    other = run(build(GPT_PIPE, "pipe4"), "--steps", str(STEPS), "--resume", str(CKPT_DEFAULT / "step_00000003"))
    assert len(other.losses) == STEPS - 3
    d = max_diff(other.losses, first.losses[3:])
    d4 = max_diff(other.losses, parallel("pipe4", ()).losses[3:])
    dp = max_param_diff(other.params, first.params)
    report("torch pipeline checkpoint pipe=2 x data=2 x tensor=2 -> pipe=4, steps 4-5", max_dloss=d,
           max_dloss_vs_pipe4=d4, max_dparam=dp, uninterrupted=first.losses[3:].tolist(),
           resumed=other.losses.tolist())
    assert d < 1e-5 and d4 < 1e-5 and dp < 1e-4, (d, d4, dp)


@pytest.mark.runs
def test_single_stage_build_runs_the_micro_batches_one_after_the_other():
    text = program_text(build(GPT_PIPE, "single"))
    assert "pipelining" not in text and "class Stage0" not in text
    assert "GRAD_ACCUM = 4" in text  # 4 pipeline micro-batches, one after the other
    text = program_text(build(GPT_PIPE))
    assert "Schedule1F1B(" in text and "class Stage1(nn.Module)" in text
    assert 'self.blocks = nn.ModuleDict({str(i): Decoder() for i in range(2, 4)})' in text
    text = program_text(build(GPT_PIPE, None, INTERLEAVED))
    assert "ScheduleInterleaved1F1B(" in text and "STAGES = 4" in text


def e049(edits, mesh=None) -> list[tuple[str, int, int]]:
    c = compile_file(spec_variant(GPT_PIPE, edits), mesh)
    return [(d.message, d.pos.line, d.pos.col) for d in check_target(c.plan, c.doc, "torch") if d.code == "E049"]


@pytest.mark.runs
def test_unsupported_pipelines_are_e049_with_their_position():
    assert e049(()) == [] and e049(INTERLEAVED) == [] and e049(GPIPE) == [] and e049((), "pipe4") == []
    # the head tied to the embedding on the other stage runs (a copy of the table there:
    # tests/test_torch_pipeline_tied.py), vocab-parallel too
    tied = (("{op: linear, name: lm_head, dimension: vocab, bias: false}",
             "{op: linear, name: lm_head, dimension: vocab, bias: false, tie: wte}"),)
    assert e049(tied) == [] and e049(tied, "pipe4") == [] and e049(tied + VOCAB[:1], "pipe=2,tensor=2") == []
    assert e049(VOCAB) == [] and e049(VOCAB, "pipe=2,tensor=2") == []
    # ... but not on another stage of the table's pipe rank (interleaved), where one rank would hold it twice
    # under one name: a layer tied to `wte` on stage 2, the head on stage 3, of 2 x 2 virtual stages
    again = (("{op: linear, name: lm_head, dimension: vocab, bias: false}",
              "{op: linear, name: tproj, dimension: vocab, bias: false, tie: wte, stage: 2}\n"
              "    - {op: linear, name: lm_head, dimension: vocab, bias: false, stage: 3}"),
             ("{op: layer_norm, name: ln_f}", "{op: layer_norm, name: ln_f, stage: 1}"),
             ("{repeat: layers, block: decoder, name: blocks}", "{repeat: layers, block: decoder, name: blocks, stage: 1}"))
    ((msg, line, col),) = e049(INTERLEAVED + again, "pipe=2")
    assert "`tproj` is tied to `wte.weight`, which is on pipeline stage 0, a stage of the same pipe rank" in msg
    assert (line, col) == (26, 26)
    # a layer after the block reads one before it: two tensors would cross the stage boundary
    skip = (("{op: layer_norm, name: ln_f}", "{op: add, name: skip, inputs: [blocks, wpe]}"),
            ("{op: linear, name: lm_head, dimension: vocab, bias: false}",
             "{op: linear, name: lm_head, dimension: vocab, bias: false, input: skip}"))
    ((msg, line, col),) = e049(skip)
    assert "would pass `blocks`, `wpe` to stage 1" in msg and (line, col) == (25, 23)  # at `skip`
    # dropout in a pipelined block runs (each pipeline micro-batch takes its rows of the micro-step's masks:
    # the capability matrix's pipe x dropout cell); so does batch_norm (test_batch_norm_statistics_...)
    drop = (("      - {op: add, name: res2, inputs: [res1, mlp]}",
             "      - {op: dropout, name: drop, rate: 0.1}\n      - {op: add, name: res2, inputs: [res1, drop]}"),)
    assert e049(drop) == []
    norm = (("      - {op: add, name: res2, inputs: [res1, mlp]}",
             "      - {op: batch_norm, name: bn}\n      - {op: add, name: res2, inputs: [res1, bn]}"),)
    assert e049(norm) == []
    # sequence parallelism inside a pipeline
    sp = (("    mlp: tensor\n", "    mlp: tensor\n    seq: tensor\n"),)
    assert [(line, col) for m, line, col in e049(sp) if "sequence parallelism in a pipeline" in m] == [(24, 46)]
    # the expert axis goes with pipe (splitting the batch here: no moe layers; tests/test_moe_mesh.py runs it)
    assert e049((), "pipe=2,expert=2") == []


BN_CASES = [  # (what, mesh, spec edits besides BATCH_NORM)
    ("gpipe pipe=2 x data=2", "pipe=2,data=2", GPIPE),
    ("1f1b pipe=2, remat full", "pipe=2", REMAT),
]
BN_RUNS = [("single", ())] + [c[1:] for c in BN_CASES]  # (mesh, edits): the one-process build first
BN_STEPS = 2  # a checkpoint after each step


def bn_job(mesh, edits) -> tuple:
    ck = WORK / f"ckpt-bn-{BN_RUNS.index((mesh, edits))}"
    return build(GPT_PIPE, mesh, BATCH_NORM + edits), "--steps", str(BN_STEPS), "--checkpoint-dir", str(ck), \
        "--checkpoint-every", "1"


def checkpoint_buffers(directory) -> dict:
    """The running statistics in a DCP checkpoint (by canonical name), read into one process."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = directory.parent / f"{directory.parent.name}-{directory.name}.pt"
    dcp_to_torch_save(directory, out)
    model = torch.load(out, weights_only=False)["model"]
    return {k: v.numpy() for k, v in model.items() if k.endswith(("running_mean", "running_var"))}


def bn_buffers(mesh, edits) -> tuple:
    """The run, and the buffers of its checkpoint after each step."""
    job = bn_job(mesh, edits)
    ck = Path(job[4])
    return run(*job), {s: checkpoint_buffers(ck / f"step_{s:08d}") for s in range(1, BN_STEPS + 1)}


@pytest.mark.slow
@pytest.mark.parametrize("case", BN_CASES, ids=[c[0].split()[0] for c in BN_CASES])
def test_batch_norm_statistics_per_micro_batch_equal_one_process(case):
    what, mesh, edits = case
    (ref, ref_b), (par, par_b) = bn_buffers("single", ()), bn_buffers(mesh, edits)
    assert len(par.losses) == len(ref.losses) == BN_STEPS
    dl = max_diff(par.losses, ref.losses)
    names = [f"{layer}.running_{s}" for layer in ["blocks.0.bn", "blocks.1.bn", "blocks.2.bn", "blocks.3.bn",
                                                  "bn_in", "bn_out"] for s in ("mean", "var")]
    assert sorted(par_b[1]) == sorted(ref_b[1]) == names
    # (relative to the statistic's size where above 1: running variances reach 5)
    db = {s: max(float(abs(par_b[s][k] - ref_b[s][k]).max() / max(1, abs(ref_b[s][k]).max())) for k in names)
          for s in par_b}
    report(f"torch pipeline batch_norm {what} vs 1 process", max_dloss=dl, max_dbuffer_step1=db[1],
           max_dbuffer_step2=db[2])
    assert dl < 1e-5, f"{what}: losses differ from one process by {dl:.2e}"
    assert db[1] < 1e-6 and db[2] < 1e-4, db  # (step 2: after an update, as in the JAX test)
    # the statistics moved: 4 micro-batches per step (a count other than 8 updates would be far off)
    one = ref_b[BN_STEPS]
    assert not abs(one["blocks.3.bn.running_var"] - 1).max() < 1e-2 and not abs(one["bn_out.running_var"] - 1).max() < 1e-2
