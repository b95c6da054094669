"""The `communication` section: gradient compression, collective algorithm, bucket size, overlap, prefetch.

The plan: compressed bytes (fp16/bf16: 2 bytes an element; PowerSGD: the [n, r] and [m, r] factors of each
matrix worth compressing) and the algorithm's cost formula (ring, double binary tree, the cheaper). The
targets: E049 for what a build cannot realise. The programs: a torch DDP build's fp16/bf16 hook equals the
explicit cast reference bit for bit and sends the planned bytes (tests/communication_check.py counts them),
as PowerSGD does from its start step; PowerSGD and FSDP2's bf16 reduction train a learnable toy into the
uncompressed run's loss band; the jax program runs with its XLA flags and NCCL_ALGO set, numerics unchanged.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys

import jax_runs
import numpy as np
import pytest
from program_files import program_text
from torch_runs import TESTS, WORK, build, env_for, report, run_many, spec_variant

from mithril_spec import cli
from mithril_spec.frontend import compile_file
from mithril_spec.lowering import check_target
from mithril_spec.planner.costs import collective_time, costs_to_json, estimate, ring_time, tree_time
from mithril_spec.planner.hardware import BUILTIN
from mithril_spec.render.build import render_files

GPT = TESTS.parent / "specs" / "gpt-tiny.yaml"
MOE = TESTS.parent / "specs" / "moe-dp.yaml"
H100 = BUILTIN["h100-sxm-80gb"]
TOY_DATA = WORK / "communication-toy"

# A learnable toy: y = argmax(x W) for a fixed W (arrays written by toy_spec), an MLP over data=2.
TOY = """\
version: 1
name: comm-toy
targets: [jax, torch, mlx]
dims: {features: 16, hidden: 64, classes: 4}
model:
  inputs:
    x: {shape: [batch, features], dtype: float32}
    y: {shape: [batch], dtype: int32}
  layers:
    - {op: linear, name: fc1, dimension: hidden, input: x}
    - {op: relu, name: act1}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
meshes:
  two: {data: 2}
  sharded: {fsdp: 2}
  one: {data: 1}
training:
  batch_size: 32
  steps: 60
  optimizer: {name: adam, lr: 1.0e-2}
COMMUNICATION
data: {kind: arrays, path: DATA}
"""


def toy_spec(communication: str = "") -> object:
    """The toy spec with `communication` (YAML lines; "" for none), written once per variant."""
    if not TOY_DATA.exists():
        TOY_DATA.mkdir(parents=True)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2048, 16), dtype=np.float32)
        w = rng.standard_normal((16, 4)).astype(np.float32)
        np.save(TOY_DATA / "x.npy", x)
        np.save(TOY_DATA / "y.npy", (x @ w).argmax(1).astype(np.int32))
    text = TOY.replace("COMMUNICATION\n", communication + "\n" if communication else "").replace("DATA", str(TOY_DATA))
    path = WORK / "specs" / f"comm-toy-{abs(hash(communication))}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def plan_of(path, mesh=None, hardware=None):
    c = compile_file(path, mesh)
    return c, estimate(c.plan, hardware)


def grad_sync(costs):
    (c,) = [c for c in costs.collectives if c.what.startswith("gradient all-reduce")]
    return c


def e049(path, mesh, target) -> list[str]:
    c = compile_file(path, mesh)
    return [d.message + " / " + (d.help or "") for d in check_target(c.plan, c.doc, target) if d.code == "E049"]


# -- the spec and the plan


def test_spec_forms_and_errors():
    c = compile_file(toy_spec("communication: {compression: {name: powersgd, rank: 3}, algorithm: tree}"), "two")
    comm = c.spec.communication
    assert comm.powersgd.rank == 3 and comm.powersgd.start_step == 1000 and comm.algorithm == "tree"
    assert compile_file(toy_spec(), "two").spec.communication.compression == "none"
    for bad in ("communication: {compression: int8}", "communication: {compression: {name: powersgd, start_step: 1}}",
                "communication: {bucket_mb: 0}", "communication: {algorithm: butterfly}"):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = cli.main(["validate", str(toy_spec(bad))])
        assert rc == 1 and "error[" in err.getvalue() and "communication" in err.getvalue(), (bad, err.getvalue())


def test_plan_counts_compressed_bytes():
    _, plain = plan_of(toy_spec(), "two")
    numel = 16 * 64 + 64 + 64 * 4 + 4
    assert grad_sync(plain).bytes == 4 * numel and grad_sync(plain).compression == "none"
    for kind in ("fp16", "bf16"):
        _, costs = plan_of(toy_spec(f"communication: {{compression: {kind}}}"), "two")
        c = grad_sync(costs)
        assert c.bytes == 2 * numel and c.compression == kind and f"{kind}-compressed" in c.what
    _, costs = plan_of(toy_spec("communication: {compression: {name: powersgd, rank: 1, start_step: 5}}"), "two")
    # fc1.weight [16, 64]: factors (16 + 64) x 1 = 80 elements (2 x 80 < 1024); head.weight [64, 4]: 68 (136 < 256);
    # the biases (64, 4) whole: r' = 1 and (n + 1) x 2 >= n
    assert grad_sync(costs).bytes == 4 * (80 + 68 + 64 + 4)
    assert "PowerSGD rank 1 from step 5" in grad_sync(costs).what
    # FSDP2's reduce dtype: every fsdp reduce-scatter halves, the all-gathers keep their bytes
    _, base = plan_of(GPT, "fsdp=2")
    c, packed = plan_of(spec_variant(GPT, (("data: {kind: synthetic}",
                                                     "communication: {compression: bf16}\ndata: {kind: synthetic}"),)),
                        "fsdp=2")
    def of(costs, kind):
        return sorted((c.bytes, c.count) for c in costs.collectives if c.kind == kind)

    assert of(base, "reduce-scatter") and of(base, "reduce-scatter") == [(2 * b, n) for b, n in of(packed, "reduce-scatter")]
    assert of(base, "all-gather") == of(packed, "all-gather")
    doc = costs_to_json(packed)
    assert {x["compression"] for x in doc["collectives"] if x["kind"] == "reduce-scatter"} == {"bf16"}
    assert {x["compression"] for x in doc["collectives"] if x["kind"] == "all-gather"} == {"none"}


def test_algorithm_cost_formulas():
    payload, bw, lat = 64e6, 50e9, 8e-6
    for n in (2, 8, 64):
        ring = 2 * (n - 1) / n * payload / bw + 2 * (n - 1) * lat
        tree = 2 * payload / bw + 2 * math.ceil(math.log2(n)) * lat
        assert ring_time("all-reduce", payload, n, bw, lat) == pytest.approx(ring)
        assert tree_time(payload, n, bw, lat) == pytest.approx(tree)
        assert collective_time("all-reduce", payload, n, bw, lat, "tree") == (pytest.approx(tree), "tree")
        assert collective_time("all-reduce", payload, n, bw, lat, "auto")[0] == pytest.approx(min(ring, tree))
        # NCCL's tree is an all-reduce: the other collectives stay rings
        assert collective_time("all-gather", payload, n, bw, lat, "tree")[1] == "ring"
    # small payloads over many devices: latency-bound, the tree wins; large ones over few: the ring
    assert collective_time("all-reduce", 4, 64, bw, lat, "auto")[1] == "tree"
    assert collective_time("all-reduce", 1e9, 2, bw, lat, "auto")[1] == "ring"
    times = {}
    for algo in ("ring", "tree", "auto"):
        _, costs = plan_of(toy_spec(f"communication: {{algorithm: {algo}}}"), "two", H100)
        times[algo] = costs.time
        assert costs_to_json(costs)["time"]["algorithms"] == list(costs.time.algorithms)
    assert set(times["ring"].algorithms) == {"ring"} and set(times["tree"].algorithms) == {"tree"}
    assert times["auto"].collective_s == tuple(min(a, b) for a, b in zip(times["ring"].collective_s,
                                                                          times["tree"].collective_s))


def test_overlap_and_prefetch_in_the_plan():
    _, hidden = plan_of(toy_spec(), "two", H100)
    _, exposed = plan_of(toy_spec("communication: {overlap: false}"), "two", H100)
    assert exposed.time.exposed_comm_s == exposed.time.overlapped_comm_s > hidden.time.exposed_comm_s
    deeper = spec_variant(GPT, (("data: {kind: synthetic}",
                                          "communication: {prefetch: 3}\ndata: {kind: synthetic}"),))
    one, three = plan_of(GPT, "fsdp=2")[1], plan_of(deeper, "fsdp=2")[1]
    assert three.worst.temporaries.gathered_params > one.worst.temporaries.gathered_params


# -- the targets


def test_e049_for_what_a_build_cannot_realise():
    fp16 = toy_spec("communication: {compression: fp16}")
    assert e049(fp16, "two", "torch") == [] and e049(fp16, "sharded", "torch") == []
    assert e049(fp16, "two", "jax") == [] and e049(fp16, "one", "jax") == []
    (jax,) = e049(fp16, "sharded", "jax")
    assert "`fsdp` axis" in jax and "reduce-scatter" in jax
    dropout = spec_variant(fp16, (("    - {op: relu, name: act1}\n",
                                   "    - {op: relu, name: act1}\n    - {op: dropout, name: drop, rate: 0.1}\n"),))
    (jax,) = e049(dropout, "two", "jax")
    assert "dropout layer `drop`" in jax and "masks" in jax
    (mlx,) = e049(fp16, "two", "mlx")
    assert "average_gradients" in mlx
    powersgd = toy_spec("communication: {compression: {name: powersgd, rank: 2}}")
    (msg,) = e049(powersgd, "sharded", "torch")
    assert "PowerSGD" in msg and "FSDP2" in msg
    assert e049(powersgd, "two", "jax") == []
    (msg,) = e049(spec_variant(powersgd, (("  steps: 60\n", "  steps: 60\n  zero: 1\n"),)), "two", "jax")
    assert "PowerSGD all-reduces its factors whole" in msg
    zero2 = spec_variant(fp16, (("  steps: 60\n", "  steps: 60\n  zero: 2\n"),))
    assert any("zero: 2" in m for m in e049(zero2, "two", "torch"))
    moe = spec_variant(MOE, (("data: {kind: synthetic}",
                                       "communication: {compression: bf16}\ndata: {kind: synthetic}"),))
    assert any("`expert` axis" in m for m in e049(moe, None, "torch"))
    bucket = toy_spec("communication: {bucket_mb: 4}")
    assert e049(bucket, "two", "torch") == [] and e049(bucket, "two", "jax") == []
    assert any("bucket_cap_mb" in m for m in e049(bucket, "sharded", "torch"))
    no_overlap = toy_spec("communication: {overlap: false}")
    assert e049(no_overlap, "two", "jax") == [] and len(e049(no_overlap, "two", "torch")) == 1
    prefetch = toy_spec("communication: {prefetch: 2}")
    assert e049(prefetch, "sharded", "torch") == [] and len(e049(prefetch, "sharded", "jax")) == 1
    tree = toy_spec("communication: {algorithm: tree}")
    assert e049(tree, "two", "torch") == [] and len(e049(tree, "two", "mlx")) == 1


def test_rendered_settings():
    c = compile_file(toy_spec("communication: {algorithm: ring, bucket_mb: 4, overlap: true}"), "two")
    torch_files = render_files(c, "torch", "comm")
    assert "export NCCL_ALGO=Ring" in torch_files["launch.sh"]
    assert "bucket_cap_mb=4" in program_text(torch_files)
    jax_files = render_files(c, "jax", "comm")
    jax_file = program_text(jax_files)  # the settings, passed to runtime/jax/devices.py's start_devices
    assert '"--xla_gpu_all_reduce_combine_threshold_bytes=4194304"' in jax_file
    assert '"--xla_gpu_enable_latency_hiding_scheduler=true"' in jax_file and 'nccl_algo="Ring"' in jax_file
    devices = jax_files["runtime/jax/devices.py"]
    assert 'os.environ["NCCL_ALGO"] = nccl_algo' in devices and "*xla_flags]" in devices
    assert "start_devices(args, MESH, tf32=TF32)" in program_text(render_files(compile_file(toy_spec(), "two"), "jax", "c"))
    plain = render_files(compile_file(toy_spec(), "two"), "torch", "comm")
    assert "NCCL_ALGO" not in plain["launch.sh"] and "compress_gradients" not in program_text(plain)


# -- the programs


@pytest.fixture(scope="module")
def toy_runs():
    """The toy, 60 steps: uncompressed (DDP), PowerSGD rank 1 from step 5 (DDP), FSDP2 reducing in bf16."""
    jobs = [
        (build(toy_spec(), "two"),),
        (build(toy_spec("communication: {compression: {name: powersgd, rank: 1, start_step: 5}}"), "two"),),
        (build(toy_spec("communication: {compression: bf16}"), "sharded"),),
    ]
    return run_many(jobs)


def test_torch_hooks_match_the_cast_reference_and_send_the_planned_bytes():
    specs = {"fp16": "communication: {compression: fp16}", "bf16": "communication: {compression: bf16}",
             "powersgd": "communication: {compression: {name: powersgd, rank: 1, start_step: 2}}"}
    out = WORK / "communication-check.json"
    builds = [f"{kind}={build(toy_spec(text), 'two')}" for kind, text in specs.items()]
    proc = subprocess.run([sys.executable, str(TESTS / "communication_check.py"), str(out), *builds],
                          env=env_for(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    for kind, text in specs.items():
        planned = grad_sync(plan_of(toy_spec(text), "two")[1]).bytes
        measured = got[kind]["bytes"]
        report(f"torch {kind} compression", planned_bytes=planned, measured_bytes=measured,
               uncompressed_bytes=4 * got[kind]["numel"], **{k: v for k, v in got[kind].items() if k != "bytes"})
        if kind == "powersgd":  # plain all-reduces before the start step, then the factors
            assert measured[:2] == [4 * got[kind]["numel"]] * 2 and measured[2] == planned
        else:
            assert measured == [planned] * 3
            assert got[kind]["equal"] and got[kind]["max_diff"] == 0.0
            assert got[kind]["diff_from_float32"] > 0  # the cast did change the gradients


@pytest.mark.runs
def test_compressed_training_reaches_the_uncompressed_loss_band(toy_runs):
    plain, powersgd, fsdp_bf16 = (r.losses for r in toy_runs)
    first, final = plain[0], {k: float(r.losses[-5:].mean()) for k, r in zip(("plain", "powersgd", "bf16"), toy_runs)}
    report("compressed training", first=float(first), **final)
    assert np.array_equal(plain[:6], powersgd[:6])  # uncompressed until step 5's update
    assert not np.array_equal(plain, powersgd) and not np.array_equal(plain, fsdp_bf16)
    for name, loss in final.items():
        assert loss < 0.35 * first, (name, loss)
        assert abs(loss - final["plain"]) < 0.1, (name, loss)


@pytest.mark.runs
def test_jax_program_runs_with_its_communication_flags_and_compression():
    """XLA:CPU ignores the GPU flags and NCCL: the settings change nothing in the numerics on CPU. bf16
    compression changes the gradients (not the first loss) and trains to the uncompressed loss band."""
    flagged = jax_runs.build(toy_spec("communication: {algorithm: tree, bucket_mb: 2, overlap: false}"), "two")
    plain = jax_runs.build(toy_spec(), "two")
    bf16 = jax_runs.build(toy_spec("communication: {compression: bf16}"), "two")
    powersgd = jax_runs.build(toy_spec("communication: {compression: {name: powersgd, rank: 1, start_step: 5}}"), "two")
    a, b, c, d = jax_runs.run_many([(flagged, "--steps", "3"), (plain,), (bf16,), (powersgd,)])
    assert np.array_equal(a.losses, b.losses[:3])
    final = {"plain": float(b.losses[-5:].mean()), "bf16": float(c.losses[-5:].mean()),
             "powersgd": float(d.losses[-5:].mean())}
    report("jax compressed training", first=float(b.losses[0]), **final)
    assert c.losses[0] == b.losses[0] and not np.array_equal(b.losses, c.losses)
    assert np.array_equal(b.losses[:6], d.losses[:6]) and not np.array_equal(b.losses, d.losses)  # from step 5 on
    for name, loss in final.items():
        assert loss < 0.35 * b.losses[0] and abs(loss - final["plain"]) < 0.1, (name, loss)


def test_jax_compression_matches_the_cast_reference_and_sends_the_planned_bytes():
    """The program's own train step (tests/jax_communication_check.py): its reduced gradients equal the
    explicit cast reference bit for bit, and its gradient collectives carry 16-bit values, the planned bytes
    through each half of the ring (all-to-all, all-gather); no float gradient all-reduce is left."""
    specs = {kind: toy_spec(f"communication: {{compression: {kind}}}") for kind in ("fp16", "bf16")}
    # ZeRO-1: each replica keeps its slice of the sum (the optimizer updates that slice): no gather
    specs["bf16 zero1"] = spec_variant(specs["bf16"], (("  steps: 60\n", "  steps: 60\n  zero: 1\n"),))
    powersgd = toy_spec("communication: {compression: {name: powersgd, rank: 1, start_step: 2}}")
    builds = {kind: jax_runs.build(spec, "two") for kind, spec in [*specs.items(), ("powersgd", powersgd)]}
    out = WORK / "jax-communication-check.json"
    proc = subprocess.run([sys.executable, str(TESTS / "jax_communication_check.py"), str(out),
                           *map(str, builds.values())], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    for kind, spec in specs.items():
        r = got[str(builds[kind])]
        (sync,) = [c for c in plan_of(spec, "two")[1].collectives if c.what.startswith("gradient")]
        by_kind = {k: sum(c["bytes"] for c in r["collectives"] if c["kind"] == k) for k in ("all-to-all", "all-gather")}
        report(f"jax {kind} compression", planned=f"{sync.what}: {sync.bytes}", uncompressed_bytes=4 * r["numel"],
               **by_kind, max_diff_from_float32=r["diff_from_float32"])
        assert r["equal"] and r["diff_from_float32"] > 0
        assert sync.bytes == 2 * r["numel"] and by_kind["all-to-all"] == sync.bytes
        assert by_kind["all-gather"] == (0 if "zero" in kind else sync.bytes)
        assert all(c["types"] == ["u16"] for c in r["collectives"] if c["kind"] != "all-reduce")
        # what is left: the loss's mean (and with ZeRO the norm of the split gradients' partial sums)
        assert all(c["types"] == ["f32"] and c["bytes"] <= 4 * 5 for c in r["collectives"] if c["kind"] == "all-reduce")
    # PowerSGD: the step's switch at the start step all-reduces whole gradients before it, the factors (and
    # the vectors whole) from it on: the planned bytes
    r = got[str(builds["powersgd"])]
    branches = {b: sum(c["bytes"] for c in r["collectives"] if c["branch"] == b) for b in (0, 1)}
    planned = grad_sync(plan_of(powersgd, "two")[1]).bytes
    report("jax powersgd compression", planned_bytes=planned, whole_bytes=4 * r["numel"], **{str(b): v for b, v in branches.items()})
    assert branches == {0: 4 * r["numel"], 1: planned} and planned < r["numel"]
    assert {c["kind"] for c in r["collectives"]} == {"all-reduce"}


@pytest.mark.runs
def test_jax_powersgd_state_starts_afresh_on_resume():
    """PowerSGD's state is not in the checkpoints (docs/program.md): a resumed run restores the rest, starts
    the error feedback and Q afresh, and trains on (the same steps, finite losses near the uninterrupted run's)."""
    powersgd = jax_runs.build(toy_spec("communication: {compression: {name: powersgd, rank: 1, start_step: 2}}"), "two")
    ckpt = WORK / "powersgd-checkpoints"
    first = jax_runs.run(powersgd, "--steps", "4", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2")
    resumed = jax_runs.run(powersgd, "--steps", "6", "--resume", str(ckpt))
    whole = jax_runs.run(powersgd, "--steps", "6")
    assert [r["step"] for r in resumed.metrics if "loss" in r] == [5, 6] and "resumed from" in resumed.output
    assert np.array_equal(first.losses, whole.losses[:4])
    assert np.isfinite(resumed.losses).all() and np.abs(resumed.losses - whole.losses[4:]).max() < 0.05
