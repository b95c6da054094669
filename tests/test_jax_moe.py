"""Mixture of experts in the JAX target (templates/jax/ops.py.j2, `moe`), on 8 simulated CPU devices.

Equivalence: the moe-dp example with its experts split over `expert` and the batch over (data, expert)
gives the loss trajectory of the one-device build (max abs difference below 1e-5 over 5 steps, float32).
Also: parameter count and per-device bytes equal the plan's, the compiled step moves tokens with
all-to-all collectives over the expert axis (and gathers nothing), and the layer computes what
docs/program.md "Mixture of experts" says (a numpy re-implementation, with dropped tokens and ties).

Pipelined moe (templates/jax/pipeline.py.j2): moe-dp with a moe layer before and after its pipelined block
too, gpipe with 2 micro-batches on pipe=2 x expert=2 (the experts split over `expert` inside the stages, the
idle ticks' load-balancing losses masked), gives the loss trajectory of the one-stage build (its micro-batches
one after the other; 1e-5 over 3 steps, float32), whose loss holds the load-balancing losses (the build with
aux_loss_weight 0 differs).
"""

from __future__ import annotations

import concurrent.futures
import math
import re

import numpy as np
import pytest
from jax_runs import SPECS, WORKERS, build, max_diff, max_param_diff, report, run
from program_import import load_program

from mithril_spec.frontend import compile_file

MOE_DP = SPECS / "moe-dp.yaml"
STEPS = 5
MESHES = [(None, "data=2 x expert=4")]  # (expert=2 alone, with every training feature: the capability matrix)
# the default build also dumps its optimised HLO (compiled afresh: the persistent cache would skip it)
DUMP = {"XLA_FLAGS": "--xla_dump_to=hlo --xla_dump_hlo_as_text --xla_dump_hlo_module_re=train_step",
        "JAX_ENABLE_COMPILATION_CACHE": "false"}


# moe-dp pipelined: a moe layer before the pipelined block, two in it (one per copy), one after it
PIPELINED = (
    ("training:", "pipeline: {microbatches: 4, schedule: 1f1b}\n\ntraining:"),
    ("- {repeat: layers, block: decoder, name: blocks}\n    - {op: layer_norm, name: ln_f}",
     "- {op: moe, name: pre_moe, experts: experts, top_k: 1, hidden: ff, aux_loss_weight: 0.01}\n"
     "    - {repeat: layers, block: decoder, name: blocks}\n"
     "    - {op: moe, name: post_moe, experts: experts, top_k: 2, hidden: ff, aux_loss_weight: 0.01}\n"
     "    - {op: layer_norm, name: ln_f}"),
)
PIPE_GPIPE = (("{microbatches: 4, schedule: 1f1b}", "{microbatches: 2, schedule: gpipe}"),)
NO_AUX = (("aux_loss_weight: 0.01", "aux_loss_weight: 0.0"),)  # every moe layer's
PIPE_STEPS = 3
# (1f1b, with moe inside the pipelined block and every training feature: the capability matrix's pipe row)
PIPE_CASES = [("gpipe", "pipe=2,expert=2", PIPE_GPIPE)]


def pipelined(mesh, edits=()):
    return run(build(MOE_DP, mesh, PIPELINED + edits), "--steps", str(PIPE_STEPS))


def reference():
    return run(build(MOE_DP, "single"), "--steps", str(STEPS))


def parallel(mesh):
    return run(build(MOE_DP, mesh), "--steps", str(STEPS), env=DUMP if mesh is None else None)


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(lambda f: f(), [reference] + [lambda m=m: parallel(m) for m, _ in MESHES]
                      + [lambda e=e: pipelined("single", e) for e in ((), NO_AUX)]
                      + [lambda c=c: pipelined(c[1], c[2]) for c in PIPE_CASES]))


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES, ids=[m[1].replace(" ", "") for m in MESHES])
def test_expert_parallel_equals_one_device(mesh):
    ref, par = reference(), parallel(mesh[0])
    dl = max_diff(par.losses, ref.losses)
    dp = max_param_diff(par.params, ref.params)
    report(f"moe {mesh[1]} vs 1 device", max_dloss=dl, max_dparam=dp, steps=STEPS)
    assert len(par.losses) == STEPS and dl < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [None, "single"])
def test_parameter_count_and_bytes_are_the_plans(mesh):
    plan = compile_file(MOE_DP, mesh).plan
    got = reference() if mesh == "single" else parallel(mesh)
    assert sorted(got.params) == sorted(p.name for p in plan.params)
    assert sum(a.size for a in got.params.values()) == plan.param_count == 175_744
    held = got.memory["device0"]
    assert held["params"] == plan.memory.params and held["optimizer"] == plan.memory.optimizer


@pytest.mark.slow
def test_tokens_travel_by_all_to_all_over_expert():
    (path,) = (parallel(None).cwd / "hlo").glob("*train_step*after_optimizations.txt")
    text = path.read_text()
    groups = []
    for line in text.splitlines():
        m = re.search(r"= .*? all-to-all(-start)?\(.*replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", line)
        if m:
            sizes = {k.strip("'"): int(v) for k, v in (kv.split("=") for kv in m.group(2).split(","))}
            groups.append(math.prod(sizes[a.strip().strip("'")] for a in m.group(3).split(",")))
    report("moe collectives data=2 x expert=4", all_to_all=len(groups),
           all_gather=len(re.findall(r" all-gather(-start)?\(", text)))
    # (dispatch, combine) x (forward, backward), each within a group of the 4 expert devices: the 2 copies of
    # the moe block run under lax.scan, whose compiled loop bodies (forward and backward) hold one copy
    assert len(groups) == 4 and set(groups) == {4}
    assert not re.search(r" all-gather(-start)?\(", text)


def numpy_moe(x, p, experts, top_k, capacity):
    """docs/program.md "Mixture of experts", written out per sample and token (float64)."""
    B, T, _ = x.shape
    out, aux, dropped = np.zeros_like(x), [], 0
    for b in range(B):
        logits = x[b] @ p["router.weight"]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        choice = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]  # ties: the lower expert first
        used = np.zeros(experts, int)
        for j in range(top_k):  # choice rank first, then tokens in order
            for t in range(T):
                e = choice[t, j]
                dropped += used[e] >= capacity
                if used[e] < capacity:
                    used[e] += 1
                    h = x[b, t] @ p["experts.fc.weight"][e] + p["experts.fc.bias"][e]
                    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
                    out[b, t] += probs[t, e] * (h @ p["experts.proj.weight"][e] + p["experts.proj.bias"][e])
        f = np.bincount(choice[:, 0], minlength=experts) / T
        aux.append(experts * (f * probs.mean(0)).sum())
    return out, float(np.mean(aux)), dropped


@pytest.mark.runs
def test_moe_layer_follows_the_documented_rules():
    """The generated moe helper on one device against numpy: random routing with a small capacity (tokens
    dropped), and a zero router (every probability equal: the lower experts win the ties)."""
    import jax

    program = load_program(build(MOE_DP, "single"))
    rng = np.random.default_rng(0)
    B, T, d, E, h, k = 3, 8, 16, 4, 32, 2
    x = rng.standard_normal((B, T, d)).astype(np.float32)
    p = {"router.weight": rng.standard_normal((d, E)), "experts.fc.weight": rng.standard_normal((E, d, h)) * 0.3,
         "experts.fc.bias": rng.standard_normal((E, h)) * 0.1, "experts.proj.weight": rng.standard_normal((E, h, d)),
         "experts.proj.bias": rng.standard_normal((E, d)) * 0.1}
    p = {n: w.astype(np.float32) for n, w in p.items()}
    none = program.P(None, None, None, None)
    with jax.set_mesh(jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))):
        for router, capacity in ((p["router.weight"], 3), (np.zeros_like(p["router.weight"]), 5)):
            q = {**p, "router.weight": router}
            want, want_aux, dropped = numpy_moe(x.astype(np.float64), {n: w.astype(np.float64) for n, w in q.items()}, E, k,
                                       capacity)
            got, got_aux = program.moe(x, q, "", experts=E, top_k=k, capacity=capacity, activation="gelu",
                                       tokens_layout=none, experts_layout=none)
            assert np.abs(np.asarray(got) - want).max() < 1e-4
            assert abs(float(got_aux) - want_aux) < 1e-5
            assert dropped > 0  # some choices found their expert full
        assert np.all(want[:, 5:] == 0) and np.all(np.asarray(got)[:, 5:] == 0)  # ties: experts 0 and 1, 5 slots


@pytest.mark.slow
@pytest.mark.parametrize("case", PIPE_CASES, ids=[c[0] for c in PIPE_CASES])
def test_pipelined_moe_equals_one_stage(case):
    """Each micro-batch's load-balancing losses (per sample, averaged over the micro-batch) reach the step's
    loss from every stage, the layers before and after the block included; idle ticks add nothing, and the
    1f1b backward's recomputation adds gradients only."""
    what, mesh, edits = case
    ref, par, no_aux = pipelined("single"), pipelined(mesh, edits), pipelined("single", NO_AUX)
    dl = max_diff(par.losses, ref.losses)
    dg = max_diff([r["grad_norm"] for r in par.metrics], [r["grad_norm"] for r in ref.metrics])
    dp = max_param_diff(par.params, ref.params)
    aux = float(ref.losses[0] - no_aux.losses[0])  # step 1: the same parameters, the loss less the aux losses
    report(f"moe pipelined {what} {mesh} vs one stage", max_dloss=dl, max_dgrad_norm=dg, max_dparam=dp,
           aux_in_first_loss=aux, steps=PIPE_STEPS)
    assert len(par.losses) == PIPE_STEPS and dl < 1e-5 and dg < 1e-4 and dp < 1e-4
    # 4 moe layers, each weighted 0.01, with load-balancing losses near 1 (E * sum_e f_e * P_e)
    assert 0.02 < aux < 0.2
    assert max_diff(par.losses, no_aux.losses) > 1e-2
