"""Activation offload (`training.offload`): the plan's device and host bytes and transfer time, the targets'
E049s, and the programs: torch's saved-tensor hooks train exactly as without them and move the bytes the plan
predicts; jax and mlx refuse it (E049: XLA's host offload raised the device's peak on a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import jax_runs as jr
import pytest
import torch_runs as tr

from mithril_spec.frontend import compile_file
from mithril_spec.planner.costs import estimate
from mithril_spec.planner.hardware import BUILTIN, lookup
from mithril_spec.lowering import check_target

SPECS = Path(__file__).resolve().parent.parent / "specs"
MLP = SPECS / "mlp-dp.yaml"
# the MLP with gelu activations: each saves its input, as the plan counts (relu saves its output in torch)
GELU = (("op: relu, name: act1", "op: gelu, name: act1"), ("op: relu, name: act2", "op: gelu, name: act2"))


def offload(threshold: int, *more: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return GELU + (("  seed: 0\n", f"  seed: 0\n  offload: {{activations: true, threshold: {threshold}}}\n"),) + more


def compiled(edits, mesh="single"):
    return compile_file(jr.spec_variant(MLP, edits), mesh)


def test_plan_counts_host_and_device_bytes_and_the_transfer_time():
    # 64 samples per device: x [64, 64] (4,096 elements), fc1, act1, fc2, act2 [64, 256] (16,384 each), the
    # loss's float32 log-softmax [64, 10] (640): at a threshold of 5,000 the four [64, 256] tensors move
    c = compiled(offload(5000))
    plain = estimate(compiled(GELU).plan)
    costs = estimate(c.plan, BUILTIN["h100-sxm-80gb"])
    a = costs.worst.activations
    assert costs.offload_threshold == 5000
    assert a.saved == plain.worst.activations.saved == 4096 * 4 + 4 * 16384 * 4 + 640 * 4
    assert a.offloaded == a.offload_per_step == 4 * 16384 * 4
    assert a.total == a.saved - a.offloaded  # on the device: what stays
    assert costs.peak == plain.peak - a.offloaded
    assert costs.time.offload_s == pytest.approx(2 * a.offload_per_step / 55e9)
    assert costs.time.step_s == pytest.approx(estimate(compiled(GELU).plan, BUILTIN["h100-sxm-80gb"]).time.step_s
                                              + costs.time.offload_s)
    # at or above the threshold: a threshold of 16,384 still moves the [64, 256] tensors, 16,385 none
    assert estimate(compiled(offload(16384)).plan).worst.activations.offloaded == a.offloaded
    assert estimate(compiled(offload(16385)).plan).worst.activations.offloaded == 0
    # a profile's own host link (`host_gb_per_s`)
    profile_text = "data: {kind: synthetic}\nhardware:\n  - {name: slow, base: h100-sxm-80gb, host_gb_per_s: 10}"
    slow = compiled(offload(5000, ("data: {kind: synthetic}", profile_text)))
    profile = lookup("slow", slow.spec, slow.doc)
    assert profile.host_bytes_per_s == 10e9
    assert estimate(slow.plan, profile).time.offload_s == pytest.approx(2 * a.offload_per_step / 10e9)
    # two micro-batches of 32: half the bytes each, moved twice per step
    halves = estimate(compiled(offload(5000, ("  steps: 20\n", "  steps: 20\n  grad_accum: 2\n"))).plan)
    assert halves.worst.activations.offloaded == a.offloaded // 2
    assert halves.worst.activations.offload_per_step == a.offloaded


def test_targets_refuse_what_they_cannot_offload():
    c = compiled(offload(100))
    assert not check_target(c.plan, c.doc, "torch")
    (mlx,) = check_target(c.plan, c.doc, "mlx")
    assert mlx.code == "E049" and "activation offload" in mlx.message and "hooks" in mlx.help
    (jax,) = check_target(c.plan, c.doc, "jax")  # measured on a GPU: XLA's host offload raised the peak
    assert jax.code == "E049" and "activation offload" in jax.message and "raised the peak" in jax.help
    sel = compiled(offload(100, ("  seed: 0\n", "  seed: 0\n  remat: selective\n")))
    (why,) = check_target(sel.plan, sel.doc, "torch")
    assert "remat: selective" in why.message and "selective activation checkpointing" in why.help
    assert check_target(sel.plan, sel.doc, "jax")[0].code == "E049"


@pytest.fixture(scope="module")
def torch_runs():
    plain = tr.build(MLP, "single", GELU)
    moved = tr.build(MLP, "single", offload(100))
    return tr.run_many([(plain, "--steps", "3"), (moved, "--steps", "3")]), moved


@pytest.mark.runs
def test_torch_offload_under_full_remat_moves_the_block_inputs_as_planned():
    # torch.utils.checkpoint saves each block's input through the offload hooks; the blocks' own tensors are
    # recomputed in the backward pass (on the device); the layers outside the blocks offload theirs
    program = tr.build(SPECS / "gpt-tiny.yaml", "single", (
        ("  seed: 0\n", "  seed: 0\n  remat: full\n  offload: {activations: true, threshold: 4096}\n"),))
    run = tr.run(program, "--steps", "2")
    planned = json.loads((program / "plan.json").read_text())["costs"]["stages"][0]["activations"]
    assert planned["remat"] == "full" and planned["offload_per_step"] > 0
    assert [r["offloaded_bytes"] for r in run.metrics] == [planned["offload_per_step"]] * 2


@pytest.mark.runs
def test_torch_offload_trains_exactly_as_without_and_moves_the_planned_bytes(torch_runs):
    (plain, moved), program = torch_runs
    assert list(moved.losses) == list(plain.losses)  # the same numbers, bit for bit
    assert moved.params.keys() == plain.params.keys()
    assert all((moved.params[k] == plain.params[k]).all() for k in plain.params)
    planned = json.loads((program / "plan.json").read_text())["costs"]["stages"][0]["activations"]
    # every saved tensor of 100 elements or more: x, the four [64, 256] activations and the log-softmax
    assert planned["offload_per_step"] == 4096 * 4 + 4 * 16384 * 4 + 640 * 4
    assert [r["offloaded_bytes"] for r in moved.metrics] == [planned["offload_per_step"]] * 3
    tr.report("offload bytes (torch, mlp gelu, threshold 100)", measured=moved.metrics[0]["offloaded_bytes"],
              planned=planned["offload_per_step"])
