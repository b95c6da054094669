"""The generated PyTorch program's interface and features (docs/program.md), with gloo ranks on CPU:
resume (6 steps == 3 + resume + 3), resharding a checkpoint from 4 ranks to 2, gradient accumulation
without needless gradient syncs, --steps 0 export and --init-params, the world-size check, the real
torchrun path through the generated launch.sh, --dry-run, remat, bf16, --compile, data on disk, and every
operator (tests/specs/all-ops.yaml)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import reference_init
from torch_runs import (
    GPT,
    GPT_STEPS,
    HALF,
    SPECS,
    TESTS,
    WORK,
    build,
    ckpt_dir,
    equivalence_jobs,
    max_diff,
    max_param_diff,
    parallel,
    reference,
    report,
    run,
    run_many,
)

from mithril_spec.frontend import compile_file

MLP = SPECS / "mlp-dp.yaml"
ALL_OPS = TESTS / "specs" / "all-ops.yaml"
ARRAYS = WORK / "arrays-mlp"
REMAT_FULL = (("  seed: 0\n", "  seed: 0\n  remat: full\n"),)
ACCUM = (("  batch_size: 16\n", "  batch_size: 16\n  grad_accum: 2\n"),)
DROPOUT = (("    - {op: relu, name: act1}\n",
             "    - {op: relu, name: act1}\n    - {op: dropout, name: drop, rate: 0.5}\n"),)


def _run(job):
    kw = job[-1] if isinstance(job[-1], dict) else {}
    return run(*(job[:-1] if isinstance(job[-1], dict) else job), **kw)


def gpt_single(n=GPT_STEPS):
    return run(*reference("gpt-tiny.yaml", n))


def write_arrays():
    """mlp-dp's synthetic samples 0..319 by the documented rule, as .npy files (data: arrays)."""
    if ARRAYS.exists():
        return
    c = compile_file(MLP, "data=1")
    cols = {i.input.name: [] for i in c.plan.inputs}
    for n in range(5 * c.spec.training.batch_size):
        rng = np.random.default_rng([c.spec.training.seed + 1, n])
        for i in c.plan.inputs:
            t = i.input.type
            if t.is_int:
                cols[i.input.name].append(rng.integers(0, i.input.high, size=t.shape, dtype=np.int64).astype(t.dtype))
            else:
                cols[i.input.name].append(rng.standard_normal(t.shape, dtype=np.float32))
    ARRAYS.mkdir()
    for name, rows in cols.items():
        np.save(ARRAYS / f"{name}.npy", np.stack(rows))


def numpy_init(spec, seed=0):
    """The documented initialisation (docs/program.md), written out independently of the programs."""
    out = {}
    for p in compile_file(spec, "data=1").plan.params:
        out[p.name] = reference_init.init(p.name, p.param.shape, p.param.init, p.param.std, seed)
    return out


def jobs():
    """Every run of this module except the ones that depend on another run's output."""
    write_arrays()
    arrays = build(MLP, "data=1", (("data: {kind: synthetic}", f"data: {{kind: arrays, path: {ARRAYS}}}"),))
    return equivalence_jobs() + [
        reference("gpt-tiny.yaml", HALF) + ("--checkpoint-dir", str(ckpt_dir("single")), {}),
        (build(GPT, "data=1"), "--steps", "0"),
        reference("gpt-tiny.yaml", 5),
        (build(GPT, "data=2,fsdp=2", ACCUM), "--steps", str(GPT_STEPS), {"count": True}),
        (build(GPT, "data=1", (("  seed: 0\n", "  seed: 0\n  remat: full\n"),)), "--steps", "5"),
        (build(GPT, "data=1", (("  seed: 0\n", "  seed: 0\n  remat: selective\n"),)), "--steps", "5"),
        (build(GPT, "data=1", (("compute: float32", "compute: bfloat16"),)), "--steps", "5"),
        (build(MLP, "data=1"), "--steps", "5", "--compile"),
        (arrays, "--steps", "5"),
        (build(ALL_OPS, "single"), "--steps", "3"),
        (build(ALL_OPS, "single", REMAT_FULL), "--steps", "3"),
        (build(ALL_OPS, "two"), "--steps", "3"),
        (build(GPT, "fsdp_tp"), "--dry-run", {"export": False, "metrics": False}),
        (build(MLP, "data=1", DROPOUT), "--steps", "5"),
    ]


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    run_many(jobs())


# ---------------------------------------------------------------- checkpoints


@pytest.mark.slow
def test_resume_one_process_equals_the_run_without_a_break():
    full = gpt_single()
    first = _run(reference("gpt-tiny.yaml", HALF) + ("--checkpoint-dir", str(ckpt_dir("single")), {}))
    assert sorted(os.listdir(ckpt_dir("single"))) == [f"step_{HALF:08d}"]  # no temporary directory left
    second = run(build(GPT, "data=1"), "--steps", str(GPT_STEPS), "--resume", str(ckpt_dir("single")))
    assert "resumed from" in second.output
    both = np.concatenate([first.losses, second.losses])
    d = max_diff(both, full.losses)
    dp = max_param_diff(second.params, full.params)
    report(f"torch resume 1 process: {HALF} + {GPT_STEPS - HALF} vs {GPT_STEPS}", max_dloss=d, max_dparam=dp)
    assert [r["step"] for r in second.metrics] == list(range(HALF + 1, GPT_STEPS + 1))
    assert d < 1e-6 and dp < 1e-6


@pytest.mark.slow
def test_resume_sharded_fsdp_tp():
    """fsdp=2 x tensor=2: the equivalence run saved step HALF; resuming there retraces the steps after it."""
    full = _run(parallel("gpt-tiny.yaml", "fsdp_tp"))
    assert sorted(os.listdir(ckpt_dir("fsdp_tp"))) == [f"step_{HALF:08d}", f"step_{GPT_STEPS:08d}"]
    resumed = run(build(GPT, "fsdp_tp"), "--steps", str(GPT_STEPS), "--resume",
                  str(ckpt_dir("fsdp_tp") / f"step_{HALF:08d}"))
    d = max_diff(resumed.losses, full.losses[HALF:])
    dp = max_param_diff(resumed.params, full.params)
    report(f"torch resume fsdp=2 x tensor=2 at step {HALF}", max_dloss=d, max_dparam=dp)
    assert d < 1e-6 and dp < 1e-6


@pytest.mark.slow
def test_reshard_4_ranks_to_2():
    """A checkpoint saved on fsdp=4 (4 ranks) resumes on a build for fsdp=2 (2 ranks): DCP reshards."""
    saved = _run(parallel("gpt-tiny.yaml", "fsdp=4"))
    resumed = run(build(GPT, "fsdp=2"), "--steps", str(GPT_STEPS), "--resume",
                  str(ckpt_dir("fsdp=4") / f"step_{HALF:08d}"))
    d_self = max_diff(resumed.losses, saved.losses[HALF:])
    d_ref = max_diff(resumed.losses, gpt_single().losses[HALF:])
    report(f"torch reshard fsdp=4 -> fsdp=2 at step {HALF}", max_dloss_vs_fsdp4=d_self,
           max_dloss_vs_1_process=d_ref)
    assert d_self < 1e-5 and d_ref < 1e-5
    assert [r["step"] for r in resumed.metrics] == list(range(HALF + 1, GPT_STEPS + 1))


# ---------------------------------------------------------------- gradient accumulation


@pytest.mark.slow
def test_grad_accum_hsdp_without_extra_syncs():
    """grad_accum 2 on data=2 x fsdp=2 matches one process, and runs exactly as many FSDP2 gradient
    collectives as grad_accum 1: the first micro-step of each step syncs nothing."""
    ref = gpt_single()
    one = _run(parallel("gpt-tiny.yaml", "data=2,fsdp=2"))
    two = run(build(GPT, "data=2,fsdp=2", ACCUM), "--steps", str(GPT_STEPS), count=True)
    d = max_diff(two.losses, ref.losses)
    c1, c2 = one.collectives(), two.collectives()
    report("torch grad_accum 2 on data=2 x fsdp=2", max_dloss=d, collectives_accum1=c1[0], collectives_accum2=c2[0])
    assert d < 1e-5
    assert len(c1) == len(c2) == 4 and c1 == c2, (c1, c2)
    assert c1[0]["reduce_scatter"] > 0


# ---------------------------------------------------------------- parameters in and out


@pytest.mark.slow
def test_steps_0_export_is_the_numpy_init_and_init_params_round_trip(tmp_path):
    exported = run(build(GPT, "data=1"), "--steps", "0").params
    expected = numpy_init(GPT)
    assert sorted(exported) == sorted(expected)
    assert max_param_diff(exported, expected) == 0.0
    # a sharded, tensor-parallel build loads the file (transposing nn.Linear weights) and gives it back
    init = tmp_path / "init.npz"
    np.savez(init, **exported)
    back = run(build(GPT, "fsdp_tp"), "--steps", "0", "--init-params", str(init)).params
    assert max_param_diff(back, exported) == 0.0
    report("torch --steps 0 export == numpy init; fsdp_tp --init-params round trip", max_dparam=0.0)


# ---------------------------------------------------------------- launching


@pytest.mark.slow
def test_wrong_world_size_exits_2(tmp_path):
    prog = build(GPT, "fsdp_tp")
    alone = run(prog, "--steps", "1", ranks=1, expect_rc=2, export=False, metrics=False)
    assert "needs 4 rank(s), but WORLD_SIZE is 1" in alone.output
    assert "Launch it with `torchrun --nproc-per-node 4 train.py` (or launch.sh)" in alone.output
    two = run(prog, "--steps", "1", ranks=2, expect_rc=2, export=False, metrics=False)
    assert "needs 4 rank(s), but WORLD_SIZE is 2" in two.output
    assert "Traceback" not in alone.output + two.output
    # generate.py (train.py's setup) names itself: launch.sh starts train.py, not it
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    np.savez(tmp_path / "p.npz")  # (a file: the ranks are checked before the parameters are read)
    gen = subprocess.run([sys.executable, str(prog / "generate.py"), "--params", str(tmp_path / "p.npz"), "--prompt-ids", "1"],
                         cwd=prog, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert gen.returncode == 2, gen.stderr
    assert "Launch it with `torchrun --nproc-per-node 4 generate.py`, or rebuild" in gen.stderr, gen.stderr
    assert "launch.sh" not in gen.stderr and gen.stderr.count("\n") == 1, gen.stderr


@pytest.mark.slow
def test_real_torchrun_through_launch_sh():
    """The generated launch.sh (torchrun --standalone, 2 processes: each imports torch, seconds of CPU) trains
    like one process, and every rank shuts down cleanly (no gloo abort)."""
    ref = run(*reference("mlp-dp.yaml"))
    r = run(build(MLP, "data=2"), "--steps", "5", launcher="launch.sh")
    d = max_diff(r.losses, ref.losses)
    report("torch launch.sh (torchrun) data=2 vs 1 process", max_dloss=d, seconds=round(r.seconds, 1))
    assert d < 1e-5
    assert "terminate called" not in r.output and "SIGABRT" not in r.output
    assert r.output.count("step 5/") == 1  # logs from rank 0 only


@pytest.mark.slow
def test_multi_node_rendezvous_through_launch_sh(tmp_path):
    """launch.sh's several-machine path (NNODES=2: torchrun --nnodes 2 with a c10d rendezvous), played
    by two launch.sh processes on this machine, 1 rank each: the 2 ranks train like one process."""
    import subprocess

    from torch_runs import env_for, free_port

    prog = build(MLP, "data=2")
    env = env_for({"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RDZV_ID": "test"})
    flags = ["--steps", "5", "--checkpoint-dir", ""]
    nodes = [subprocess.Popen([str(prog / "launch.sh"), *flags, "--metrics", str(tmp_path / f"m{i}.jsonl")],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = [n.communicate(timeout=300)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs
    written = [f for f in tmp_path.glob("m*.jsonl")]
    assert len(written) == 1  # rank 0 only, on whichever node the rendezvous made rank 0
    losses = [json.loads(line)["loss"] for line in written[0].read_text().splitlines()]
    d = max_diff(losses, run(*reference("mlp-dp.yaml")).losses)
    report("torch launch.sh NNODES=2 (c10d rendezvous, 2 x 1 rank) vs 1 process", max_dloss=d)
    assert d < 1e-5


@pytest.mark.slow
def test_dry_run_shows_layouts_and_planned_bytes():
    out = run(build(GPT, "fsdp_tp"), "--dry-run", export=False, metrics=False).output
    assert "mesh: data=1, fsdp=2, tensor=2 (4 rank(s))" in out
    assert "blocks.3.attn.q.weight" in out and "fsdp,tensor: S(1), S(0)" in out
    plan = compile_file(GPT, "fsdp_tp").plan.memory
    for r in range(4):
        assert (f'rank {r} bytes: {{"params": {plan.params}, "grads": {plan.grads}, '
                f'"optimizer": {plan.optimizer}, "buffers": 0}}') in out


# ---------------------------------------------------------------- training options


@pytest.mark.slow
def test_remat_full_and_selective():
    ref = run(*reference("gpt-tiny.yaml", 5))
    for mode in ("full", "selective"):
        r = run(build(GPT, "data=1", (("  seed: 0\n", f"  seed: 0\n  remat: {mode}\n"),)), "--steps", "5")
        d = max_diff(r.losses, ref.losses)
        report(f"torch remat {mode} vs none, 1 process", max_dloss=d)
        assert d < 1e-6


@pytest.mark.slow
def test_bf16_autocast():
    """bfloat16 compute in one process (torch.autocast) trains within 16-bit rounding of float32. (FSDP2's
    MixedPrecisionPolicy, and bfloat16 under every other parallelism, against this one-process build: the
    capability matrix.)"""
    ref = run(*reference("gpt-tiny.yaml", 5))
    auto = run(build(GPT, "data=1", (("compute: float32", "compute: bfloat16"),)), "--steps", "5")
    da = max_diff(auto.losses, ref.losses)
    report("torch bf16 compute vs fp32", autocast_1_process=da)
    assert 0 < da < 5e-2


@pytest.mark.slow
def test_compile():
    ref = run(*reference("mlp-dp.yaml"))
    r = run(build(MLP, "data=1"), "--steps", "5", "--compile")
    d = max_diff(r.losses, ref.losses)
    report("torch --compile vs eager, mlp-dp 1 process", max_dloss=d, seconds=round(r.seconds, 1))
    assert d < 1e-5
    assert sorted(r.params) == sorted(ref.params)  # canonical names survive compile


@pytest.mark.slow
def test_data_arrays_on_disk():
    write_arrays()
    ref = run(*reference("mlp-dp.yaml"))
    prog = build(MLP, "data=1", (("data: {kind: synthetic}", f"data: {{kind: arrays, path: {ARRAYS}}}"),))
    d = max_diff(run(prog, "--steps", "5").losses, ref.losses)
    report("torch data: arrays vs synthetic", max_dloss=d)
    assert d < 1e-6


@pytest.mark.slow
def test_dropout_drops():
    """Dropout 0.5 changes the training (it does drop). (Masks that do not depend on the mesh: the capability
    matrix's dropout cells, every parallelism against one process.)"""
    ref = run(*reference("mlp-dp.yaml"))
    one = run(build(MLP, "data=1", DROPOUT), "--steps", "5")
    assert max_diff(one.grad_norms, ref.grad_norms) > 1e-3


# ---------------------------------------------------------------- every operator


@pytest.mark.slow
def test_all_ops():
    """Every operator trains (3 steps, finite losses), and data=2 matches one process: batch_norm's
    statistics are those of the whole batch, over both ranks (SyncBatchNorm's semantics)."""
    r = run(build(ALL_OPS, "single"), "--steps", "3")
    assert np.all(np.isfinite(r.losses)) and len(r.losses) == 3
    two = run(build(ALL_OPS, "two"), "--steps", "3")
    d = max_diff(two.losses, r.losses)
    # (conv.bias feeds a batch_norm, which removes it: its gradient is rounding noise that Adam scales up)
    dp = max_param_diff(two.params, r.params)
    report("torch all-ops data=2 vs 1 process (batch_norm over both ranks)", max_dloss=d, max_dparam=dp)
    assert d < 1e-5 and dp < 1e-4, (d, dp)
    # full remat recomputes every block, batch_norm inside one too: same losses, statistics updated once
    remat = run(build(ALL_OPS, "single", REMAT_FULL), "--steps", "3")
    assert max_diff(remat.losses, r.losses) < 1e-6

