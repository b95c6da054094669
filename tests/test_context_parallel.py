"""Context parallelism (the `context` mesh axis, docs/program.md "Context parallelism").

Equivalence: a tiny causal GPT (learned positions and rotary grouped-query attention, so both kinds of global
positions) built for context=2, data=2 x context=2, context=2 x tensor=2 (and in torch fsdp=2 x context=2)
gives the loss trajectory of its one-device build within 1e-5 (float32), in the jax and torch targets; every
rank holds the parameter, gradient and optimizer bytes `plan` predicts.

Traffic: the ring attention the programs run moves the bytes the plan's send/recv collectives count: in JAX
the collective-permutes of the compiled train step, in torch the bytes each rank sends point to point.

Dropout and batch_norm: the same model with attention dropout, a dropout layer and a batch_norm (whose channels
are the positions) on context=2 and data=2 x context=2 equals its one-device build in both targets: losses,
gradient norms, the evaluation and batch_norm's running statistics (from the checkpoints).

Moe: the model with its mlp as a moe layer (few slots: many choices dropped) on context=2, data=2 x context=2
and context=2 x tensor=2 equals its one-device build in both targets (the layer gathers the whole sequence; its
load-balancing loss, part of the loss, counted once); the plan counts the gather and its gradient.

Plan: activations shrink with the context degree, parameters and optimizer state do not; the ring's figures
follow docs/cost-model.md. Refusals: what the targets cannot run on a sequence split over `context` is E049.
"""

from __future__ import annotations

import concurrent.futures
import re

import jax_runs
import pytest
import torch_runs

from mithril_spec.frontend import compile_document, compile_file
from mithril_spec.planner.costs import estimate
from mithril_spec.source import load_text
from mithril_spec.lowering import LOWERINGS

SPEC = jax_runs.ROOT / "tests" / "specs" / "gpt-context.yaml"
STEPS = 3
MESHES = ("context", "data_context", "context_tensor", "fsdp_context")
# program runs (each compiles its program: a few of them): fsdp x context in torch only (FSDP2 with the
# program's own mean over `context`; in JAX, XLA reduces over every axis alike)
RUNS = {"jax": ("data=1", "context", "data_context", "context_tensor"), "torch": ("data=1", *MESHES)}
# the JAX build on context=2 also dumps its compiled HLO (the ring's collective-permutes)
DUMP = "--xla_dump_to=hlo --xla_dump_hlo_as_text"


def jax_run(mesh):
    env = {"XLA_FLAGS": DUMP} if mesh == "context" else None
    return jax_runs.run(jax_runs.build(SPEC, mesh), "--steps", str(STEPS), env=env)


def torch_run(mesh):
    return torch_runs.run(torch_runs.build(SPEC, mesh), "--steps", str(STEPS), count=mesh == "context")


@pytest.fixture(scope="module")
def all_runs():
    """Every program run of this module, two at a time: the references first, then the parallel builds."""
    jobs = [lambda m=m: jax_run(m) for m in RUNS["jax"]] + [lambda m=m: torch_run(m) for m in RUNS["torch"]]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda job: job(), jobs))


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
@pytest.mark.parametrize("target,mesh", [(t, m) for t, ms in RUNS.items() for m in ms[1:]])
def test_equivalence_and_held_bytes(target, mesh):
    one = jax_run if target == "jax" else torch_run
    ref, par = one("data=1"), one(mesh)
    dl = jax_runs.max_diff(par.losses, ref.losses)
    dg = jax_runs.max_diff([r["grad_norm"] for r in par.metrics], [r["grad_norm"] for r in ref.metrics])
    plan = compile_file(SPEC, mesh).plan
    held = par.memory
    jax_runs.report(f"context parallel {target} {mesh}", max_dloss=dl, max_dgrad_norm=dg,
                    held=held["device0"], planned=held["planned"])
    assert len(par.losses) == len(ref.losses) == STEPS
    assert dl < 1e-5, f"{target} on {mesh}: losses differ from one device by {dl:.2e}"
    assert dg < 1e-5, f"{target} on {mesh}: gradient norms differ from one device by {dg:.2e}"
    ranks = held.get("ranks", [held["device0"]])  # torch: every rank's; jax: the first device's
    for got in ranks:
        assert got["params"] == plan.memory.params
        assert got["optimizer"] == plan.memory.optimizer
        if "grads" in got:
            assert got["grads"] == plan.memory.grads


def _ring(plan):
    """The plan's ring-attention traffic: bytes per device per step, forward and backward."""
    colls = [c for c in estimate(plan).collectives if c.kind == "send/recv" and c.axes == ("context",)]
    return {ph: sum(c.total_bytes for c in colls if c.phase == ph) for ph in ("forward", "backward")}


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
def test_jax_ring_traffic_is_planned():
    """The compiled JAX step passes the key/value blocks with collective-permutes (inside the lax.scan over the
    block's copies: once per copy), forward and backward: their bytes are the plan's; nothing gathers the
    sequence."""
    plan = compile_file(SPEC, "context").plan
    run = jax_run("context")
    (hlo,) = [p for p in (run.cwd / "hlo").glob("*jit_train_step*after_optimizations.txt")]
    text = hlo.read_text()
    sizes = {"f32": 4, "bf16": 2, "f16": 2}
    permutes = re.findall(r"= (\w+)\[([\d,]*)\]\{[^}]*\} collective-permute\(", text)
    per_copy = sum(sizes[t] * eval("*".join(d.split(",")) or "1") for t, d in permutes)
    copies = dict(plan.spec.dims)["layers"]
    planned = _ring(plan)
    jax_runs.report("context parallel jax ring traffic", measured_bytes_per_step=per_copy * copies,
                    planned_bytes_per_step=planned["forward"] + planned["backward"])
    assert per_copy * copies == planned["forward"] + planned["backward"] > 0
    assert "all-gather" not in text


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
def test_torch_ring_traffic_is_planned():
    """Each torch rank sends its key/value block CONTEXT - 1 times per attention layer and the blocks'
    gradients as often back: the bytes the plan counts."""
    plan = compile_file(SPEC, "context").plan
    run = torch_run("context")
    sent = [c["sent_bytes"] for c in run.collectives()]
    planned = _ring(plan)
    torch_runs.report("context parallel torch ring traffic", measured_bytes_per_step=[s / STEPS for s in sent],
                      planned_bytes_per_step=planned["forward"] + planned["backward"])
    assert sent == [STEPS * (planned["forward"] + planned["backward"])] * 2


# ---------------------------------------------------------------- the plan


def _plan(mesh, edits=()):
    text = SPEC.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return compile_document(load_text(text, str(SPEC)), mesh).plan


def test_plan_ring_and_activation_savings():
    """The ring's send/recv per attention layer: (n - 1) steps of the key and value blocks, b * seq / n *
    kv_heads * head_dim elements each, forward and (their gradients) backward. Every activation but the
    attention probabilities halves with the context degree; parameters and optimizer state stay."""
    single = _plan("data=1")
    b, seq, kv, hd, layers = 4, 16, 2, 8, 2
    for n in (2, 4):
        plan = _plan(f"context={n}")
        ring = _ring(plan)
        block = 2 * b * (seq // n) * kv * hd * 4
        assert ring == {"forward": layers * (n - 1) * block, "backward": layers * (n - 1) * block}
        assert plan.memory == single.memory
        acts, ref = estimate(plan).worst.activations.by_op, estimate(single).worst.activations.by_op
        for op, nbytes in ref.items():
            if op != "attention":
                assert acts[op] * n == nbytes, (op, n)
        assert estimate(plan).worst.activations.saved < estimate(single).worst.activations.saved
    # over context x tensor the blocks hold the rank's key/value heads
    assert _ring(_plan("context_tensor"))["forward"] == layers * 2 * b * (seq // 2) * (kv // 2) * hd * 4


# ---------------------------------------------------------------- refusals


def _refusals(mesh, edits=(), target="jax"):
    text = SPEC.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    c = compile_document(load_text(text, str(SPEC)), mesh)
    return [d.message + " | " + (d.help or "") for d in LOWERINGS[target].check(c.plan, c.doc) if d.code == "E049"]


MOE = ("{op: mlp, name: mlp, hidden: ff, activation: gelu}", "{op: moe, name: mlp, experts: 4, top_k: 2, hidden: ff}")
REFUSED = [
    ("pipe=2,context=2", (("\nsharding:", "\npipeline: {microbatches: 2, schedule: gpipe}\nsharding:"),), "`pipe`"),
    ("context=2", (("  seed: 0\n", "  seed: 0\n  remat: selective\n"),), "remat: selective"),
    ("data=2,context=2", (("  seed: 0\n", "  seed: 0\n  zero: 1\n"),), "training.zero: 1"),
    ("context=2,expert=2", (MOE,), "`expert`"),
    ("context=2", (("seq: 16,", "seq: 14,"),), "divisible by 4"),
    ("context=2", (("mlp: tensor}", "mlp: tensor, seq: tensor}"),), "sequence `seq`"),
    ("context=2", (("mlp: tensor}", "mlp: tensor, vocab: context}"),), "rule naming `context`"),
]


@pytest.mark.parametrize("target", ["jax", "torch"])
@pytest.mark.parametrize("mesh,edits,text", REFUSED, ids=[r[2] for r in REFUSED])
def test_refused(target, mesh, edits, text):
    got = _refusals(mesh, edits, target)
    assert any(text in m for m in got), got


def test_accepted_meshes_have_no_refusal():
    for mesh in MESHES:
        for target in ("jax", "torch"):
            assert _refusals(mesh, target=target) == [], (mesh, target)
            assert _refusals(mesh, RANDOM, target) == [], (mesh, target)
            assert _refusals(mesh, (MOE,), target) == [], (mesh, target)


# ---------------------------------------------------------------- dropout and batch_norm

# Attention dropout, a dropout layer on the attention's output and a batch_norm after the position embedding
# (its input [batch, seq, d]: its channels are the positions); the program evaluates once after its last step
# (batch_norm's running statistics, no dropout).
RANDOM = (
    ("causal: true, rotary: true}", "causal: true, rotary: true, dropout: 0.1}"),
    ("      - {op: add, name: res1, inputs: [block_input, attn]}",
     "      - {op: dropout, name: drop, rate: 0.1}\n      - {op: add, name: res1, inputs: [block_input, drop]}"),
    ("    - {op: pos_embedding, name: wpe, max_len: seq}\n",
     "    - {op: pos_embedding, name: wpe, max_len: seq}\n    - {op: batch_norm, name: bn}\n"),
    ("data: {kind: synthetic}\n", "data: {kind: synthetic}\neval: {batches: 1}\n"),
)
RANDOM_MESHES = ("data=1", "data_context")  # (context=2 alone: the capability matrix)


def random_run(target, mesh):
    """The RANDOM model's run on `mesh`, its checkpoint after the last step in <run>/ckpt."""
    runs = jax_runs if target == "jax" else torch_runs
    ckpt = str(runs.WORK / f"context-random-{target}-{mesh}")
    return runs.run(runs.build(SPEC, mesh, RANDOM), "--steps", str(STEPS), "--checkpoint-dir", ckpt), ckpt


def running_statistics(target, ckpt):
    """batch_norm's running statistics in the checkpoint of step STEPS, as numpy."""
    if target == "jax":
        from test_jax_ops import restore_state

        return restore_state(ckpt, STEPS)["buffers"]
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = f"{ckpt}.pt"
    dcp_to_torch_save(f"{ckpt}/step_{STEPS:08d}", out)
    model = torch.load(out, weights_only=False)["model"]
    return {k: v.numpy() for k, v in model.items() if "running_" in k}


@pytest.fixture(scope="module")
def random_runs():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda tm: random_run(*tm), [(t, m) for t in ("jax", "torch") for m in RANDOM_MESHES]))


@pytest.mark.slow
@pytest.mark.usefixtures("random_runs")
@pytest.mark.parametrize("target,mesh", [(t, m) for t in ("jax", "torch") for m in RANDOM_MESHES[1:]])
def test_dropout_and_batch_norm_equal_one_device(target, mesh):
    """Every rank applies the one-device masks to its places (dropout layers) and to its blocks of the
    attention probabilities (ring attention), and normalises its positions (batch_norm's channels): losses,
    gradient norms, the evaluation (running statistics) and the running statistics themselves equal the
    one-device run's; every rank holds the planned bytes."""
    (ref, ref_ckpt), (par, par_ckpt) = random_run(target, "data=1"), random_run(target, mesh)
    dl = jax_runs.max_diff(par.losses, ref.losses)
    dg = jax_runs.max_diff([r["grad_norm"] for r in par.metrics], [r["grad_norm"] for r in ref.metrics])
    dv = abs(par.metrics[-1]["val_loss"] - ref.metrics[-1]["val_loss"])
    a, b = running_statistics(target, ref_ckpt), running_statistics(target, par_ckpt)
    db = max(float(abs(a[k] - b[k]).max()) for k in a)
    jax_runs.report(f"context parallel dropout + batch_norm {target} {mesh}", max_dloss=dl, max_dgrad_norm=dg,
                    dval_loss=dv, max_dbuffer=db)
    assert len(par.losses) == len(ref.losses) == STEPS
    assert sorted(a) == sorted(b) and len(a) == 2
    assert dl < 1e-5 and dg < 1e-5 and dv < 1e-5 and db < 1e-5, (dl, dg, dv, db)
    plan = compile_file(jax_runs.spec_variant(SPEC, RANDOM), mesh).plan
    held = par.memory
    for got in held.get("ranks", [held["device0"]]):
        assert got["params"] == plan.memory.params and got["optimizer"] == plan.memory.optimizer
        assert got["buffers"] == plan.memory.buffers
        if "grads" in got:
            assert got["grads"] == plan.memory.grads


# ---------------------------------------------------------------- moe

# The block's mlp as a moe layer with few slots (capacity 4 per expert and sample for 32 choices: many are
# dropped, so the output depends on the order in which the whole sequence fills them).
MOE_TIGHT = (MOE[0], MOE[1].replace("hidden: ff}", "hidden: ff, capacity_factor: 0.5}"))
MOE_MESHES = ("data=1", "data_context", "context_tensor")  # (tensor: the experts' hidden features; context=2
# alone: the capability matrix)


def moe_run(target, mesh):
    runs = jax_runs if target == "jax" else torch_runs
    return runs.run(runs.build(SPEC, mesh, (MOE_TIGHT,)), "--steps", str(STEPS))


@pytest.fixture(scope="module")
def moe_runs():
    for target in ("jax", "torch"):  # (builds one at a time: they redirect the process's stdout)
        for mesh in MOE_MESHES:
            (jax_runs if target == "jax" else torch_runs).build(SPEC, mesh, (MOE_TIGHT,))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda tm: moe_run(*tm), [(t, m) for t in ("jax", "torch") for m in MOE_MESHES]))


@pytest.mark.slow
@pytest.mark.usefixtures("moe_runs")
@pytest.mark.parametrize("target,mesh", [(t, m) for t in ("jax", "torch") for m in MOE_MESHES[1:]])
def test_moe_equals_one_device(target, mesh):
    """Every context rank runs the moe layers on the whole sequence in its order (gathered over `context`)
    and keeps its places: the slots fill as on one device, and the load-balancing loss (part of the loss) is
    each sample's once, not per rank: losses and gradient norms equal the one-device run's; every rank holds
    the planned bytes."""
    ref, par = moe_run(target, "data=1"), moe_run(target, mesh)
    dl = jax_runs.max_diff(par.losses, ref.losses)
    dg = jax_runs.max_diff([r["grad_norm"] for r in par.metrics], [r["grad_norm"] for r in ref.metrics])
    jax_runs.report(f"context parallel moe {target} {mesh}", max_dloss=dl, max_dgrad_norm=dg)
    assert len(par.losses) == len(ref.losses) == STEPS
    assert dl < 1e-5 and dg < 1e-5, (dl, dg)
    plan = compile_file(jax_runs.spec_variant(SPEC, (MOE_TIGHT,)), mesh).plan
    held = par.memory
    for got in held.get("ranks", [held["device0"]]):
        assert got["params"] == plan.memory.params and got["optimizer"] == plan.memory.optimizer
        if "grads" in got:
            assert got["grads"] == plan.memory.grads


def test_plan_moe_gathers_the_sequence():
    """A moe layer under context=n: an all-gather of its input over `context` (the whole sequence, b * seq * d
    float32 per device) forward and the input gradient's reduce-scatter backward; it keeps the whole sequence's
    tensors, as on one device, and its FLOPs are not divided over `context`."""
    b, seq, d, layers = 4, 16, 32, 2
    single = estimate(_plan("data=1", (MOE,)))
    for n in (2, 4):
        est = estimate(_plan(f"context={n}", (MOE,)))
        moe = [c for c in est.collectives if c.axes == ("context",) and "moe" in c.what]
        whole = layers * b * seq * d * 4
        assert sorted((c.kind, c.phase, c.total_bytes) for c in moe) == [
            ("all-gather", "forward", whole), ("reduce-scatter", "backward", whole)]
        assert est.worst.activations.by_op["moe"] == single.worst.activations.by_op["moe"]
        moe_flops = layers * 4 * _plan("data=1", (MOE,)).graph.layers[2].layers[4].flops
        # every other layer's forward FLOPs divide by n, the moe layers' do not
        assert est.flops.per_device_forward == pytest.approx(
            moe_flops + (single.flops.per_device_forward - moe_flops) / n)


def test_mlx_refuses_the_axis():
    got = _refusals("context=2", target="mlx")
    assert any("`context` mesh axis" in m and "ring attention" in m for m in got), got


@pytest.mark.slow
def test_torch_non_causal():
    """Attention without a mask: every block whole, in the torch program (cheap to run; the JAX program's
    unmasked ring is the same fold without the choice of half blocks)."""
    edits = (("causal: true", "causal: false"),)
    ref, par = (torch_runs.run(torch_runs.build(SPEC, mesh, edits), "--steps", str(STEPS))
                for mesh in ("data=1", "context"))
    dl = torch_runs.max_diff(par.losses, ref.losses)
    torch_runs.report("context parallel torch non-causal context=2", max_dloss=dl)
    assert dl < 1e-5
