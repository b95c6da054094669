"""Mixture of experts in the MLX target (templates/mlx/ops.py.j2 `moe`; docs/program.md "Mixture of experts").

specs/moe-dp.yaml (capped routing, fc/gelu/proj experts with biases) and specs/moe-shared.yaml (dropless
routing as grouped matmuls, mx.gather_mm; swiglu experts, renormalised gates, a gated shared expert, the
router z-loss), built for one device, from the parameters the JAX program exported (--steps 0): the MLX
program's first-step gradients (--export-grads) equal the JAX one-device program's, and so do 3 steps'
losses; on 2 processes over `data` (launch.sh, mlx.launch) its gradients and losses equal its one-process
run's; in bfloat16 its losses follow the JAX program's. What MLX cannot do with moe layers (the `expert` axis; the experts split over `tensor`) is E049 with
the reason.
"""

from __future__ import annotations

import jax_runs as jr
import mlx_runs as mr
import numpy as np
import pytest
from gradients import assert_same_gradients
from program_files import program_text

from mithril_spec.frontend import compile_file
from mithril_spec.lowering import check_target

SPECS = {"moe-dp": jr.SPECS / "moe-dp.yaml", "moe-shared": jr.SPECS / "moe-shared.yaml"}
SMALL = (("batch_size: 16", "batch_size: 8"),)  # MLX's CPU build multiplies with the reference BLAS
ARGS = ("--steps", "3", "--export-grads", "grads.npz")


@pytest.fixture(scope="module")
def runs():
    inits = {n: jr.run(jr.build(s, "data=1", SMALL), "--steps", "0").cwd / "params.npz" for n, s in SPECS.items()}
    jobs = []
    for name, spec in SPECS.items():
        init = ("--init-params", str(inits[name]))
        jobs += [(jr.build(spec, "data=1", SMALL), *ARGS, *init), (mr.build(spec, "data=1", SMALL), *ARGS, *init)]
    out = dict(zip([(n, w) for n in SPECS for w in ("jax", "mlx")], jr.run_many(jobs)))
    for name, spec in SPECS.items():  # (2 processes: one job at a time)
        out[name, "mlx data=2"] = mr.run(mr.build(spec, "data=2", SMALL), *ARGS, "--init-params", str(inits[name]),
                                         processes=2)
    return {k: (r, dict(np.load(r.cwd / "grads.npz"))) for k, r in out.items()}


@pytest.mark.slow
@pytest.mark.parametrize("spec", list(SPECS))
def test_mlx_moe_equals_jax_one_device(runs, spec):
    (j, gj), (m, gm) = runs[spec, "jax"], runs[spec, "mlx"]
    dg = assert_same_gradients(gj, gm, 1e-4, f"mlx {spec} vs jax")
    dl = jr.max_diff(m.losses, j.losses)
    jr.report(f"mlx {spec} vs jax, one device", max_rel_dgrad=dg, max_dloss=dl)
    assert len(m.losses) == 3 and dl < 1e-5
    assert any(".moe.router.weight" in k for k in gm) and np.abs(gm["blocks.0.moe.router.weight" if spec == "moe-dp"
                                                                   else "layers.0.moe.router.weight"]).max() > 0


@pytest.mark.slow
@pytest.mark.parametrize("spec", list(SPECS))
def test_mlx_moe_data_parallel_equals_one_process(runs, spec):
    (one, g1), (two, g2) = runs[spec, "mlx"], runs[spec, "mlx data=2"]
    dg = assert_same_gradients(g1, g2, 1e-5, f"mlx {spec} data=2")
    dl = jr.max_diff(two.losses, one.losses)
    jr.report(f"mlx {spec} data=2 vs 1 process", max_rel_dgrad=dg, max_dloss=dl)
    assert len(two.losses) == 3 and dl < 1e-5


def test_mlx_renders_both_routings_and_refuses_what_it_cannot_run():
    """moe-dp's capped routing renders the slots only, moe-shared's dropless routing the grouped matmuls only;
    the `expert` axis and the experts split over `tensor` are E049 with the reason."""
    dp, shared = (program_text(mr.build(s, "data=1", SMALL)) for s in SPECS.values())
    assert "def slot_experts" in dp and "gather_mm" not in dp
    assert "mx.gather_mm" in shared and "def slot_experts" not in shared and "grouped=True" in shared
    expert = compile_file(SPECS["moe-dp"], "four")  # data=2 x expert=2
    errors = [d for d in check_target(expert.plan, expert.doc, "mlx") if d.code == "E049"]
    assert any("`expert` mesh axis" in d.message and "all-to-all" in d.help for d in errors), errors
    tp = compile_file(jr.spec_variant(SPECS["moe-shared"], (("meshes:", "sharding:\n  rules: {mlp: tensor}\nmeshes:"),)),
                      "tensor=2")
    errors = [d for d in check_target(tp.plan, tp.doc, "mlx") if d.code == "E049"]
    assert any("moe layer over `tensor`" in d.message for d in errors), errors
    one = compile_file(SPECS["moe-shared"], "single")
    assert not [d for d in check_target(one.plan, one.doc, "mlx") if d.code == "E049"]


BF16 = (("training:\n", "training:\n  precision: {params: float32, compute: bfloat16}\n"),)


@pytest.mark.slow
def test_mlx_dropless_moe_in_bfloat16_follows_jax():
    """Computing in bfloat16 (MLX's CPU gather_mm takes float32 only: the grouped matmuls cast the bfloat16 rows and
    weights to float32 and round the result back), moe-shared's 3 losses stay within bfloat16's rounding of the
    JAX program's in bfloat16 (1.7e-4 measured)."""
    spec = SPECS["moe-shared"]
    init = ("--init-params", str(jr.run(jr.build(spec, "data=1", SMALL), "--steps", "0").cwd / "params.npz"))
    j, m = jr.run_many([(jr.build(spec, "data=1", SMALL + BF16), "--steps", "3", *init),
                        (mr.build(spec, "data=1", SMALL + BF16), "--steps", "3", *init)])
    dl = jr.max_diff(m.losses, j.losses)
    jr.report("mlx moe-shared bfloat16 vs jax bfloat16", max_dloss=dl)
    assert len(m.losses) == 3 and dl < 2e-3
