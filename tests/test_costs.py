"""The cost model against published formulas: ZeRO model-state memory (Rajbhandari et al. 2020), transformer
activation memory (Korthikanti et al. 2022), Megatron tensor-parallel and data-parallel communication, FLOPs,
the pipeline bubble; hardware profiles, step time and the E050 fit check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mithril_spec import cli
from mithril_spec.diagnostics import DiagnosticError
from mithril_spec.extends import load_spec_file
from mithril_spec.frontend import compile_document, compile_file
from mithril_spec.graph import RepeatNode
from mithril_spec.overrides import apply as apply_settings
from mithril_spec.planner.costs import (
    CostOptions, estimate, estimate_remats, pipeline_bubble, ring_time, state_memory,
)
from mithril_spec.planner.hardware import BUILTIN, intra_node, link, lookup
from mithril_spec.planner.mesh import UsageError
from mithril_spec.planner.plan import make_plan

ROOT = Path(__file__).resolve().parent.parent
COST_SPECS = Path(__file__).parent / "specs" / "cost"
ZERO = COST_SPECS / "zero.yaml"
KORTH = COST_SPECS / "gpt-korthikanti.yaml"
KORTH_SP = COST_SPECS / "gpt-korthikanti-sp.yaml"
PIPE_MOE = COST_SPECS / "gpt-pipe-moe.yaml"


def plan_for(path, mesh=None, **training):
    c = compile_file(path, mesh)
    if not training:
        return c.plan
    tr = c.spec.training.model_copy(update=training)
    spec = c.spec.model_copy(update={"training": tr})
    return make_plan(spec, c.doc, c.graph, mesh)


def states(plan) -> int:
    st = estimate(plan).worst.states
    return st.params + st.grads + st.optimizer


# ---------------------------------------------------------------- ZeRO model states


N = 64


@pytest.fixture(scope="module")
def psi() -> int:
    return compile_file(ZERO).plan.param_count


def test_mixed_precision_adam_is_16_bytes_per_parameter(psi):
    """2 (fp16/bf16 params) + 2 (grads) + K=12 (fp32 master weights, momentum, variance)."""
    plan = plan_for(ZERO)
    st = estimate(plan).worst.states
    assert (st.params, st.grads, st.master, st.moments) == (2 * psi, 2 * psi, 4 * psi, 8 * psi)
    assert states(plan) == 16 * psi


@pytest.mark.parametrize("stage,coefficient", [
    (0, 2 + 2 + 12),  # baseline (2 + 2 + K) psi
    (1, 2 + 2 + 12 / N),  # P_os: (2 + 2 + K/N) psi
    (2, 2 + (2 + 12) / N),  # P_os+g: (2 + (2 + K)/N) psi
])
def test_zero_stages_1_and_2(psi, stage, coefficient):
    plan = plan_for(ZERO, zero=stage)
    assert states(plan) == pytest.approx(coefficient * psi, rel=0, abs=0.5)
    # the plan's own per-device memory agrees with the cost model
    m = plan.memory
    assert m.params + m.grads + m.optimizer == states(plan)


def test_zero_stage_3_is_the_fsdp_axis(psi):
    """P_os+g+p: (2 + 2 + K) psi / N."""
    plan = plan_for(ZERO, "fsdp=64")
    assert states(plan) == 16 * psi // N


def test_published_zero_table_for_7_5b_parameters_on_64_devices(psi):
    """Rajbhandari et al., Figure 1: 7.5B parameters, N=64 -> 120 GB, 31.4 GB, 16.6 GB, 1.88 GB."""
    per_param = [states(plan_for(ZERO, zero=z)) / psi for z in (0, 1, 2)] + [states(plan_for(ZERO, "fsdp=64")) / psi]
    gb = [round(c * 7.5e9 / 1e9, 2) for c in per_param]
    assert gb == [120.0, 31.41, 16.64, 1.88]


def test_zero_communication(psi):
    """Data parallelism: one gradient all-reduce (2 psi bytes, ring 2(N-1)/N); ZeRO-1/2: reduce-scatter
    plus all-gather of the same volume; ZeRO-3: parameter all-gathers in forward and backward and a
    gradient reduce-scatter, 1.5x the data-parallel volume (the ZeRO paper's 3 psi)."""
    c0 = estimate(plan_for(ZERO))
    (ar,) = [c for c in c0.collectives if c.what.startswith("gradient all-reduce")]
    assert (ar.kind, ar.axes, ar.bytes, ar.count) == ("all-reduce", ("data",), 2 * psi, 1)
    assert ar.wire_bytes == pytest.approx(2 * (N - 1) / N * 2 * psi)
    for z in (1, 2):
        cz = estimate(plan_for(ZERO, zero=z))
        kinds = {(c.kind, c.axes): c.total_bytes for c in cz.collectives if not c.blocking}
        assert kinds == {("reduce-scatter", ("data",)): 2 * psi, ("all-gather", ("data",)): 2 * psi}
    c3 = estimate(plan_for(ZERO, "fsdp=64"))
    gathers = sum(c.total_bytes for c in c3.collectives if c.kind == "all-gather")
    scatters = sum(c.total_bytes for c in c3.collectives if c.kind == "reduce-scatter")
    assert (gathers, scatters) == (2 * 2 * psi, 2 * psi)
    assert sum(c.wire_bytes for c in c3.collectives if not c.blocking) == pytest.approx(
        1.5 * sum(c.wire_bytes for c in c0.collectives if not c.blocking), rel=1e-6)


def test_sgd_and_fp32_optimizer_state():
    c = compile_file(ROOT / "specs" / "cnn-dp.yaml")  # sgd with momentum, fp32: 4 + 4 + 4 bytes per parameter
    st = estimate(c.plan).worst.states
    n = c.plan.param_count
    assert (st.params, st.grads, st.master, st.moments) == (4 * n, 4 * n, 0, 4 * n)
    adam = estimate(compile_file(ROOT / "specs" / "mlp-dp.yaml").plan).worst.states
    assert adam.moments == 2 * adam.params and adam.master == 0


# ---------------------------------------------------------------- activations (Korthikanti et al. 2022)

s, b, h, a, t, L = 512, 4, 1024, 16, 4, 2


def without_attention_dropout(path, mesh):
    """The layer with the attention's `dropout: 0.1` set to 0 (`--set`): the paper's 2as/h variant."""
    doc = apply_settings(load_spec_file(path), ["model.blocks.layer.1.dropout=0"])
    return compile_document(doc, mesh).plan


def per_layer(plan, remat="none") -> int:
    acts = estimate(plan, options=CostOptions(remat=remat)).worst.activations
    (blocks,) = acts.blocks
    assert blocks.count == L
    return blocks.per_copy - (blocks.scores if remat == "selective" else 0)


def test_activations_without_parallelism():
    """sbh(34 + 5as/h) bytes per layer (the spec's attention drops out its probabilities)."""
    plan = plan_for(KORTH, "single")
    assert per_layer(plan) == s * b * h * 34 + 5 * a * s * s * b
    assert per_layer(plan) == s * b * h * (34 + 5 * a * s / h)


def test_activations_without_attention_dropout():
    """No dropout on the attention probabilities: the softmax output (2as^2b) is all the scores keep."""
    assert per_layer(without_attention_dropout(KORTH, "single")) == s * b * h * (34 + 2 * a * s / h)
    assert per_layer(without_attention_dropout(KORTH, "tp")) == s * b * h * (10 + 24 / t + 2 * a * s / (h * t))


def test_activations_with_tensor_parallelism():
    """sbh(10 + 24/t + 5as/(ht))."""
    plan = plan_for(KORTH, "tp")
    assert per_layer(plan) == s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def test_activations_with_tensor_and_sequence_parallelism():
    """sbh(34/t + 5as/(ht)); selective recompute drops the attention scores: sbh(34/t)."""
    plan = plan_for(KORTH_SP, "tp")
    assert per_layer(plan) == s * b * h * (34 / t + 5 * a * s / (h * t))
    assert per_layer(plan, "selective") == s * b * h * 34 / t


def test_activations_selective_and_full_recompute_totals():
    plan = plan_for(KORTH_SP, "tp")
    by = estimate_remats(plan)
    none, sel, full = (by[r].worst.activations for r in ("none", "selective", "full"))
    scores = 5 * a * s * s * b // t
    assert none.saved - sel.saved == L * scores
    # full: each layer keeps only its input (2sbh, split over the sequence); one layer is rebuilt at a time
    (blk,) = full.blocks
    assert blk.checkpoint == 2 * s * b * h // t
    assert full.recompute == blk.per_copy
    assert full.saved == none.saved - L * blk.per_copy + L * blk.checkpoint
    assert full.saved < sel.saved < none.saved  # (with 2 layers, one rebuilt layer outweighs the saving)


def test_pipeline_holds_activations_of_micro_batches_in_flight():
    plan = plan_for(PIPE_MOE)
    c = estimate(plan)
    r0, r1 = c.stages
    assert (r0.in_flight, r1.in_flight) == (2, 1)  # 1F1B: p - rank
    assert r0.layers[:2] == ("wte", "wpe") and r1.layers[-1] == "lm_head"
    assert plan.pipeline.bubble == pipeline_bubble(2, 4) == pytest.approx(1 / 5)
    # the torch program: every parameter is on exactly one rank (the planner's stage split)
    t0, t1 = estimate(plan, options=CostOptions(target="torch")).stages
    st = state_memory(plan)
    assert st.params == max(t0.states.params, t1.states.params)
    total = sum(p.local_bytes for p in plan.params)
    assert t0.states.params + t1.states.params == total
    assert any(x.kind == "send/recv" and x.axes == ("pipe",) for x in r0.collectives)
    # the spec's targets together (jax among them): each rank holds what the jax program holds
    # (Plan.memory_for: the layers outside the pipelined block on every rank), more than torch's fullest rank
    jax = plan.memory_for("jax")
    for r in (r0, r1):
        assert (r.states.params, r.states.optimizer, r.states.buffers) == (jax.params, jax.optimizer, jax.buffers)
    assert c.peak > estimate(plan, options=CostOptions(target="torch")).peak


def test_moe_dispatch_and_combine_are_all_to_alls_over_the_expert_axis():
    c = estimate(plan_for(PIPE_MOE, "nopipe"))
    a2a = [x for x in c.collectives if x.kind == "all-to-all"]
    assert a2a and all(x.axes == ("expert",) for x in a2a)
    # 4 layers x (dispatch + combine) x 4 micro-batches, forward and backward
    assert sum(x.count for x in a2a) == 4 * 2 * 4 * 2


# ---------------------------------------------------------------- tensor-parallel communication and FLOPs


def test_megatron_tensor_parallel_collectives():
    """Per layer exactly Megatron's 4: forward one all-reduce after attention and one after the MLP ([b, s, h]
    activations), backward one for each of their inputs (q, k and v are one matmul in the programs)."""
    plan = plan_for(KORTH, "tp")
    c = estimate(plan)
    act = b * s * h * 2
    fwd = {x.what: x for x in c.collectives if x.phase == "forward" and x.axes == ("tensor",)}
    assert fwd["tensor-parallel (attention) output all-reduce"].count == L
    assert fwd["tensor-parallel (mlp) output all-reduce"].count == L
    assert fwd["tensor-parallel (attention) output all-reduce"].bytes == act
    bwd = {x.what: x.count for x in c.collectives if x.phase == "backward"}
    assert bwd["tensor-parallel (attention) input-gradient all-reduce"] == L
    assert bwd["tensor-parallel (mlp) input-gradient all-reduce"] == L
    full = estimate(plan, options=CostOptions(remat="full"))
    rec = [x for x in full.collectives if x.phase == "recompute"]
    assert sum(x.count for x in rec) == 2 * L  # the forward all-reduces again, inside recompute


def test_sequence_parallel_swaps_all_reduce_for_gather_and_scatter():
    c = estimate(plan_for(KORTH_SP, "tp"))
    blocks = [x for x in c.collectives if "(attention)" in x.what or "(mlp)" in x.what]
    assert {x.kind for x in blocks} == {"all-gather", "reduce-scatter"}


def test_flops():
    plan = plan_for(KORTH, "tp")
    by = estimate_remats(plan)
    f = by["none"].flops
    fwd = plan.graph.flops_per_sample * plan.spec.training.batch_size
    assert (f.forward, f.backward, f.recompute) == (fwd, 2 * fwd, 0)
    hd = h // a
    assert by["selective"].flops.recompute == L * 2 * 2 * s * s * a * hd * b
    blocks = next(n for n in plan.graph.layers if isinstance(n, RepeatNode))
    assert by["full"].flops.recompute == blocks.flops * b
    # per device: the tensor-parallel layers split 4 ways
    assert f.per_device_forward < fwd / 2
    assert f.per_device_total == pytest.approx(3 * f.per_device_forward)


# ---------------------------------------------------------------- hardware and step time


def test_builtin_profiles_and_aliases():
    assert {"h100-sxm-80gb", "h200-141gb", "a100-80gb", "tpu-v5e", "cpu"} <= set(BUILTIN)
    assert lookup("H100").name == "h100-sxm-80gb" and lookup("v5e").memory_bytes == 16e9
    assert lookup("h200").memory_bytes == 141e9
    for hw in BUILTIN.values():
        if hw.name != "cpu":
            assert hw.peak_flops("bfloat16") >= hw.peak_flops("float32") > 0
        assert hw.intra_node_bytes_per_s > hw.inter_node_bytes_per_s
    with pytest.raises(UsageError, match="did you mean"):
        lookup("h10O")


def test_spec_hardware_profiles(tmp_path):
    text = (ROOT / "specs" / "mlp-dp.yaml").read_text() + (
        "hardware:\n"
        "  - {name: my-gpu, base: a100-80gb, memory_gb: 40}\n"
        "  - {name: tiny, flops: {float32: 1}, memory_gb: 0.001, devices_per_node: 4, intra_node_gb_per_s: 10,"
        " inter_node_gb_per_s: 1}\n"
        "  - {name: broken, memory_gb: 8}\n")
    spec = tmp_path / "hw.yaml"
    spec.write_text(text)
    c = compile_file(spec)
    mine = lookup("my-gpu", c.spec, c.doc)
    assert mine.memory_bytes == 40e9 and mine.flops == BUILTIN["a100-80gb"].flops
    tiny = lookup("tiny", c.spec, c.doc)
    assert tiny.peak_flops("float32") == 1e12 and tiny.devices_per_node == 4
    with pytest.raises(DiagnosticError) as e:
        lookup("broken", c.spec, c.doc)
    assert e.value.diagnostics[0].code == "E011" and "flops" in e.value.diagnostics[0].message


def test_innermost_axes_are_intra_node():
    plan = plan_for(ZERO, "data=16,tensor=8")
    hw = lookup("h100")
    assert intra_node(plan.mesh, ("tensor",), hw) and not intra_node(plan.mesh, ("data",), hw)
    assert link(plan.mesh, ("data", "tensor"), hw)[2] == "inter-node"
    assert ring_time("all-reduce", 1e9, 8, 100e9, 0) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)


def test_step_time_and_mfu():
    hw = lookup("h100")
    c = estimate(plan_for(KORTH, "tp"), hw)
    tm = c.time
    assert tm.compute_s == pytest.approx(c.flops.per_device_total / (hw.peak_flops("bfloat16") * hw.efficiency))
    assert tm.step_s >= tm.compute_s + tm.blocking_comm_s
    assert 0 < tm.mfu <= hw.efficiency
    assert tm.tokens_per_s == pytest.approx(b * s / tm.step_s)
    assert len(tm.collective_s) == len(c.collectives)
    pipe = estimate(plan_for(PIPE_MOE), hw).time
    assert pipe.bubble == pytest.approx(0.2)


def test_bubble_formula():
    assert pipeline_bubble(1, 8) == 0
    assert pipeline_bubble(4, 8) == pytest.approx(3 / 11)
    assert pipeline_bubble(4, 8, virtual=2) == pytest.approx(3 / 19)


# ---------------------------------------------------------------- the command line


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err, err
    return rc, out, err


BROKEN_FIT = Path(__file__).parent / "specs" / "broken" / "does_not_fit_memory.yaml"


def test_plan_hardware_that_does_not_fit_is_E050_with_hints(capsys):
    rc, out, err = run(capsys, "plan", BROKEN_FIT, "--mesh", "dp", "--hardware", "tpu-v5e", "--color", "never")
    assert rc == 1
    assert "error[E050]" in err and "predicted to fit" in err
    assert "`training.zero: 1`" in err and "--mesh fsdp=4" in err
    assert "DOES NOT FIT" in out
    rc, out, err = run(capsys, "plan", BROKEN_FIT, "--mesh", "sharded", "--hardware", "tpu-v5e")
    assert rc == 0 and "- fits" in out


def test_plan_json_carries_the_costs(capsys):
    rc, out, err = run(capsys, "plan", ROOT / "specs" / "gpt-tiny.yaml", "--format", "json", "--hardware", "h100")
    assert rc == 0
    j = json.loads(out)
    costs = j["costs"]
    assert set(costs) >= {"remat", "zero", "micro_batches", "local_batch", "peak_bytes", "stages", "collectives",
                          "comm_bytes", "flops", "hardware", "fits", "capacity_bytes", "time", "notes"}
    (st,) = costs["stages"]
    assert st["peak"] == costs["peak_bytes"] == (st["states"]["total"] + st["activations"]["total"] +
                                                 st["temporaries"]["total"])
    assert st["states"]["params"] == j["totals"]["per_device"]["params"]
    assert costs["fits"] is True and costs["time"]["step_s"] > 0
    assert costs["comm_bytes"] == sum(c["total_bytes"] for c in costs["collectives"])
    # without --hardware: no time, fits unknown
    rc, out, err = run(capsys, "plan", ROOT / "specs" / "gpt-tiny.yaml", "--format", "json")
    j = json.loads(out)
    assert j["costs"]["time"] is None and j["costs"]["fits"] is None and j["costs"]["hardware"] is None


def test_plan_text_prints_a_cost_summary(capsys):
    rc, out, err = run(capsys, "plan", ROOT / "specs" / "gpt-tiny.yaml", "--hardware", "a100")
    assert rc == 0
    assert "predicted memory per device" in out and "communication per step" in out
    assert "on a100-80gb: peak" in out and "predicted step time" in out and "MFU" in out


def test_unknown_hardware_is_a_usage_error(capsys):
    rc, out, err = run(capsys, "plan", ROOT / "specs" / "gpt-tiny.yaml", "--hardware", "nosuch")
    assert rc == 2 and "unknown profile" in err


def test_validate_checks_the_fit_of_every_named_mesh(capsys):
    rc, out, err = run(capsys, "validate", BROKEN_FIT, "--hardware", "tpu-v5e", "--format", "json")
    diags = json.loads(out)
    assert rc == 1 and [d["code"] for d in diags] == ["E050"] and "mesh `dp`" in diags[0]["message"]
    rc, out, err = run(capsys, "validate", ROOT / "specs", "--hardware", "h100")
    assert rc == 0
