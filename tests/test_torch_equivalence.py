"""The PyTorch target's central proofs, with gloo ranks on CPU.

Equivalence: for every example and every parallelism kind (DDP over data, FSDP2 over fsdp, HSDP over
data x fsdp, tensor parallelism alone and with the data axes, sequence parallelism, and the 3-D
data x fsdp x tensor mesh on 8 ranks), the program built for the parallel mesh and the program built
for one process (`--mesh data=1`) give the same loss trajectory (float32, max abs difference below 1e-5).

Planner truth: the per-rank bytes of parameters, gradients and optimizer state that `mithril-spec plan`
predicts equal what every rank of the running program holds after its first step (local shards of
every parameter and gradient; the optimizer's slot tensors, not its scalar `step`; docs/program.md
"Memory report").
"""

from __future__ import annotations

import pytest
from torch_runs import (
    EQUIVALENCE,
    SPECS,
    build,
    equivalence_jobs,
    max_diff,
    max_param_diff,
    parallel,
    reference,
    report,
    run,
    run_many,
    spec_variant,
    steps,
)

from mithril_spec.frontend import compile_file


def case_id(case):
    spec, mesh, edits, _ = case
    return f"{spec.split('.')[0]}-{mesh or 'default'}{'-sp' if edits else ''}".replace(",", "_").replace("=", "")


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    """Every run of this module, two at a time (each is memoised for the other tests)."""
    run_many(equivalence_jobs())


def _run(job):
    kw = job[-1]
    return run(*job[:-1], **kw)


@pytest.mark.slow
@pytest.mark.parametrize("case", EQUIVALENCE, ids=case_id)
def test_equivalence(case):
    spec, mesh, edits, what = case
    ref, par = run(*reference(spec)), _run(parallel(spec, mesh, edits))
    n = steps(spec)
    assert len(par.losses) == len(ref.losses) == n >= 5
    assert [r["step"] for r in par.metrics] == list(range(1, n + 1))
    dl = max_diff(par.losses, ref.losses)
    dg = max_diff(par.grad_norms, ref.grad_norms)
    dp = max_param_diff(par.params, ref.params)
    report(f"torch equivalence {spec} {what}", max_dloss=dl, max_dgrad_norm=dg, max_dparam=dp, steps=n,
           seconds=round(par.seconds, 1))
    assert dl < 1e-5, f"{spec} on {what}: losses differ from one process by {dl:.2e}"
    assert dg < 1e-4 and dp < 1e-4, (dg, dp)
    assert "terminate called" not in par.output and "Traceback" not in par.output


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in EQUIVALENCE if not c[2]] + [("x", "data=1", (), "one process")],
                         ids=lambda c: case_id(c) if c[0] != "x" else "one-process")
def test_planner_truth(case):
    """Predicted per-rank bytes == what each rank holds (every rank: the layouts here are even)."""
    spec, mesh, edits, what = case
    if spec == "x":  # the one-process builds of every example
        for s in sorted({c[0] for c in EQUIVALENCE}):
            _check_truth(s, "data=1", run(*reference(s)).memory, "one process")
        return
    _check_truth(spec, mesh, _run(parallel(spec, mesh, edits)).memory, what)


def _check_truth(spec, mesh, memory, what):
    plan = compile_file(SPECS / spec, mesh).plan.memory
    predicted = {"params": plan.params, "grads": plan.grads, "optimizer": plan.optimizer, "buffers": plan.buffers}
    assert memory["planned"] == predicted  # the program carries the plan's numbers
    for rank, held in enumerate(memory["ranks"]):
        assert held == predicted, f"{spec} on {what}, rank {rank}: holds {held}, plan says {predicted}"
    report(f"torch planner truth {spec} {what}", ranks=len(memory["ranks"]), **predicted)


# Variants of gpt-tiny, each against its own one-process build:
# - parameters no dimension of which the fsdp axis divides: the plan keeps them whole (FSDP2 would pad them
#   onto every rank). An odd width (layer norms, attention projections, the mlp's output bias) on fsdp=2;
#   ff 390 on fsdp=2 x tensor=2 (the mlp's input bias, split over tensor, is not split further: 195 is odd);
# - vocab-parallel: the embedding table split on its rows over `tensor` and the logits on the vocabulary
#   into loss_parallel's cross-entropy, tied (fsdp=2 x tensor=2) and untied (tensor=2 alone, no FSDP2).
VOCAB = ("    mlp: tensor\n", "    mlp: tensor\n    vocab: tensor\n")
VARIANTS = [
    ((("d: 128, heads: 4, ff: 512", "d: 99, heads: 3, ff: 396"), ("    embed: fsdp\n", "")), "fsdp=2",
     "blocks.0.attn.q.weight", "odd-width-fsdp2"),
    ((("ff: 512", "ff: 390"),), "fsdp_tp", "blocks.0.mlp.fc.bias", "ff390-fsdp2-tensor2"),
    ((VOCAB,), "fsdp_tp", "wte.weight", "vocab-parallel-tied-fsdp2-tensor2"),
    ((VOCAB, ("bias: false, tie: wte}", "bias: false, axis: vocab}")), "tensor=2", "lm_head.weight",
     "vocab-parallel-untied-tensor2"),
]


@pytest.mark.slow
@pytest.mark.parametrize("edits, mesh, example, what", VARIANTS, ids=[v[-1] for v in VARIANTS])
def test_variants(edits, mesh, example, what):
    """The run equals one process, and every rank holds the planned bytes."""
    spec = spec_variant(SPECS / "gpt-tiny.yaml", edits)
    plan = compile_file(spec, mesh).plan
    layout = plan.param(example).spec
    if what.startswith("vocab"):  # the case this test is about
        assert ("tensor",) in layout, layout
    else:
        assert not any("fsdp" in d for d in layout), layout
    n = 6
    ref, par = run_many([(build(spec, "data=1"), "--steps", str(n), {}), (build(spec, mesh), "--steps", str(n), {})])
    dl = max_diff(par.losses, ref.losses)
    dp = max_param_diff(par.params, ref.params)
    report(f"torch equivalence gpt-tiny {what}", max_dloss=dl, max_dparam=dp, steps=n)
    assert len(par.losses) == n and dl < 1e-5 and dp < 1e-4, (dl, dp)
    m = plan.memory
    predicted = {"params": m.params, "grads": m.grads, "optimizer": m.optimizer, "buffers": m.buffers}
    for rank, held in enumerate(par.memory["ranks"]):
        assert held == predicted, f"rank {rank}: holds {held}, plan says {predicted}"
