"""Pipeline parallelism in the JAX target (templates/jax/pipeline.py.j2), on 8 simulated CPU devices.

Equivalence: every schedule (gpipe, 1f1b, interleaved with 2 virtual stages) on pipe=2 x data=2 x tensor=2
(the gpt-pipe example's default mesh: pipeline with data and tensor parallelism) and 1f1b on pipe=4 give
the loss trajectory of the one-device build (`--mesh data=1`, which runs the same micro-batches one after
the other), max abs difference below 1e-5 over 5 steps, float32 (gpipe with full remat and gradient
accumulation around it). Also: canonical export and parameter
count, resume of the stacked train state (in the pipelined build and in one without a pipeline, which
stacks the copies in the same rows), the memory the program holds, batch_norm before, inside and after the
pipelined block (the losses and the running statistics of the one-device build: each pipeline micro-batch's
statistics, moved once per micro-batch in their order), explicit `device:` / `stage:` placement with uneven
stages padded to the largest, on pipe=2 x tensor=2 (the one-device build's losses and parameters, the plan's padded bytes, a
canonical export, an exact resume), and the E049s for what the jax pipeline does not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jax_runs import SPECS, WORK, build, max_diff, max_param_diff, report, run, run_many, spec_variant
from pipeline_edits import BATCH_NORM, GPIPE, REMAT
from program_files import program_text

from mithril_spec.frontend import compile_file
from mithril_spec.lowering import check_target

# the example moves to specs/ once both targets run it
GPT_PIPE = SPECS / "gpt-pipe.yaml"
STEPS = 5
INTERLEAVED = (("schedule: 1f1b}", "schedule: interleaved, virtual_stages: 2}"),)
# full remat and 2 accumulation micro-batches of 4 pipeline micro-batches each (float32: the one-device
# build's losses; the capability matrix's pipe row runs bfloat16, remat and accumulation with 1f1b)
REMAT_ACCUM = (("  seed: 0", "  seed: 0\n  remat: full\n  grad_accum: 2"),)
# `device:` placement, uneven: 1 copy on stage 0 (with the embeddings), 3 on stage 1 (with the head), from two
# repeats of the block; the program pads stage 0 to 3 rows (2 of them padding, skipped)
UNEVEN = (("    - {repeat: layers, block: decoder, name: blocks}\n",
           "    - {repeat: 1, block: decoder, name: blocks, device: 0}\n"
           "    - {repeat: 3, block: decoder, name: more, device: 1}\n"),)
# interleaved pipe=2 x 2 virtual stages, devices 0, 1, 0, 1: stages of 1, 3, 0 and 0 copies (ln_f and lm_head
# alone on the last two), each pipe rank holding 2 stages of 3 rows
UNEVEN_INTERLEAVED = UNEVEN + INTERLEAVED + (
    ("    - {op: layer_norm, name: ln_f}", "    - {op: layer_norm, name: ln_f, device: 0}"),
    ("    - {op: linear, name: lm_head, dimension: vocab, bias: false}",
     "    - {op: linear, name: lm_head, dimension: vocab, bias: false, device: 1}"),
)
# `stage:` placement: the embeddings alone on stage 0, all 4 copies on stage 1 (stage 0: 4 padding rows)
STAGED = (("    - {repeat: layers, block: decoder, name: blocks}", "    - {repeat: layers, block: decoder, name: blocks, stage: 1}"),)
# dropout after each copy: a copy's masks come from its own repeat's name and index, padding rows draw none
DROP = (("- {op: add, name: res2, inputs: [res1, mlp]}",
         "- {op: add, name: res2, inputs: [res1, mlp]}\n      - {op: dropout, name: drop, rate: 0.1}"),)
# the placement cases' mesh: the padded stages split over `tensor` too (4 devices; `data` changes nothing in them)
PLACED = "pipe=2,tensor=2"
EXPLICIT = [  # (what, spec edits, the one-device build's edits: the same canonical names), on PLACED;
    # each schedule once, each with dropout (the copies' masks by their own repeat's name and index)
    ("device: 1+3 dropout 1f1b", UNEVEN + DROP, UNEVEN + DROP),
    ("device: 1+3+0+0 dropout interleaved", UNEVEN_INTERLEAVED + DROP, UNEVEN + DROP),
    ("stage: 0+4 dropout gpipe", STAGED + DROP + GPIPE, DROP),
]
CASES = [  # (what, mesh (None: the spec's default, pipe=2,data=2,tensor=2), spec edits)
    ("1f1b pipe=2 x data=2 x tensor=2", None, ()),
    ("gpipe, full remat, grad_accum 2, pipe=2 x data=2 x tensor=2", None, GPIPE + REMAT_ACCUM),
    ("interleaved pipe=2 x 2 virtual x data=2 x tensor=2", None, INTERLEAVED),
    ("1f1b pipe=4", "pipe4", ()),
]


def reference():
    return run(build(GPT_PIPE, "single"), "--steps", str(STEPS))


def parallel(mesh, edits):
    return run(build(GPT_PIPE, mesh, edits), "--steps", str(STEPS))


def resumed():
    program, ck = build(GPT_PIPE), WORK / "ckpt-gpt-pipe"
    first = run(program, "--steps", "3", "--checkpoint-dir", str(ck))
    return first, run(program, "--steps", str(STEPS), "--resume", str(ck))


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    jobs = [(build(GPT_PIPE, "single"), "--steps", str(STEPS))]
    jobs += [(build(GPT_PIPE, mesh, edits), "--steps", str(STEPS)) for _, mesh, edits in CASES]
    jobs += [(build(GPT_PIPE), "--steps", "3", "--checkpoint-dir", str(WORK / "ckpt-gpt-pipe"))]
    jobs += [bn_job(mesh, edits) for mesh, edits in BN_RUNS]
    jobs += [(build(GPT_PIPE, "single", edits), "--steps", str(STEPS)) for edits in (UNEVEN + DROP, DROP)]
    jobs += [(build(GPT_PIPE, PLACED, edits), "--steps", str(STEPS)) for _, edits, _ in EXPLICIT]
    jobs += [(build(GPT_PIPE, PLACED, UNEVEN + DROP), "--steps", "3", "--checkpoint-dir",
              str(WORK / "ckpt-gpt-pipe-uneven"))]
    run_many(jobs)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0].split()[0].rstrip(",") + "-" + (c[1] or "default") for c in CASES])
def test_schedule_equals_one_device(case):
    what, mesh, edits = case
    ref, par = reference(), parallel(mesh, edits)
    assert len(par.losses) == len(ref.losses) == STEPS
    dl = max_diff(par.losses, ref.losses)
    dg = max_diff([r["grad_norm"] for r in par.metrics], [r["grad_norm"] for r in ref.metrics])
    dp = max_param_diff(par.params, ref.params)
    report(f"pipeline {what} vs 1 device", max_dloss=dl, max_dgrad_norm=dg, max_dparam=dp, steps=STEPS)
    assert dl < 1e-5, f"{what}: losses differ from one device by {dl:.2e}"
    assert dg < 1e-4 and dp < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("case", EXPLICIT, ids=[c[0].replace(" ", "-") for c in EXPLICIT])
def test_explicit_uneven_stages_equal_one_device_and_hold_the_planned_bytes(case):
    """`device:` / `stage:` placement, uneven stages padded to the largest: the one-device build's losses and
    final parameters, an export with the canonical names only (no padding rows), and per device the bytes
    that the plan counts for the jax program (Plan.memory_for: every stage padded, the layers outside the
    pipeline on every pipe rank)."""
    what, edits, ref_edits = case
    ref = run(build(GPT_PIPE, "single", ref_edits), "--steps", str(STEPS))
    par = run(build(GPT_PIPE, PLACED, edits), "--steps", str(STEPS))
    assert len(par.losses) == len(ref.losses) == STEPS
    dl, dp = max_diff(par.losses, ref.losses), max_param_diff(par.params, ref.params)
    plan = compile_file(spec_variant(GPT_PIPE, edits), PLACED).plan
    mine, held = plan.memory_for("jax"), par.memory
    report(f"pipeline {what} vs 1 device", max_dloss=dl, max_dparam=dp, held_params=held["device0"]["params"],
           plan_params=plan.memory.params, jax_plan_params=mine.params)
    # (the parameters after 5 adamw steps: adam amplifies rounding, as in test_schedule_equals_one_device)
    assert dl < 1e-5 and dp < 1e-4, f"{what}: losses differ by {dl:.2e}, parameters by {dp:.2e}"
    assert sorted(par.params) == sorted(p.name for p in plan.params)
    assert all(par.params[p.name].shape == p.param.shape for p in plan.params)
    assert held["planned"] == {"params": mine.params, "optimizer": mine.optimizer, "buffers": mine.buffers}
    assert held["device0"]["params"] == mine.params and held["device0"]["optimizer"] == 2 * mine.params
    # each pipe rank holds (virtual stages x the largest stage's copies) copies of the block: more than
    # the plan's own split puts on its fullest rank
    pp = plan.pipeline
    rows = pp.virtual * max(map(len, pp.stage_copies))
    first = next(c for stage in pp.stage_copies for c in stage)  # a copy's bytes: all copies are alike
    one = sum(p.local_bytes for p in plan.params if p.name.startswith(f"{first[0]}.{first[1]}."))
    outside = sum(p.local_bytes for p in plan.params if p.name.split(".")[0] not in {"blocks", "more"})
    assert mine.params == rows * one + outside > plan.memory.params


@pytest.mark.slow
def test_uneven_stages_resume_exactly():
    """A checkpoint of the padded train state (1+3 on pipe=2, with dropout: the keys go on) resumes on the same
    trajectory."""
    program, ck = build(GPT_PIPE, PLACED, UNEVEN + DROP), WORK / "ckpt-gpt-pipe-uneven"
    first = run(program, "--steps", "3", "--checkpoint-dir", str(ck))
    second = run(program, "--steps", str(STEPS), "--resume", str(ck))
    full = run(program, "--steps", str(STEPS))
    assert len(second.losses) == STEPS - 3
    assert max_diff(list(first.losses) + list(second.losses), full.losses) == 0.0
    assert max_param_diff(second.params, full.params) == 0.0


@pytest.mark.slow
def test_export_is_canonical_and_counts_the_plans_parameters():
    plan = compile_file(GPT_PIPE).plan
    got = parallel(None, ()).params
    assert sorted(got) == sorted(p.name for p in plan.params)
    assert all(got[p.name].shape == p.param.shape for p in plan.params)
    assert sum(a.size for a in got.values()) == plan.param_count == 233_856


@pytest.mark.slow
def test_memory_held_stage_copies_and_replicated_rest():
    """Device 0 holds its stages' copies of the repeated block (stacked, split over `pipe`) and every other
    parameter whole (replicated over `pipe`: the layers before and after the block run outside the
    pipeline). The plan's stage split puts those layers on one stage each (as the torch target runs them);
    for the jax target (`Plan.memory_for`, the program's planned bytes, and the note `plan` prints) it
    counts them on every pipe rank: what the program holds."""
    plan = compile_file(GPT_PIPE).plan
    pp = plan.pipeline
    (rep,) = pp.repeat_split
    on_rank0 = {s for s in range(len(pp.stages)) if s % pp.pipe == 0}
    want = sum(p.local_bytes for p in plan.params
               if not p.name.startswith(rep + ".") or pp.param_stage[p.name] in on_rank0)
    extra = sum(p.local_bytes for p in plan.params if not p.name.startswith(rep + ".") and p.stage not in on_rank0)
    held = parallel(None, ()).memory
    report("pipeline device-0 bytes", held_params=held["device0"]["params"], planned_params=plan.memory.params,
           replicated_last_stage_params=extra)
    assert held["device0"]["params"] == want == plan.memory.params + extra
    assert held["device0"]["optimizer"] == 2 * want  # adamw: mu and nu
    mine = plan.memory_for("jax")
    assert held["planned"] == {"params": mine.params, "optimizer": mine.optimizer, "buffers": mine.buffers}
    assert held["device0"]["params"] == mine.params and held["device0"]["optimizer"] == mine.optimizer
    assert plan.memory_for("torch") == plan.memory  # torch runs each layer on its own stage


@pytest.mark.slow
def test_resume_the_stacked_state():
    first, second = resumed()
    full = parallel(None, ())
    assert len(first.losses) == 3 and len(second.losses) == STEPS - 3
    assert max_diff(list(first.losses) + list(second.losses), full.losses) == 0.0
    assert max_param_diff(second.params, full.params) == 0.0


@pytest.mark.slow
def test_stacked_checkpoints_move_between_builds_with_the_same_rows():
    """A 1f1b pipe=2 build stacks the copies in their order, as a build without a pipeline does: its checkpoint
    resumes there on the same trajectory. An interleaved build's rows are in another order: refused."""
    first, _ = resumed()
    single = run(build(GPT_PIPE, "single"), "--steps", str(STEPS), "--resume", str(WORK / "ckpt-gpt-pipe"))
    d = max_diff(list(first.losses) + list(single.losses), reference().losses)
    report("pipeline checkpoint (1f1b pipe=2, step 3) resumed without a pipeline", max_dloss=d)
    assert d < 1e-5
    ck = WORK / "ckpt-gpt-pipe-interleaved"
    run(build(GPT_PIPE, None, INTERLEAVED), "--steps", "1", "--checkpoint-dir", str(ck))
    refused = run(build(GPT_PIPE, "single"), "--steps", "2", "--resume", str(ck), expect_rc=2)
    assert "stacks the copies of the repeated blocks in the rows {'blocks': [0, 2, 1, 3]}" in refused.output


@pytest.mark.runs
def test_single_stage_build_runs_the_micro_batches_one_after_the_other():
    text = program_text(build(GPT_PIPE, "single"))
    assert "shard_map" not in text and "STACK_ORDER" not in text
    assert "MICROBATCHES = 4" in text and "jnp.arange(CHUNKS)" in text
    text = program_text(build(GPT_PIPE))
    assert "def pipeline_1f1b(" in text and '"blocks.*.mlp.fc.weight": P("pipe", None, "tensor")' in text


def e049(edits, mesh=None) -> list[str]:
    from jax_runs import spec_variant

    c = compile_file(spec_variant(GPT_PIPE, edits), mesh)
    return [d.message for d in check_target(c.plan, c.doc, "jax") if d.code == "E049"]


@pytest.mark.runs
def test_unsupported_pipelines_are_e049():
    assert e049(()) == []
    assert e049(INTERLEAVED) == [] and e049(GPIPE) == []
    # explicit stages, uneven ones too (padded: test_explicit_uneven_stages_equal_one_device_and_hold_the_planned_bytes)
    staged = (("- {op: layer_norm, name: ln_f}", "- {op: layer_norm, name: ln_f, stage: 1}"),)
    assert e049(staged) == [] and e049(STAGED) == [] and e049(UNEVEN) == [] and e049(UNEVEN_INTERLEAVED) == []
    # ... but not a layer between the pipelined repeats
    between = UNEVEN + (("    - {repeat: 3, block: decoder, name: more, device: 1}",
                         "    - {op: layer_norm, name: mid, device: 1}\n    - {repeat: 3, block: decoder, name: more}"),)
    assert any("`mid` runs between the repeats `blocks` and `more`" in m for m in e049(between))
    assert e049(UNEVEN + DROP) == []
    # dropout in the pipelined block: each micro-batch's keys travel with it (the capability matrix runs it)
    drop = (("- {op: add, name: res2, inputs: [res1, mlp]}",
             "- {op: add, name: res2, inputs: [res1, mlp]}\n      - {op: dropout, name: drop, rate: 0.1}"),)
    assert e049(drop) == [] and e049(drop, "single") == []
    # a layer after the block that reads one before it
    skip = (("- {op: layer_norm, name: ln_f}",
             "- {op: add, name: skip, inputs: [blocks, wpe]}\n    - {op: layer_norm, name: ln_f}"),)
    assert any("`skip` reads `wpe`" in m for m in e049(skip))
    # moe in a pipelined model: each stage's load-balancing losses join the loss (tests/test_jax_moe.py runs it)
    moe = (("- {op: mlp, name: mlp, hidden: ff, activation: gelu}",
            "- {op: moe, name: mlp, experts: 2, hidden: ff}"),)
    assert e049(moe) == []


BN_CASES = [  # (what, mesh, spec edits besides BATCH_NORM)
    ("gpipe pipe=2 x data=2", "pipe=2,data=2", GPIPE),
    ("1f1b pipe=2, remat full", "pipe=2", REMAT),
]
BN_RUNS = [("single", ())] + [c[1:] for c in BN_CASES]  # (mesh, edits): the one-device build first
BN_STEPS = 2  # a checkpoint after each step


def bn_job(mesh, edits) -> tuple:
    ck = WORK / f"ckpt-bn-{BN_RUNS.index((mesh, edits))}"
    return build(GPT_PIPE, mesh, BATCH_NORM + edits), "--steps", str(BN_STEPS), "--checkpoint-dir", str(ck), \
        "--checkpoint-every", "1"


def bn_buffers(mesh, edits) -> tuple:
    """The run, and the buffers of its checkpoint after each step (batch_norm's running statistics)."""
    from test_jax_ops import restore_state

    job = bn_job(mesh, edits)
    return run(*job), {s: restore_state(Path(job[4]), s)["buffers"] for s in range(1, BN_STEPS + 1)}


@pytest.mark.slow
@pytest.mark.parametrize("case", BN_CASES, ids=[c[0].split()[0] for c in BN_CASES])
def test_batch_norm_statistics_per_micro_batch_equal_one_device(case):
    what, mesh, edits = case
    (ref, ref_b), (par, par_b) = bn_buffers("single", ()), bn_buffers(mesh, edits)
    assert len(par.losses) == len(ref.losses) == BN_STEPS
    dl = max_diff(par.losses, ref.losses)
    assert sorted(par_b[1]) == sorted(ref_b[1]) == [
        "blocks.*.bn.running_mean", "blocks.*.bn.running_var", "bn_in.running_mean", "bn_in.running_var",
        "bn_out.running_mean", "bn_out.running_var"]
    # (relative to the statistic's size where above 1: running variances reach 5)
    db = {s: max(float(abs(par_b[s][k] - ref_b[s][k]).max() / max(1, abs(ref_b[s][k]).max())) for k in ref_b[s])
          for s in par_b}
    report(f"pipeline batch_norm {what} vs 1 device", max_dloss=dl, max_dbuffer_step1=db[1], max_dbuffer_step2=db[2])
    assert dl < 1e-5, f"{what}: losses differ from one device by {dl:.2e}"
    # after step 1 (the same parameters ran): rounding only. After step 2 the parameters differ by adam's
    # amplified rounding noise (up to 1e-4: test_schedule_equals_one_device), which bn_out's small running
    # mean shows.
    assert db[1] < 1e-6 and db[2] < 1e-4, db
    # the statistics moved: 4 micro-batches per step (a count other than 8 updates would be far off)
    one = ref_b[BN_STEPS]
    assert not abs(one["blocks.*.bn.running_var"] - 1).max() < 1e-2 and not abs(one["bn_out.running_var"] - 1).max() < 1e-2
