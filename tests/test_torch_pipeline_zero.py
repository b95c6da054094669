"""ZeRO in a PyTorch pipeline (issue 40, item 1; docs/program.md "ZeRO and master weights").

specs/gpt-pipe.yaml with `training.zero: 1` and `2` on pipe=2 x data=2 (4 ranks, 1f1b): the stages are
replicated over `data` without FSDP2, the program reduces their gradients itself (ZeRO-1: all-reduced then
sliced; ZeRO-2: reduce-scattered) and each data rank updates its slice of every parameter. The losses and
gradient norms of 3 steps equal the one-device build's (1e-5), every rank holds the bytes the plan
predicts (the optimizer state halved; ZeRO-2 the gradients too), and a resume from the step-2 checkpoint
gives the uninterrupted step 3. The JAX target runs it too (tests/test_jax_pipeline_zero.py).
"""

from __future__ import annotations

import concurrent.futures

import jax_runs as jr
import pytest
import torch_runs as tr

from mithril_spec.frontend import compile_file
from mithril_spec.lowering import check_target

GPT_PIPE = tr.SPECS / "gpt-pipe.yaml"
ZERO = {z: (("  seed: 0\n", f"  seed: 0\n  zero: {z}\n"),) for z in (1, 2)}
STEPS = ("--steps", "3")


def test_zero_with_a_pipeline_runs_in_torch_and_jax():
    c = compile_file(jr.spec_variant(GPT_PIPE, ZERO[1]), "pipe=2,data=2")
    for target in ("torch", "jax"):
        assert [d for d in check_target(c.plan, c.doc, target) if d.code == "E049"] == [], target
    # what the jax program holds (Plan.memory_for): the optimizer state half of the build's without ZeRO
    without = compile_file(GPT_PIPE, "pipe=2,data=2").plan.memory_for("jax")
    held = c.plan.memory_for("jax")
    assert (held.params, held.optimizer * 2) == (without.params, without.optimizer), (held, without)


@pytest.mark.slow
@pytest.mark.parametrize("zero", [1, 2])
def test_zero_in_a_pipeline_equals_one_device_and_holds_the_planned_bytes(zero, tmp_path):
    ck = tmp_path / "ckpt"
    program = tr.build(GPT_PIPE, "pipe=2,data=2", ZERO[zero])
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        ref = pool.submit(tr.run, tr.build(GPT_PIPE, "single"), *STEPS)
        got = pool.submit(tr.run, program, *STEPS, "--checkpoint-dir", str(ck), "--checkpoint-every", "1")
        ref, got = ref.result(), got.result()
    resumed = tr.run(program, *STEPS, "--resume", str(ck / "step_00000002"), export=False)
    figures = {"loss": jr.max_diff(got.losses, ref.losses), "grad_norm": jr.max_diff(got.grad_norms, ref.grad_norms),
               "resumed step 3": abs(resumed.losses[-1] - got.losses[-1])}
    assert max(figures.values()) < 1e-5, figures
    assert [r["step"] for r in resumed.metrics] == [3]
    memory = got.memory
    assert all(rank == memory["planned"] for rank in memory["ranks"][:2]), memory  # pipe rank 0's data ranks
    whole = tr.run(tr.build(GPT_PIPE, "pipe=2,data=2"), "--steps", "1", export=False).memory["device0"]
    assert memory["device0"]["optimizer"] * 2 == whole["optimizer"], (memory, whole)
    assert memory["device0"]["grads"] * (2 if zero == 2 else 1) == whole["grads"], (memory, whole)
    jr.report(f"torch pipeline zero {zero}", max_differences=figures, device0=memory["device0"],
              without_zero=whole)
