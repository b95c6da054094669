"""The moe forms of current models (ops/moe.py): bias-free SwiGLU experts, renormalised top-k gates, dropless
routing, shared experts with a sigmoid gate, the router z-loss (specs/moe-shared.yaml uses them all).

The layer: the generated jax `moe` helper and the torch `MoE` module against a numpy re-implementation of
docs/program.md "Mixture of experts" (float64), for every form alone and together. Equivalence (docs/program.md
"Equivalence"): the first step's per-parameter gradients and 3 steps' losses of moe-shared under the targets'
expert-parallel layouts (jax: data=2 x expert=4 and fsdp=2 x expert=2, data=2 (dropless as grouped matmuls), and
tensor=2 with the experts' and the shared expert's hidden features split; torch: data=2 x expert=2, and tensor=2 and data=2 x tensor=2 with
the hidden features split, tensor=2 also with sequence parallelism) equal the one-device build's. The plan: the exported parameters are the plan's; dropless routing and the shared
experts are costed (flops, activations). Dropless routing as grouped matmuls over the rows sorted by expert (jax
ragged_dot, torch _grouped_mm or a matmul per expert) equals the slot formulation, output and gradients."""

from __future__ import annotations

import os

import jax_runs
import numpy as np
import pytest
import torch_runs
from gradients import assert_same_gradients
from program_files import program_text
from program_import import load_program

from mithril_spec.frontend import compile_file
from mithril_spec.planner.costs import estimate

SPEC = jax_runs.SPECS / "moe-shared.yaml"
ARGS = ("--steps", "3", "--export-grads", "grads.npz")
# None: the default, data=2 x expert=4; data=2: dropless routing as grouped matmuls over a split batch
JAX_MESHES = ["single", None, "fsdp=2,expert=2", "data=2"]
TORCH_MESHES = ["single", "four"]  # four: data=2 x expert=2


def numpy_moe(x, p, E, k, capacity, swiglu, normalize, shared, shared_gate):
    """docs/program.md "Mixture of experts", per sample and token (float64): (output, load-balancing loss,
    router z-loss, dropped choices)."""
    B, T, _ = x.shape
    out, aux, z, dropped = np.zeros_like(x), [], [], 0
    silu = lambda h: h / (1 + np.exp(-h))
    for b in range(B):
        logits = x[b] @ p["router.weight"]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        choice = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        gates = np.take_along_axis(probs, choice, -1)
        if normalize:
            gates = gates / gates.sum(-1, keepdims=True)
        used = np.zeros(E, int)
        for j in range(k):
            for t in range(T):
                e = choice[t, j]
                dropped += used[e] >= capacity
                if used[e] < capacity:
                    used[e] += 1
                    if swiglu:
                        h = silu(x[b, t] @ p["experts.gate.weight"][e]) * (x[b, t] @ p["experts.up.weight"][e])
                        y = h @ p["experts.down.weight"][e]
                    else:
                        h = x[b, t] @ p["experts.fc.weight"][e] + p["experts.fc.bias"][e]
                        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
                        y = h @ p["experts.proj.weight"][e] + p["experts.proj.bias"][e]
                    out[b, t] += gates[t, j] * y
        if shared:
            ys = (silu(x[b] @ p["shared.gate.weight"]) * (x[b] @ p["shared.up.weight"])) @ p["shared.down.weight"]
            if shared_gate:
                ys = ys / (1 + np.exp(-(x[b] @ p["shared_gate.weight"])))
            out[b] += ys
        f = np.bincount(choice[:, 0], minlength=E) / T
        aux.append(E * (f * probs.mean(0)).sum())
        m = logits.max(-1)
        z.append(np.mean((m + np.log(np.exp(logits - m[:, None]).sum(-1))) ** 2))
    return out, float(np.mean(aux)), float(np.mean(z)), dropped


B, T, D, E, H, S, K = 3, 8, 16, 4, 12, 20, 2
FORMS = {  # what: (swiglu, normalize, shared, shared_gate, capacity)
    "swiglu": (True, False, False, False, 3),
    "normalized gates": (True, True, False, False, 3),
    "dropless": (True, False, False, False, T),
    "shared expert": (True, False, True, False, 3),
    "all": (True, True, True, True, T),
}


def _params(rng, zero_router=False):
    p = {"router.weight": rng.standard_normal((D, E)), "experts.fc.weight": rng.standard_normal((E, D, H)) * 0.3,
         "experts.fc.bias": rng.standard_normal((E, H)) * 0.1, "experts.proj.weight": rng.standard_normal((E, H, D)),
         "experts.proj.bias": rng.standard_normal((E, D)) * 0.1,
         "experts.gate.weight": rng.standard_normal((E, D, H)) * 0.3,
         "experts.up.weight": rng.standard_normal((E, D, H)) * 0.3, "experts.down.weight": rng.standard_normal((E, H, D)),
         "shared.gate.weight": rng.standard_normal((D, S)) * 0.3, "shared.up.weight": rng.standard_normal((D, S)) * 0.3,
         "shared.down.weight": rng.standard_normal((S, D)) * 0.3, "shared_gate.weight": rng.standard_normal((D, 1))}
    if zero_router:
        p["router.weight"] = np.zeros((D, E))
    return {n: w.astype(np.float32) for n, w in p.items()}


def _expected(x, p, form):
    swiglu, normalize, shared, shared_gate, capacity = form
    return numpy_moe(x.astype(np.float64), {n: w.astype(np.float64) for n, w in p.items()}, E, K, capacity,
                     swiglu, normalize, shared, shared_gate)


def _load(path, name):
    return load_program(os.path.dirname(path))


@pytest.mark.runs
@pytest.mark.parametrize("what", list(FORMS))
def test_jax_moe_forms_follow_the_documented_rules(what):
    import jax

    program = _load(jax_runs.build(SPEC, "single") / "train.py", "moe_shared_jax")
    form = FORMS[what]
    swiglu, normalize, shared, shared_gate, capacity = form
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    p = _params(rng)
    none = program.P(None, None, None, None)
    with jax.set_mesh(jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))):
        kw = dict(experts=E, top_k=K, capacity=capacity, tokens_layout=none, experts_layout=none)
        if not swiglu:  # the program holds only the swiglu form: the fc/proj form is moe-dp's (test_jax_moe.py)
            pytest.skip("moe-shared's program holds the swiglu experts only")
        got, (aux, z) = program.moe(x, p, "", activation="swiglu", normalize=normalize, shared=shared,
                                    shared_gate=shared_gate, z_loss=True, **kw)
    want, want_aux, want_z, dropped = _expected(x, p, form)
    assert np.abs(np.asarray(got) - want).max() < 1e-4
    assert abs(float(aux) - want_aux) < 1e-5 and abs(float(z) - want_z) < 1e-4 * want_z
    assert (dropped > 0) == (capacity < T)  # dropless: none dropped


@pytest.mark.runs
@pytest.mark.parametrize("what", list(FORMS))
def test_torch_moe_forms_follow_the_documented_rules(what):
    import torch

    program = _load(torch_runs.build(SPEC, "single") / "train.py", "moe_shared_torch")
    swiglu, normalize, shared, shared_gate, capacity = form = FORMS[what]
    if not swiglu:
        pytest.skip("moe-shared's program holds the swiglu experts only")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    p = _params(rng)
    m = program.MoE(D, experts=E, top_k=K, hidden=H, capacity=capacity, aux_loss_weight=1.0, activation="swiglu",
                    normalize=normalize, shared_hidden=S if shared else 0, shared_gate=shared_gate, z_loss_weight=0.0)
    with torch.no_grad():
        for name, t in m.named_parameters():
            t.copy_(torch.from_numpy(p[name]))
    got = m(torch.from_numpy(x)).detach().numpy()
    want, want_aux, want_z, dropped = _expected(x, p, form)
    assert np.abs(got - want).max() < 1e-4
    assert abs(float(m.aux_loss) - want_aux) < 1e-5
    m.z_loss_weight = 0.5
    m(torch.from_numpy(x))
    assert abs(float(m.aux_loss) - (want_aux + 0.5 * want_z)) < 1e-4 * want_z
    assert (dropped > 0) == (capacity < T)


def test_every_form_changes_the_output():
    """The forms are not the same computation: switching any one off changes the numpy layer's output (so a
    program that ignored a form fails the tests above)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    p = _params(rng)
    full = _expected(x, p, FORMS["all"])[0]
    for i, off in enumerate([False, False, False, False, 3]):
        form = list(FORMS["all"])
        form[i] = off
        if i == 2:
            form[3] = False
        assert np.abs(_expected(x, p, tuple(form))[0] - full).max() > 1e-3, i


TP = (("meshes:", "sharding:\n  rules: {mlp: tensor}\nmeshes:"),)  # the experts' hidden features over `tensor`


@pytest.fixture(scope="module")
def jax_grads():
    jobs = [(jax_runs.build(SPEC, m), *ARGS) for m in JAX_MESHES] + [(jax_runs.build(SPEC, "tensor=2", TP), *ARGS)]
    runs = jax_runs.run_many(jobs)
    return {m: (r, dict(np.load(r.cwd / "grads.npz"))) for m, r in zip(JAX_MESHES + ["tensor=2"], runs)}


@pytest.fixture(scope="module")
def torch_grads():
    runs = torch_runs.run_many([(torch_runs.build(SPEC, m), *ARGS) for m in TORCH_MESHES])
    return {m: (r, dict(np.load(r.cwd / "grads.npz"))) for m, r in zip(TORCH_MESHES, runs)}


# and with sequence parallelism (the blocks' sequence over `tensor`, the moe layer gathering it: experts_sp)
TP_SP = (("meshes:", "sharding:\n  rules: {mlp: tensor, heads: tensor, kv_heads: tensor, seq: tensor}\nmeshes:"),)
TORCH_TP = {"tensor2": ("tensor=2", TP), "data2xtensor2": ("data=2,tensor=2", TP), "tensor2-sp": ("tensor=2", TP_SP)}


@pytest.fixture(scope="module")
def torch_tp_grads():
    runs = torch_runs.run_many([(torch_runs.build(SPEC, m, e), *ARGS) for m, e in TORCH_TP.values()])
    return {k: (r, dict(np.load(r.cwd / "grads.npz"))) for k, r in zip(TORCH_TP, runs)}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", JAX_MESHES[1:] + ["tensor=2"], ids=["data2xexpert4", "fsdp2xexpert2", "data2", "tensor2"])
def test_jax_moe_forms_expert_parallel_equal_one_device(jax_grads, mesh):
    (one, g1), (par, gp) = jax_grads["single"], jax_grads[mesh]
    dg = assert_same_gradients(g1, gp, 1e-5, f"jax moe-shared {mesh}")
    dl = float(np.abs(par.losses - one.losses).max())
    jax_runs.report(f"moe-shared jax {mesh or 'data=2 x expert=4'} vs 1 device", max_rel_dgrad=dg, max_dloss=dl)
    assert len(par.losses) == 3 and dl < 1e-5
    assert any(".moe.shared_gate.weight" in k for k in g1) and any(".moe.experts.down.weight" in k for k in g1)
    grouped = "grouped=True" in program_text(jax_runs.build(SPEC, mesh, TP if mesh == "tensor=2" else ()))
    assert grouped == (mesh in ("data=2", "tensor=2"))  # the experts not split over a mesh axis
    if mesh == "tensor=2":  # (the hidden features split, as planned)
        plan = compile_file(jax_runs.spec_variant(SPEC, TP), mesh).plan
        assert [list(d) for d in plan.param("layers.0.moe.experts.gate.weight").spec] == [[], [], ["tensor"]]
        assert [list(d) for d in plan.param("layers.0.moe.shared.down.weight").spec] == [["tensor"], []]


@pytest.mark.slow
def test_torch_moe_forms_expert_parallel_equal_one_process(torch_grads):
    (one, g1), (par, gp) = torch_grads["single"], torch_grads["four"]
    dg = assert_same_gradients(g1, gp, 1e-5, "torch moe-shared data=2 x expert=2")
    dl = float(np.abs(par.losses - one.losses).max())
    torch_runs.report("moe-shared torch data=2 x expert=2 vs 1 process", max_rel_dgrad=dg, max_dloss=dl)
    assert len(par.losses) == 3 and dl < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("case", TORCH_TP)
def test_torch_moe_forms_tensor_parallel_equal_one_process(torch_grads, torch_tp_grads, case):
    """The swiglu experts' and the shared expert's hidden features split over `tensor` (MoE.split_tensor):
    gate and up on their outputs, down on its inputs (partial sums all-reduced), shared_gate whole; with
    data=2 beside it, and with the sequence split over `tensor` between the layers."""
    mesh, edits = TORCH_TP[case]
    (one, g1), (par, gp) = torch_grads["single"], torch_tp_grads[case]
    dg = assert_same_gradients(g1, gp, 1e-5, f"torch moe-shared {mesh}")
    dl = float(np.abs(par.losses - one.losses).max())
    torch_runs.report(f"moe-shared torch {case} vs 1 process", max_rel_dgrad=dg, max_dloss=dl)
    assert len(par.losses) == 3 and dl < 1e-5
    style = "experts_sp" if case.endswith("-sp") else "experts"
    assert f'"layers.*.moe": "{style}"' in program_text(torch_runs.build(SPEC, mesh, edits))
    plan = compile_file(jax_runs.spec_variant(SPEC, edits), mesh).plan  # every rank holds the planned bytes
    assert [list(d) for d in plan.param("layers.0.moe.experts.down.weight").spec] == [[], ["tensor"], []]
    predicted = {"params": plan.memory.params, "grads": plan.memory.grads, "optimizer": plan.memory.optimizer,
                 "buffers": plan.memory.buffers}
    assert len(par.memory["ranks"]) == (2 if mesh == "tensor=2" else 4)
    for rank, held in enumerate(par.memory["ranks"]):
        assert held == predicted, f"{mesh}: rank {rank} holds {held}, plan says {predicted}"


@pytest.mark.slow
def test_jax_and_torch_moe_forms_agree(jax_grads, torch_grads):
    """The same spec, seed and data: the one-device programs of the two targets compute the same first-step
    gradients (their initialisation is shared: common/init.py.j2)."""
    dg = assert_same_gradients(jax_grads["single"][1], torch_grads["single"][1], 1e-4, "moe-shared jax vs torch")
    assert dg < 1e-4


def test_plan_costs_the_forms():
    """Parameters: the swiglu experts, the shared expert and its gate; flops: the routed tokens' expert flops
    (dropless or not: dropless routing runs the experts as grouped matmuls over the routed tokens), the shared
    expert every token's, and under expert parallelism dropless's every slot (experts / top_k times the routed
    tokens' expert flops, per device); activations: the swiglu's three hidden tensors per routed row (dropless:
    the k * T sorted rows; capped: the slots), and dropless's E * T slots under expert parallelism."""
    plan = compile_file(SPEC, "single").plan
    names = {p.name for p in plan.params}
    assert {"layers.0.moe.experts.gate.weight", "layers.0.moe.shared.down.weight",
            "layers.0.moe.shared_gate.weight"} <= names and not any("experts.fc" in n for n in names)
    moe = {n.name: n for n in plan.graph.nodes()}["moe"]
    a = moe.attrs
    assert a["capacity"] == 16 and a["shared_hidden"] == 96 and a["dropless"]
    T, d, h, e, sh = 16, 64, 64, 4, 96
    want = 2 * T * d * e + 2 * T * (6 * d * h + 4 * h) + T * (6 * d * sh + 4 * sh + 2 * d + 4) + 3 * T * e
    assert moe.flops == want
    capped_spec = jax_runs.spec_variant(SPEC, (("dropless: true", "dropless: false"),))
    capped = compile_file(capped_spec, "single").plan
    cmoe = {n.name: n for n in capped.graph.nodes()}["moe"]
    assert cmoe.attrs["capacity"] == 10  # ceil(1.25 * 16 * 2 / 4)
    assert moe.flops == cmoe.flops
    # per device, batch 16: 16 * 16 * 2 sorted rows dropless, ceil(1.25 * 16 * 16 * 2) slots capped; per row the
    # dispatched and combined rows (d) and the three hidden tensors (h), float32
    costs = [estimate(p) for p in (plan, capped)]
    saved = [c.worst.activations.by_op["moe"] for c in costs]
    assert saved[0] - saved[1] == 2 * (16 * 16 * 2 - 640) * (2 * d + 3 * h) * 4  # (2 layers)
    assert costs[0].flops.per_device_forward == costs[1].flops.per_device_forward
    # data=2 x expert=4: 2 samples per device; dropless fills every expert's slot for every token
    ep = [estimate(compile_file(s, None).plan) for s in (SPEC, capped_spec)]
    extra = 2 * 2 * (e - 2) * T * (6 * d * h + 4 * h)  # 2 layers, 2 samples
    assert ep[0].flops.per_device_forward - ep[1].flops.per_device_forward == extra
    saved = [c.worst.activations.by_op["moe"] for c in ep]
    assert saved[0] - saved[1] == 2 * (2 * 16 * 4 - 80) * (2 * d + 3 * h) * 4
    assert plan.param_count == sum(p.param.numel for p in plan.params)


def test_torch_splits_the_swiglu_experts_over_tensor_together_and_mlx_does_not():
    """torch's tensor parallelism splits the swiglu experts and the shared expert on their hidden features, all
    of them or none (E049 for the experts split without the shared expert); jax splits any of them (XLA); mlx
    runs moe layers whole (E049 for them split over `tensor`; tests/test_mlx_moe.py runs them)."""
    from mithril_spec.lowering import check_target

    plan = compile_file(jax_runs.spec_variant(SPEC, TP), "tensor=2")
    assert not [d for d in check_target(plan.plan, plan.doc, "torch") if d.code == "E049"]
    assert not check_target(plan.plan, plan.doc, "jax")
    only = (("meshes:", "sharding:\n  rules: {mlp: tensor}\n  params: {'*.shared.down.weight': [null, null]}\n"
             "meshes:"),)
    half = compile_file(jax_runs.spec_variant(SPEC, only), "tensor=2")
    assert [list(d) for d in half.plan.param("layers.0.moe.shared.down.weight").spec] == [[], []]
    torch_errors = [d for d in check_target(half.plan, half.doc, "torch") if d.code == "E049"]
    assert any("swiglu experts and shared experts" in d.message for d in torch_errors), torch_errors
    mlx = check_target(plan.plan, plan.doc, "mlx")
    assert any(d.code == "E049" and "moe layer over `tensor`" in d.message for d in mlx), mlx
    assert not check_target(compile_file(SPEC, "single").plan, compile_file(SPEC, "single").doc, "mlx")


NO_Z = (("z_loss_weight: 0.001", "z_loss_weight: 0.0"),)


@pytest.mark.slow
@pytest.mark.parametrize("runs", [jax_runs, torch_runs], ids=["jax", "torch"])
def test_the_router_z_loss_joins_the_loss(runs):
    """The first step's loss less that of the build without the z-loss (the same parameters) is 0.001 times
    the two layers' z-losses: near 2 * log(4)^2 (the routers start near uniform: logsumexp of 4 logits near 0;
    4.05 measured, the logits' spread adds to it)."""
    with_z = runs.run(runs.build(SPEC, "single"), "--steps", "1")
    no_z = runs.run(runs.build(SPEC, "single", NO_Z), "--steps", "1")
    z = float(with_z.losses[0] - no_z.losses[0]) / 0.001
    runs.report(f"moe-shared {runs.__name__}: z-loss in the first loss", z=z)
    assert 0.9 < z / (2 * np.log(4) ** 2) < 1.2, z


PIPE = (("training:", "pipeline: {microbatches: 2, schedule: gpipe}\n\ntraining:"),)


@pytest.mark.slow
@pytest.mark.parametrize("runs", [jax_runs, torch_runs], ids=["jax", "torch"])
def test_pipelined_moe_forms_equal_one_stage(runs):
    """gpipe over pipe=2 (one moe layer per stage): each micro-batch's load-balancing and z-losses reach the
    loss from its stage, as in the one-stage build (its micro-batches one after the other)."""
    one = runs.run(runs.build(SPEC, "single", PIPE), "--steps", "3")
    pipe = runs.run(runs.build(SPEC, "pipe=2", PIPE), "--steps", "3")
    dl = float(np.abs(pipe.losses - one.losses).max())
    runs.report(f"moe-shared {runs.__name__} pipe=2 vs one stage", max_dloss=dl)
    assert len(pipe.losses) == 3 and dl < 1e-5


@pytest.mark.parametrize("edit, field", [
    (("dropless: true,", "dropless: true, capacity_factor: 2.0,"), "capacity_factor"),
    (("activation: swiglu,", "activation: gelu,"), "shared_experts"),
    (("shared_experts: 1, shared_hidden: shared_ff, shared_gate: true,", "shared_gate: true,"), "shared_gate"),
    (("shared_experts: 1, shared_hidden: shared_ff, shared_gate: true,", "shared_hidden: shared_ff,"), "shared_hidden"),
])
def test_settings_that_do_not_combine_are_refused(capsys, edit, field):
    from mithril_spec.cli import main as cli

    rc = cli(["validate", str(jax_runs.spec_variant(SPEC, (edit,)))])
    err = capsys.readouterr().err
    assert rc == 1 and "E030" in err and field in err, err


# ---------------------------------------------------------------- dropless as grouped matmuls

def _grouped_case(seed, h):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    p = _params(rng)
    for name in ("experts.gate.weight", "experts.up.weight"):
        p[name] = p[name][..., :h]
    p["experts.down.weight"] = p["experts.down.weight"][:, :h]
    return x, p


@pytest.mark.runs
@pytest.mark.parametrize("h", [H, 10], ids=["grouped_mm", "per-expert"])
def test_torch_dropless_grouped_matmuls_equal_the_slots(h):
    """Dropless routing without expert parallelism runs the experts as grouped matmuls over the chosen rows
    sorted by expert (MoE.grouped_experts: torch._grouped_mm, or a matmul per expert where its kernel does not
    take the rows: 10 float32 hidden features are 40 bytes, not a multiple of 16): the output, the layer's loss
    and every parameter's and the input's gradient equal those of the slot formulation (E x T slots per
    sample), within float32 rounding."""
    import torch

    program = _load(torch_runs.build(SPEC, "single") / "train.py", "moe_shared_torch")
    x, p = _grouped_case(4, h)
    got = {}
    for grouped in (True, False):
        m = program.MoE(D, experts=E, top_k=K, hidden=h, capacity=T, aux_loss_weight=0.5, activation="swiglu",
                        normalize=True, dropless=True, shared_hidden=S, shared_gate=True, z_loss_weight=0.1)
        m.grouped = grouped
        with torch.no_grad():
            for name, t in m.named_parameters():
                t.copy_(torch.from_numpy(p[name]))
        xt = torch.from_numpy(x).requires_grad_()
        y = m(xt)
        w = torch.from_numpy(np.random.default_rng(5).standard_normal(y.shape).astype(np.float32))
        ((y * w).sum() + m.aux_loss).backward()
        got[grouped] = {"y": y.detach().numpy(), "x": xt.grad.numpy(),
                        **{n: t.grad.numpy() for n, t in m.named_parameters()}}
    want = _expected(x, p, FORMS["all"])[0] if h == H else None
    if want is not None:
        assert np.abs(got[True]["y"] - want).max() < 1e-4
    dg = assert_same_gradients(got[False], got[True], 1e-5, f"torch dropless grouped (hidden {h}) vs slots")
    torch_runs.report(f"torch moe dropless grouped vs slots, hidden {h}", max_rel_dgrad=dg)
    assert np.abs(got[True]["experts.down.weight"]).max() > 0


@pytest.mark.runs
def test_jax_dropless_grouped_matmuls_equal_the_slots():
    """The jax helper with `grouped` (dropless without expert parallelism: jax.lax.ragged_dot over the chosen rows
    sorted by expert) against the slot formulation (capacity = T): the output, and the gradients of a loss of it
    (and of the load-balancing and z-losses) by the input and every parameter, equal within float32 rounding."""
    import jax
    import jax.numpy as jnp

    program = _load(jax_runs.build(SPEC, "single") / "train.py", "moe_shared_jax")
    assert "grouped=True" in program_text(jax_runs.build(SPEC, "single"))
    x, p = _grouped_case(6, H)
    w = np.random.default_rng(7).standard_normal(x.shape).astype(np.float32)
    none = program.P(None, None, None, None)

    def loss(x, p, grouped):
        y, (aux, z) = program.moe(x, p, "", experts=E, top_k=K, capacity=T, activation="swiglu", tokens_layout=none,
                                  experts_layout=none, normalize=True, grouped=grouped, shared=True, shared_gate=True,
                                  z_loss=True)
        return (y * w).sum() + 0.5 * aux + 0.1 * z, y

    got = {}
    with jax.set_mesh(jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))):
        for grouped in (True, False):
            (_, y), (gx, gp) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(jnp.asarray(x), p, grouped)
            got[grouped] = {"y": np.asarray(y), "x": np.asarray(gx), **{n: np.asarray(g) for n, g in gp.items()}}
    assert np.abs(got[True]["y"] - _expected(x, p, FORMS["all"])[0]).max() < 1e-4
    dg = assert_same_gradients(got[False], got[True], 1e-5, "jax dropless grouped vs slots")
    jax_runs.report("jax moe dropless grouped vs slots", max_rel_dgrad=dg)
    assert np.abs(got[True]["experts.down.weight"]).max() > 0
