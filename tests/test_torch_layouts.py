"""The torch target's layouts beyond replication over `data` and rows of the batch (issue 13), gloo on CPU.

- Parameters split over `data` (`sharding.params` globs or rules): FSDP2 over the data axis shards exactly
  those (the others whole, their gradients averaged by reduce_whole_grads). The run equals one process,
  every rank holds the planned bytes, and a DCP checkpoint resumes exactly.
- `sharding.inputs` layouts other than rows of the batch: each rank reads its block of the input as laid
  out and redistributes it (a DTensor) to its rows; the run equals one process.
- What the torch program cannot do so stays E049, with its reason.
"""

from __future__ import annotations

import pytest
from program_files import program_text
from torch_runs import SPECS, build, max_diff, max_param_diff, report, run, run_many, spec_variant

from mithril_spec.frontend import compile_file
from mithril_spec.lowering import check_target

N = 6
HALF = N // 2
MLP, GPT = SPECS / "mlp-dp.yaml", SPECS / "gpt-tiny.yaml"


def sharding(text: str) -> tuple:
    """mlp-dp with a sharding section (it has none)."""
    return (("\ntraining:", f"\nsharding:\n{text}\ntraining:"),)


# (spec, edits, mesh, what): a parallel build compared with its one-process build
MLP_GLOBS = sharding('  params: {"fc1.weight": [data, null], "fc2.weight": [null, data]}') + (
    ("batch_size: 64", "batch_size: 64\n  grad_accum: 2"),)  # (FSDP2 and reduce_whole_grads reduce once)
GPT_EMBED = (("    embed: fsdp\n", "    embed: data\n"),)  # every embed dimension split over data
MLP_INPUTS = sharding("  inputs: {x: [data, tensor], y: [null]}")
GPT_INPUTS = (("    mlp: tensor\n", "    mlp: tensor\n  inputs: {tokens: [data, fsdp]}\n"),)
CASES = [
    (MLP, MLP_GLOBS, "four", "params: globs over data=4, 2 micro-batches"),
    (GPT, GPT_EMBED, "data=2", "params: embed ruled to data=2 (blocks, tied table)"),
    (MLP, MLP_INPUTS, "data=2,tensor=2", "inputs: x [data, tensor], y [-] on data=2 x tensor=2"),
    (GPT, GPT_INPUTS, "data=2,fsdp=2", "inputs: tokens [data, fsdp] (sequence split) on data=2 x fsdp=2"),
]
CKPT = 1  # the case that also checkpoints at HALF and resumes


def ckpt(case: int) -> tuple:
    path = build(CASES[case][0], CASES[case][2], CASES[case][1]).parent / f"ckpt-layouts-{case}"
    return ("--checkpoint-dir", str(path), "--checkpoint-every", str(HALF)) if case == CKPT else ()


@pytest.fixture(scope="module")
def runs():
    """(one-process run, parallel run) per case, two processes at a time (memoised)."""
    jobs = []
    for i, (spec, edits, mesh, _) in enumerate(CASES):
        jobs += [(build(spec, "data=1", edits), "--steps", str(N), {}),
                 (build(spec, mesh, edits), "--steps", str(N), *ckpt(i), {})]
    out = run_many(jobs)
    return [(out[2 * i], out[2 * i + 1]) for i in range(len(CASES))]


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES)), ids=[c[3].split(":")[0] + "-" + c[2] for c in CASES])
def test_equals_one_process_and_holds_the_plan(runs, i):
    spec, edits, mesh, what = CASES[i]
    plan = compile_file(spec_variant(spec, edits), mesh).plan
    if what.startswith("params"):  # the case this test is about
        assert any("data" in d for p in plan.params for d in p.spec)
        assert "FSDP2 over `data`" in program_text(build(spec, mesh, edits))
    else:
        assert "relayout(batch, mesh)" in program_text(build(spec, mesh, edits))
    ref, par = runs[i]
    dl, dp = max_diff(par.losses, ref.losses), max_param_diff(par.params, ref.params)
    report(f"torch layouts {what}", max_dloss=dl, max_dparam=dp, steps=N)
    assert len(par.losses) == N and dl < 1e-5 and dp < 1e-5, (dl, dp)
    m = plan.memory
    planned = {"params": m.params, "grads": m.grads, "optimizer": m.optimizer, "buffers": m.buffers}
    assert par.memory["planned"] == planned
    for rank, held in enumerate(par.memory["ranks"]):
        assert held == planned, f"{what}, rank {rank}: holds {held}, plan says {planned}"


@pytest.mark.slow
def test_data_split_parameters_resume_exactly(runs):
    spec, edits, mesh, what = CASES[CKPT]
    full = runs[CKPT][1]
    saved = ckpt(CKPT)[1]
    resumed = run(build(spec, mesh, edits), "--steps", str(N), "--resume", f"{saved}/step_{HALF:08d}")
    assert "resumed from" in resumed.output
    d, dp = max_diff(resumed.losses, full.losses[HALF:]), max_param_diff(resumed.params, full.params)
    report(f"torch layouts resume {what} at step {HALF}", max_dloss=d, max_dparam=dp)
    assert d < 1e-6 and dp < 1e-6, (d, dp)


def e049(spec, mesh, edits=()) -> list[str]:
    c = compile_file(spec_variant(spec, edits), mesh)
    return [d.message + " | " + (d.help or "") for d in check_target(c.plan, c.doc, "torch") if d.code == "E049"]


def test_what_stays_e049():
    for spec, edits, mesh, _ in CASES:
        assert e049(spec, mesh, edits) == []
    # parameters split over data with another axis FSDP2 would shard over, or ZeRO
    msg, = e049(MLP, "data=2,fsdp=2", MLP_GLOBS)
    assert "parameters split over the `data` axis (`fc1.weight` is laid out as [data,fsdp, -]) with an `fsdp` axis" in msg
    zero = MLP_GLOBS + (("clip_grad_norm: 1.0", "clip_grad_norm: 1.0\n  zero: 1"),)
    msg, = e049(MLP, "four", zero)
    assert "with `training.zero: 1`" in msg
    # a compute dtype other than the parameters': FSDP2 casts only what it shards
    mixed = MLP_GLOBS + (("seed: 0", "seed: 0\n  precision: {params: float32, compute: bfloat16}"),)
    msg, = e049(MLP, "four", mixed)
    assert "`fc1.bias` [256] stays whole over data=4 (not split over it)" in msg
    # gradient compression: FSDP2's reduce dtype, but the parameters left whole are reduced apart from it
    msg, = e049(MLP, "four", MLP_GLOBS + (("\ndata:", "\ncommunication: {compression: bf16}\ndata:"),))
    assert "`bf16` compression with `fc1.bias` whole over data" in msg
    # an input layout whose mesh axes are out of the mesh's order on one dimension
    msg, = e049(MLP, "data=2,tensor=2", sharding("  inputs: {x: [[tensor, data], null]}"))
    assert "the layout [tensor,data, -] of input `x`" in msg and "mesh's order" in msg
    # an input layout in a pipeline
    piped = (("  rules:", "  inputs: {tokens: [data, tensor]}\n  rules:"),)
    assert any("of input `tokens` with a `pipe` axis" in m for m in e049(SPECS / "gpt-pipe.yaml", None, piped))
