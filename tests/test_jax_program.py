"""The generated JAX program's interface and features (docs/program.md), on simulated CPU devices:
resume, several processes, gradient accumulation, remat, bf16, data on disk, the device-count check,
--steps 0 export, --init-params, --dry-run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import reference_init
from jax_runs import PY, SPECS, WORK, build, max_diff, max_param_diff, report, run, run_many, spec_variant

from mithril_spec.frontend import compile_file

GPT = SPECS / "gpt-tiny.yaml"
MLP = SPECS / "mlp-dp.yaml"
GPT_STEPS = 10
CKPT = WORK / "ckpt-5"
MP_CKPT = WORK / "ckpt-mp"
ARRAYS = WORK / "arrays-gpt"
TEXT = WORK / "corpus.txt"
TEXT_STEPS = 20

PRECISION = "precision: {params: float32, compute: float32}"
ACCUM_SELECTIVE = (("batch_size: 16", "batch_size: 16\n  grad_accum: 2"), (PRECISION, PRECISION + "\n  remat: selective"))
REMAT_FULL = ((PRECISION, PRECISION + "\n  remat: full"),)


def gpt(mesh=None, edits=()):
    return build(GPT, mesh, tuple(edits))


def gpt_full():
    """The 3-D (data=2, fsdp=2, tensor=2) reference trajectory, shared with test_jax_equivalence."""
    return run(gpt(), "--steps", str(GPT_STEPS))


def gpt_single():
    return run(gpt("data=1"), "--steps", str(GPT_STEPS))


def synthetic_samples(spec: Path, count: int) -> dict:
    """Samples 0..count-1 of the spec's synthetic data, by the documented rule (docs/program.md "Data")."""
    c = compile_file(spec, "data=1")
    out = {i.input.name: [] for i in c.plan.inputs}
    for n in range(count):
        rng = np.random.default_rng([c.spec.training.seed + 1, n])
        for i in c.plan.inputs:
            t = i.input.type
            if t.is_int:
                out[i.input.name].append(rng.integers(0, i.input.high, size=t.shape, dtype=np.int64).astype(t.dtype))
            else:
                out[i.input.name].append(rng.standard_normal(t.shape, dtype=np.float32))
    return {k: np.stack(v) for k, v in out.items()}


def arrays_program():
    """gpt-tiny reading `data: {kind: arrays}`: the files hold exactly its synthetic samples."""
    if not ARRAYS.exists():
        ARRAYS.mkdir()
        for name, a in synthetic_samples(GPT, 16 * 6).items():
            np.save(ARRAYS / f"{name}.npy", a)
    return gpt(edits=[("data: {kind: synthetic}", f"data: {{kind: arrays, path: {json.dumps(str(ARRAYS))}}}")])


def text_program():
    if not TEXT.exists():
        root = Path(__file__).resolve().parent.parent
        TEXT.write_text("\n".join(p.read_text() for p in sorted((root / "docs").glob("*.md"))))
    return gpt("data=1", [("data: {kind: synthetic}", f"data: {{kind: text, path: {json.dumps(str(TEXT))}}}")])


def launcher(program: Path, nproc: int) -> list[str]:
    return ["env", f"PYTHON={PY}", "bash", str(program / "launch.sh"), "--nproc", str(nproc)]


def first_runs():
    """The independent runs of this module (memoised; the tests below read them)."""
    return [
        (gpt(), "--steps", str(GPT_STEPS)),
        (gpt("data=1"), "--steps", str(GPT_STEPS)),
        (gpt(), "--steps", "5", "--checkpoint-dir", str(CKPT), "--checkpoint-every", "2"),
        (gpt(edits=ACCUM_SELECTIVE), "--steps", "6"),
        (gpt("data=1", REMAT_FULL), "--steps", "6"),
        (text_program(), "--steps", str(TEXT_STEPS)),
        (gpt(), "--steps", "0"),
    ]


@pytest.fixture(scope="module", autouse=True)
def runs():
    run_many(first_runs())


@pytest.mark.slow
def test_resume_10_steps_equals_5_plus_resume_5():
    full = gpt_full()
    first = run(gpt(), "--steps", "5", "--checkpoint-dir", str(CKPT), "--checkpoint-every", "2")
    assert sorted(os.listdir(CKPT)) == ["4", "5"], "orbax keeps the last two checkpoints, nothing half-written"
    second = run(gpt(), "--steps", "10", "--resume", str(CKPT))
    assert "resumed from" in second.output
    assert [r["step"] for r in second.metrics] == [6, 7, 8, 9, 10]
    both = np.concatenate([first.losses, second.losses])
    dl, dp = max_diff(both, full.losses), max_param_diff(second.params, full.params)
    report("resume 10 == 5 + resume 5 (data=2,fsdp=2,tensor=2)", max_dloss=dl, max_dparam=dp)
    assert dl <= 1e-6 and dp <= 1e-6


@pytest.mark.slow
def test_resume_on_another_mesh_reshards():
    """The 8-device checkpoint restored by the one-device build (orbax reshards on restore)."""
    full = gpt_full()
    run(gpt(), "--steps", "5", "--checkpoint-dir", str(CKPT), "--checkpoint-every", "2")
    other = run(gpt("data=1"), "--steps", "10", "--resume", str(CKPT))
    dl = max_diff(other.losses, full.losses[5:])
    report("resume the 8-device checkpoint on 1 device", max_dloss=dl)
    assert dl < 1e-5


@pytest.mark.slow
def test_two_processes_of_four_devices():
    """launch.sh starts 2 processes x 4 CPU devices (jax.distributed, gloo); each reads only its rows of
    every batch from memory-mapped arrays. Same losses as 1 process x 8 devices on synthetic data; the
    2-process checkpoint resumes in one process."""
    full = gpt_full()
    program = arrays_program()
    mp = run(program, "--steps", "6", "--checkpoint-dir", str(MP_CKPT), launcher=launcher(program, 2))
    assert mp.output.count("memory ") == 1, "only the first process prints"
    dl = max_diff(mp.losses, full.losses[:6])
    assert sorted(os.listdir(MP_CKPT)) == ["6"]
    resumed = run(gpt(), "--steps", "10", "--resume", str(MP_CKPT))
    dl2 = max_diff(resumed.losses, full.losses[6:])
    dp = max_param_diff(resumed.params, full.params)
    report("2 processes x 4 devices == 1 process x 8 (arrays data)", max_dloss=dl, resumed_in_1_process_dloss=dl2,
           max_dparam_after_10=dp)
    assert dl < 1e-5 and dl2 < 1e-5


@pytest.mark.slow
def test_arrays_data_equals_synthetic():
    program = arrays_program()
    got = run(program, "--steps", "6")
    dl = max_diff(got.losses, gpt_full().losses[:6])
    report("arrays on disk == synthetic samples", max_dloss=dl)
    assert dl <= 1e-6


@pytest.mark.slow
def test_text_data_trains():
    got = run(text_program(), "--steps", str(TEXT_STEPS))
    report("text data, 20 steps", first_loss=got.losses[0], last_loss=got.losses[-1])
    assert got.losses[-1] < got.losses[0] - 0.5


@pytest.mark.slow
def test_grad_accum_2_with_selective_remat_equals_plain():
    """Two micro-batches per step (a scan over [2, 8, ...] batches) under selective remat: the plain
    trajectory. (One run checks both; a bug in either would show.)"""
    got = run(gpt(edits=ACCUM_SELECTIVE), "--steps", "6")
    dl = max_diff(got.losses, gpt_full().losses[:6])
    report("grad_accum 2 + remat selective == plain (data=2,fsdp=2,tensor=2)", max_dloss=dl)
    assert dl < 1e-5


@pytest.mark.slow
def test_full_remat_equals_none():
    got = run(gpt("data=1", REMAT_FULL), "--steps", "6")
    dl = max_diff(got.losses, gpt_single().losses[:6])
    report("remat full == none (1 device)", max_dloss=dl)
    assert dl < 1e-5


@pytest.mark.slow
def test_bf16_params_truth():
    """bfloat16 parameters (and optimizer state) take half the bytes, as the planner says."""
    edits = [("params: float32, compute: float32", "params: bfloat16, compute: bfloat16")]
    got = run(gpt(edits=edits), "--steps", "0", export=False)
    plan = compile_file(spec_variant(GPT, tuple(edits))).plan
    assert got.memory["device0"]["params"] == plan.memory.params == gpt_full().memory["device0"]["params"] // 2
    assert got.memory["device0"]["optimizer"] == plan.memory.optimizer


@pytest.mark.slow
def test_wrong_device_count_exits_2():
    got = run(gpt(), "--steps", "1", env={"JAX_NUM_CPU_DEVICES": "4"}, expect_rc=2)
    assert "needs 8 device(s), but 4 are visible" in got.output
    assert "Traceback" not in got.output


@pytest.mark.slow
def test_steps_0_exports_the_numpy_init():
    got = run(gpt(), "--steps", "0")
    plan = compile_file(GPT).plan
    assert got.metrics == []
    assert sorted(got.params) == sorted(p.name for p in plan.params)
    for p in plan.params:
        want = reference_init.init(p.name, p.param.shape, p.param.init, p.param.std)
        assert got.params[p.name].dtype == np.float32
        assert np.array_equal(got.params[p.name], want), p.name


@pytest.mark.slow
def test_init_params_round_trip():
    init = run(gpt(), "--steps", "0").cwd / "params.npz"
    got = run(gpt("data=2,tensor=4"), "--steps", "4", "--init-params", str(init))
    dl = max_diff(got.losses, gpt_single().losses[:4])
    assert dl < 1e-5


@pytest.mark.slow
def test_dry_run_prints_layouts_and_planned_bytes():
    got = run(gpt(), "--dry-run", export=False, metrics=False)
    plan = compile_file(GPT).plan
    assert "mesh: {'data': 2, 'fsdp': 2, 'tensor': 2}" in got.output
    # the train state's parameters: a block's stacked over its 4 copies, each copy split as the plan says
    line = next(x for x in got.output.splitlines() if x.startswith("blocks.*.mlp.fc.weight "))
    assert "[4, 128, 512]" in line and line.endswith("[4, 64, 256]")
    line = next(x for x in got.output.splitlines() if x.startswith("device 0 bytes"))
    assert f"params {plan.memory.params}, optimizer state {plan.memory.optimizer}," in line
    assert "step " not in got.output


@pytest.mark.runs
def test_launch_script_rejects_a_bad_nproc():
    import subprocess

    p = subprocess.run(["bash", str(gpt() / "launch.sh"), "--nproc", "zero"], capture_output=True, text=True,
                       check=False)
    assert p.returncode == 2 and "--nproc must divide the 8 devices of this program's mesh, got 'zero'" in p.stderr


ZERO2 = (("  seed: 0\n", "  seed: 0\n  zero: 2\n"),)
MASTER = (("  seed: 0\n", "  seed: 0\n  zero: 1\n  precision: {params: bfloat16, compute: bfloat16, master_weights: true}\n"),)


@pytest.mark.slow
def test_zero_2_equals_one_device():
    """ZeRO-2 (optimizer state and gradients split over the batch axes) changes where things live, not the
    trajectory."""
    ref = run(build(MLP, "data=1"), "--steps", "6")
    got = run(build(MLP, None, ZERO2), "--steps", "6")
    dl = max_diff(got.losses, ref.losses)
    held = got.memory["device0"]
    report("zero 2 (mlp-dp, data=8) == 1 device", max_dloss=dl, optimizer_bytes=held["optimizer"],
           unsplit_optimizer_bytes=ref.memory["device0"]["optimizer"])
    assert dl < 1e-5
    assert held["optimizer"] < ref.memory["device0"]["optimizer"] / 4


@pytest.mark.slow
def test_master_weights_train_and_match_the_cost_model():
    """bfloat16 parameters with a float32 master copy (and ZeRO-1): trains like float32, and holds the
    bytes the cost model predicts (`plan --format json` "costs"; `totals.per_device` leaves these out)."""
    from mithril_spec.planner.costs import state_memory

    ref = run(build(MLP, "data=1"), "--steps", "6")
    got = run(build(MLP, None, MASTER), "--steps", "6")
    dl = max_diff(got.losses, ref.losses)
    assert np.isfinite(got.losses).all() and dl < 5e-2
    gpt_master = [(PRECISION, "precision: {params: bfloat16, compute: bfloat16, master_weights: true}\n  zero: 1")]
    for program, spec in ((build(MLP, None, MASTER), spec_variant(MLP, MASTER)),
                          (gpt(edits=gpt_master), spec_variant(GPT, tuple(gpt_master)))):
        held = run(program, "--steps", "0", export=False).memory["device0"]
        want = state_memory(compile_file(spec).plan)
        report(f"master weights + zero 1 bytes ({spec.name})", held=held, cost_model_params=want.params,
               cost_model_optimizer=want.optimizer)
        assert held["params"] == want.params
        # both split a tensor only along a dimension the batch axes divide (planner/states.py zero_dim), so a
        # tensor like mlp-dp's head.bias [10] stays whole on data=8, in the program and in the plan
        assert held["optimizer"] == want.optimizer
