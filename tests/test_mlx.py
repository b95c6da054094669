"""The MLX target (templates/mlx) on MLX's Linux CPU build.

- Across targets: for the MLP, the CNN, the GPT and tests/specs/all-ops.yaml (every operator the mlx
  target renders), built for one device, the MLX program trains 5 steps from the parameters the JAX
  program exported (--steps 0 --export-params, shared with test_cross_target) and its losses equal the
  JAX and PyTorch programs' within 1e-5; its exported parameters load into the JAX program unchanged.
- Data parallelism: 2 processes under the generated launch.sh (mlx.launch, ring backend) equal the
  1-process run.
- Checkpoints: resume continues the uninterrupted trajectory exactly (also on 2 processes from a
  1-process checkpoint); a corrupt newest checkpoint falls back to the previous one; a foreign one is
  refused.
- The contract's edges: the memory line equals the plan, the process-count check, launch.sh's exit code,
  --dry-run in one process for any mesh, and what `validate` refuses for mlx (E049 with the reason).
"""

from __future__ import annotations

import json
import re
import shutil

import jax_runs as jr
import mlx_runs as mr
import numpy as np
import pytest

# the JAX and torch runs of the cross-target test (memoised: run once for both files)
from test_cross_target import STEPS, _parallel, init_file, jax_run, mesh, spec_path, torch_run

from mithril_spec.cli import main as cli

SPECS = ["mlp-dp.yaml", "cnn-dp.yaml", "gpt-tiny.yaml", "all-ops"]
MLP = jr.SPECS / "mlp-dp.yaml"
CNN = jr.SPECS / "cnn-dp.yaml"
GPT = jr.SPECS / "gpt-tiny.yaml"
# the GPT's runs within MLX (against each other) on 4 samples a step, not 16: MLX's CPU build multiplies
# matrices with the reference BLAS (some 3 GFLOP/s here), and the comparisons hold at any batch size
SMALL_BATCH = (("batch_size: 16", "batch_size: 4"),)


def build(spec, mesh_, edits=()):
    return mr.build(spec, mesh_, (SMALL_BATCH if spec == GPT else ()) + tuple(edits))


def mlx_run(spec, *args):
    return mr.run(mr.build(spec_path(spec), mesh(spec)), "--steps", str(STEPS), "--init-params", str(init_file(spec)),
                  *args)


def mlp(mesh_=None, edits=()):
    return mr.build(MLP, mesh_, tuple(edits))


@pytest.fixture(scope="module")
def all_runs():  # (the slow tests' shared runs, started together)
    _parallel([lambda s=s: init_file(s) for s in SPECS])
    _parallel([f for s in SPECS for f in (lambda s=s: mlx_run(s), lambda s=s: jax_run(s), lambda s=s: torch_run(s))])


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
@pytest.mark.parametrize("spec", SPECS)
def test_same_losses_as_jax_and_torch(spec):
    m, j, t = mlx_run(spec), jax_run(spec), torch_run(spec)
    assert len(m.losses) == len(j.losses) == len(t.losses) == STEPS
    dj, dt = jr.max_diff(m.losses, j.losses), jr.max_diff(m.losses, t.losses)
    dp = jr.max_param_diff(m.params, j.params)
    jr.report(f"mlx {spec}: vs jax and torch", max_dloss_jax=dj, max_dloss_torch=dt, max_dparam_jax=dp)
    assert dj < 1e-5 and dt < 1e-5, f"{spec}: mlx losses differ from jax by {dj:.2e}, from torch by {dt:.2e}"
    assert dp < 1e-4


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
@pytest.mark.parametrize("spec", ["mlp-dp.yaml", "gpt-tiny.yaml"])
def test_mlx_export_loads_into_jax_unchanged(spec):
    exported = mlx_run(spec).params
    back = jr.run(jr.build(spec_path(spec), mesh(spec)), "--steps", "0", "--init-params",
                  str(mlx_run(spec).cwd / "params.npz")).params
    assert sorted(exported) == sorted(back) and all(exported[k].dtype == np.float32 for k in exported)
    assert jr.max_param_diff(exported, back) == 0.0


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
@pytest.mark.parametrize("spec", [MLP, CNN, GPT])
def test_two_processes_equal_one(spec):
    one = mr.run(build(spec, "data=1"), "--steps", "4")
    two = mr.run(build(spec, "data=2"), "--steps", "4", processes=2)
    d = jr.max_diff(one.losses, two.losses)
    jr.report(f"mlx {spec.name}: data=2 (2 processes) vs one", max_dloss=d,
              max_dparam=jr.max_param_diff(one.params, two.params))
    assert len(two.losses) == 4 and d < 1e-5
    assert jr.max_param_diff(one.params, two.params) < 1e-5
    assert two.memory["device0"] == two.memory["planned"]


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
def test_grad_accum_and_full_remat_equal_plain():
    edits = (("batch_size: 4", "batch_size: 4\n  grad_accum: 2"),
             ("compute: float32}", "compute: float32}\n  remat: full"))
    plain = mr.run(build(GPT, "data=1"), "--steps", "4")
    both = mr.run(build(GPT, "data=1", edits), "--steps", "4")
    assert jr.max_diff(plain.losses, both.losses) < 1e-5


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
def test_bf16_compute_trains():
    r = mr.run(mlp("data=1", (("clip_grad_norm: 1.0", "clip_grad_norm: 1.0\n  precision: {compute: bfloat16}"),)),
               "--steps", "20")
    ref = mr.run(mlp("data=1"), "--steps", "20")
    assert np.isfinite(r.losses).all() and jr.max_diff(r.losses, ref.losses) < 2e-2


@pytest.mark.runs
def test_memory_line_equals_the_plan():
    for spec in SPECS:
        m = mlx_run(spec).memory
        assert m["device0"] == m["planned"], spec


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
def test_resume_equals_the_uninterrupted_run(tmp_path):
    program = mlp("data=1")
    full = mr.run(program, "--steps", "6")
    ckpt = tmp_path / "ckpt"
    first = mr.run(program, "--steps", "3", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1")
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000002", "step_00000003"]  # the last two kept
    rest = mr.run(program, "--steps", "6", "--resume", str(ckpt))
    assert "resumed from" in rest.output and [r["step"] for r in rest.metrics] == [4, 5, 6]
    assert np.array_equal(np.concatenate([first.losses, rest.losses]), full.losses)
    # the same checkpoint on 2 processes (every process reads it) continues the data=2 trajectory
    two = mr.run(mlp("data=2"), "--steps", "6", "--resume", str(ckpt), processes=2)
    assert jr.max_diff(two.losses, full.losses[3:]) < 1e-5


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
def test_corrupt_foreign_and_missing_checkpoints(tmp_path):
    program = mlp("data=1")
    full = mr.run(program, "--steps", "4")
    ckpt = tmp_path / "ckpt"
    mr.run(program, "--steps", "3", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1")
    state = ckpt / "step_00000003" / "state.safetensors"
    data = bytearray(state.read_bytes())
    data[-7] ^= 0x01  # one flipped bit in the last array
    state.write_bytes(bytes(data))
    back = mr.run(program, "--steps", "4", "--resume", str(ckpt))
    assert "skipping checkpoint" in back.output and "corrupt" in back.output
    assert [r["step"] for r in back.metrics] == [3, 4]
    assert np.array_equal(back.losses, full.losses[2:])  # from step 2, the previous checkpoint
    # a checkpoint of another spec: refused by name, exit 2
    cnn_ckpt = tmp_path / "cnn"
    mr.run(mr.build(CNN, "data=1"), "--steps", "1", "--checkpoint-dir", str(cnn_ckpt))
    foreign = mr.run(program, "--steps", "4", "--resume", str(cnn_ckpt), expect_rc=2)
    assert "checkpoint of the spec 'cnn-dp'" in foreign.output and "Traceback" not in foreign.output
    # a model of other parameters: the first differences named, and the way to a warm start
    assert "(missing params/" in foreign.output and "unexpected params/conv" in foreign.output, foreign.output
    assert "pass --init-params FILE" in foreign.output
    shutil.rmtree(ckpt / "step_00000002")
    (ckpt / "step_00000003" / "train_state.json").unlink()
    gone = mr.run(program, "--steps", "4", "--resume", str(ckpt), expect_rc=2)
    assert "no usable checkpoint" in gone.output and "Traceback" not in gone.output
    empty = mr.run(program, "--steps", "4", "--resume", str(tmp_path), expect_rc=2)
    assert "no checkpoint there" in empty.output


@pytest.mark.runs
def test_fresh_run_refuses_a_directory_with_later_steps(tmp_path):
    program = mlp("data=1")
    ckpt = tmp_path / "later"
    mr.run(program, "--steps", "2", "--checkpoint-dir", str(ckpt))
    r = mr.run(program, "--steps", "2", "--checkpoint-dir", str(ckpt), expect_rc=2)
    assert "already holds checkpoints of steps after 0" in r.output


@pytest.mark.runs
def test_process_count_and_launcher_exit_codes():
    program = mlp("data=2")
    alone = mr.run(program, "--steps", "1", expect_rc=2)  # built for 2 processes, started as one
    assert "it needs 2 process(es), but 1 started" in alone.output and "Traceback" not in alone.output
    bad = mr.run(program, "--steps", "-1", processes=2, expect_rc=2)  # every process refuses its arguments
    assert "--steps must be >= 0" in bad.output


@pytest.mark.runs
def test_dry_run_needs_no_other_process():
    r = mr.run(mlp(), "--dry-run", export=False, metrics=False)  # the default mesh: data=8
    assert "8 process(es)" in r.output and "fc1.weight" in r.output
    line = next(x for x in r.output.splitlines() if x.startswith("per-process bytes "))
    figures = json.loads(line[len("per-process bytes "):])
    assert figures["held"] == figures["planned"] == {"params": 340008, "optimizer": 680016, "buffers": 0}


def _validate(tmp_path, capsys, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    rc = cli(["validate", str(path)])
    return rc, capsys.readouterr().err


def test_validate_refuses_what_mlx_cannot_run_with_the_reason(tmp_path, capsys):
    gpt = GPT.read_text().replace("name: gpt-tiny", "name: gpt-tiny\ntargets: [jax, mlx]")
    rc, err = _validate(tmp_path, capsys, gpt)
    assert rc == 1 and "error[E049]: the mlx target does not support the `fsdp` mesh axis" in err
    assert "MLX has no fully sharded data parallelism" in err and "supported axes: data" in err
    rc, err = _validate(tmp_path, capsys, gpt.replace("compute: float32}", "compute: float32}\n  remat: selective"))
    assert "`training.remat: selective`" in err and "mx.checkpoint recomputes a whole block" in err
    moe = (jr.SPECS / "moe-dp.yaml").read_text().replace("name: moe-dp", "name: moe-dp\ntargets: [mlx]")
    rc, err = _validate(tmp_path, capsys, moe)
    # (moe layers run: tests/test_mlx_moe.py; its mesh splits the experts over `expert`)
    assert rc == 1 and "the mlx target does not support the `expert` mesh axis" in err and "all-to-all" in err


def test_mlx_is_opt_in(tmp_path, capsys):
    """A spec without `targets:` is checked for jax and torch only; `build --target mlx` checks mlx anyway."""
    text = GPT.read_text()
    assert not re.search(r"^targets:", text, re.M)
    rc, err = _validate(tmp_path, capsys, text)
    assert rc == 0, err
    rc = cli(["build", str(GPT), "--target", "mlx", "-o", str(tmp_path / "out")])
    assert rc == 1 and "the mlx target does not support the `fsdp` mesh axis" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
def test_arrays_data_equals_synthetic_on_two_processes(tmp_path):
    from test_jax_program import synthetic_samples

    for name, a in synthetic_samples(MLP, 64 * 3).items():
        np.save(tmp_path / f"{name}.npy", a)
    edit = (("data: {kind: synthetic}", f"data: {{kind: arrays, path: {json.dumps(str(tmp_path))}}}"),)
    got = mr.run(mlp("data=2", edit), "--steps", "3", processes=2)
    assert jr.max_diff(got.losses, mr.run(mlp("data=1"), "--steps", "4").losses[:3]) < 1e-5


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
def test_dropout_masks_do_not_depend_on_the_number_of_processes():
    edit = (("- {op: relu, name: act1}", "- {op: relu, name: act1}\n    - {op: dropout, name: drop, rate: 0.25}"),)
    one = mr.run(mlp("data=1", edit), "--steps", "3")
    two = mr.run(mlp("data=2", edit), "--steps", "3", processes=2)
    plain = mr.run(mlp("data=1"), "--steps", "4")
    assert jr.max_diff(one.losses, two.losses) < 1e-5
    assert jr.max_diff(one.losses, plain.losses[:3]) > 1e-4  # the dropout layer is really there


MLP_TP = jr.SPECS / "mlp-tp.yaml"


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
@pytest.mark.parametrize("spec", [MLP_TP, GPT])
def test_tensor_parallel_equals_one_process(spec):
    """A mesh of `tensor` alone: Megatron's column- and row-parallel layers over 2 processes."""
    one = mr.run(build(spec, "data=1"), "--steps", "4")
    two = mr.run(build(spec, "tensor=2"), "--steps", "4", processes=2)
    d, dp = jr.max_diff(one.losses, two.losses), jr.max_param_diff(one.params, two.params)
    jr.report(f"mlx {spec.name}: tensor=2 (2 processes) vs one", max_dloss=d, max_dparam=dp)
    assert d < 1e-5 and dp < 1e-5
    assert two.memory["device0"] == two.memory["planned"]
    assert two.memory["device0"]["params"] < one.memory["device0"]["params"]  # really split


@pytest.mark.slow
@pytest.mark.usefixtures("all_runs")
def test_tensor_parallel_checkpoints_hold_whole_arrays(tmp_path):
    """Saved on tensor=2, resumed by one process (and the other way round), on the same trajectory."""
    full = mr.run(mr.build(MLP_TP, "data=1"), "--steps", "4")
    ckpt = tmp_path / "tp"
    mr.run(mr.build(MLP_TP, "tensor=2"), "--steps", "2", "--checkpoint-dir", str(ckpt), processes=2)
    one = mr.run(mr.build(MLP_TP, "data=1"), "--steps", "4", "--resume", str(ckpt))
    assert jr.max_diff(one.losses, full.losses[2:]) < 1e-5
    ckpt1 = tmp_path / "one"
    mr.run(mr.build(MLP_TP, "data=1"), "--steps", "2", "--checkpoint-dir", str(ckpt1))
    two = mr.run(mr.build(MLP_TP, "tensor=2"), "--steps", "4", "--resume", str(ckpt1), processes=2)
    assert jr.max_diff(two.losses, full.losses[2:]) < 1e-5


def test_tensor_parallel_limits(tmp_path, capsys):
    tp = MLP_TP.read_text().replace("name: mlp-tp", "name: mlp-tp\ntargets: [mlx]")
    rc, err = _validate(tmp_path, capsys, tp)  # its meshes combine data and tensor
    assert rc == 1 and "does not combine the `tensor` mesh axis with `data`" in err and "ring backend" in err
    rc = cli(["validate", str(tmp_path / "s.yaml"), "--mesh", "tensor=4"])
    assert rc == 0, capsys.readouterr().err
    drop = tp.replace("- {op: gelu, name: act}", "- {op: gelu, name: act}\n    - {op: dropout, name: drop, rate: 0.1}")
    assert drop != tp
    (tmp_path / "s.yaml").write_text(drop)
    rc = cli(["validate", str(tmp_path / "s.yaml"), "--mesh", "tensor=2"])
    assert rc == 1 and "no dropout above rate 0 in a tensor-parallel build" in capsys.readouterr().err


@pytest.mark.runs
def test_tensor_parallel_dry_run_shows_the_slices():
    r = mr.run(mr.build(MLP_TP, "tensor=2"), "--dry-run", export=False, metrics=False)
    line = next(x for x in r.output.splitlines() if x.startswith("per-process bytes "))
    figures = json.loads(line[len("per-process bytes "):])
    assert figures["held"] == figures["planned"]
    assert "fc1.weight" in r.output and "[128, 512]" in r.output
