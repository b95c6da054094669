"""A linear layer tied to an embedding on another pipeline stage (torch; GPT-2's `lm_head` tied to `wte`):
the first stage holds the table, the last a copy of it under the same name, initialised as it; after the
backward pass the two pipe ranks of each replica sum the table's gradient (Megatron's embedding group), so
both copies take the same update. Each mesh (1F1B on pipe=2, pipe=2 x data=2, vocab-parallel on
pipe=2 x tensor=2, and pipe=4) equals the one-process build at the gradient level (docs/program.md "Equivalence": the
first step's gradients, by canonical name: one `wte.weight`) and in its plain-SGD losses. Also: a pipe=2
checkpoint (one table under its canonical name) resumed on one process follows the one-process run, the plan
counts the copy on the last pipe rank (what each rank holds), the dry run lays it out there, and generate.py
of the pipelined build samples the one-process tokens."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from gradients import assert_same_gradients
from torch_runs import PY, SPECS, WORK, build, max_diff, max_param_diff, report, run, run_many

GPT = SPECS / "gpt-pipe.yaml"
# a tiny GPT (2 blocks) whose output layer reads the token embedding's table, trained with plain SGD
TIED = (("name: lm_head, dimension: vocab, bias: false}", "name: lm_head, dimension: vocab, bias: false, tie: wte}"),
        ("layers: 4}", "layers: 2}"),
        ("{name: adamw, lr: 1.0e-3, betas: [0.9, 0.95], weight_decay: 0.1}", "{name: sgd, lr: 0.1}"),
        ("clip_grad_norm: 1.0", "clip_grad_norm: 0.5"))  # (the gradient norms are 0.6 to 0.9: every step clips)
# the table split on its rows over `tensor` (vocab-parallel): the last stage's copy too
VOCAB = TIED + (("    mlp: tensor\n", "    mlp: tensor\n    vocab: tensor\n"),)
TIED4 = tuple(e for e in TIED if e[0] != "layers: 4}")  # 4 blocks, one per stage on pipe=4
ARGS = ("--steps", "3", "--export-grads", "grads.npz")
CKPT = WORK / "ckpt-gpt-tied-pipe2"
CASES = {  # what -> (mesh, edits, extra arguments)
    "1f1b pipe=2": ("pipe=2", TIED, ("--checkpoint-dir", str(CKPT), "--checkpoint-every", "2")),
    "1f1b pipe=2 x data=2": ("pipe=2,data=2", TIED, ()),
    "1f1b pipe=2 x tensor=2, vocab-parallel": ("pipe=2,tensor=2", VOCAB, ()),
    # the table on pipe rank 0, its copy on rank 3: a group of 2 of the 4 pipe ranks
    "1f1b pipe=4": ("pipe4", TIED4, ()),
}


def one_process(edits):
    return run(build(GPT, "single", edits), *ARGS)


def pipelined(what):
    mesh, edits, extra = CASES[what]
    return run(build(GPT, mesh, edits), *ARGS, *extra)


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    run_many([(build(GPT, "single", e), *ARGS) for e in (TIED, VOCAB, TIED4)]
             + [(build(GPT, mesh, edits), *ARGS, *extra) for mesh, edits, extra in CASES.values()])


@pytest.mark.slow
@pytest.mark.parametrize("what", list(CASES))
def test_tied_table_across_stages_equals_one_process(what):
    mesh, edits, _ = CASES[what]
    one, pipe = one_process(edits), pipelined(what)
    grads = [dict(np.load(r.cwd / "grads.npz")) for r in (one, pipe)]
    assert "wte.weight" in grads[1] and not any(k.startswith("lm_head") for k in grads[1])  # one table
    dg = assert_same_gradients(*grads, 1e-5, f"tied {what}")
    dl, dn = max_diff(pipe.losses, one.losses), max_diff(pipe.grad_norms, one.grad_norms)
    dp = max_param_diff(pipe.params, one.params)
    report(f"torch pipeline tied embedding {what} vs 1 process", max_rel_dgrad=dg, max_dloss=dl, max_dgrad_norm=dn,
           max_dparam=dp)
    assert dl < 1e-5, (pipe.losses, one.losses)
    # the norm counts the table once (counting the copy too, it would be larger, and scale every update
    # otherwise: each step clips)
    assert dn < 1e-5 and dp < 1e-5, (dn, dp)
    # the plan counts the copy on the last pipe rank: each rank holds what the plan says its pipe rank holds
    plan = json.loads((build(GPT, mesh, edits) / "plan.json").read_text())
    per_pipe = len(pipe.memory["ranks"]) // len(plan["costs"]["stages"])
    for r, held in enumerate(pipe.memory["ranks"]):
        planned = plan["costs"]["stages"][r // per_pipe]["states"]
        assert {k: held[k] for k in ("params", "grads")} == {k: planned[k] for k in ("params", "grads")}, (r, held)
    assert "tied table gradient all-reduce (pipeline)" in json.dumps(plan["costs"])


@pytest.mark.slow
def test_tied_checkpoint_resumes_on_one_process():
    """The pipe=2 run's step-2 checkpoint holds one `wte.weight`; one process resumes it to step 3 as the
    one-process run trains."""
    pipelined("1f1b pipe=2")
    one = one_process(TIED)
    resumed = run(build(GPT, "single", TIED), "--steps", "3", "--resume", str(CKPT / "step_00000002"))
    dp = max_param_diff(resumed.params, one.params)
    report("torch pipeline tied embedding: pipe=2 checkpoint resumed on 1 process", max_dparam=dp)
    assert dp < 1e-5 and abs(resumed.losses[-1] - one.losses[-1]) < 1e-5


@pytest.mark.runs
def test_dry_run_lays_the_copy_out_on_the_last_pipe_rank():
    program = build(GPT, "pipe=2", TIED)
    out = subprocess.run([PY, str(program / "train.py"), "--dry-run"], capture_output=True, text=True, check=True,
                         cwd=WORK).stdout
    ranks = [json.loads(line.split("bytes: ", 1)[1]) for line in out.splitlines() if line.startswith("rank ")]
    plan = json.loads((program / "plan.json").read_text())
    assert [r["params"] for r in ranks] == [st["states"]["params"] for st in plan["costs"]["stages"]]
    table = 256 * 64 * 4  # vocab x d, float32: on both pipe ranks
    assert ranks[1]["params"] - table == plan["pipeline"]["stages"][1]["params"] * 4


@pytest.mark.slow
def test_generate_py_of_the_tied_pipeline_samples_the_one_process_tokens():
    """generate.py of the pipe=2 build (the head on the last stage, its table loaded there by name) draws the
    one-process build's greedy tokens from the same parameters, its cached decode checked (--check) against
    its forward pass through the stages."""
    from test_generate import _generate

    params = str(one_process(TIED).cwd / "params.npz")
    greedy = ("--params", params, "--prompt-ids", "1,2,3", "--temperature", "0", "--check", "--json")
    want, got = _generate("torch", build(GPT, "single", TIED), greedy), _generate("torch", build(GPT, "pipe=2", TIED),
                                                                                 greedy, 2)
    assert want["rc"] == 0 and got["rc"] == 0, got["stderr"][-3000:]
    assert got["json"]["new_ids"] == want["json"]["new_ids"] and len(set(want["json"]["new_ids"])) > 1
