"""`mithril-spec calibrate` and the profiles it writes: the command measures (in a subprocess, with the
smallest sizes) and writes a profile that `plan --hardware FILE.yaml` and a spec's `hardware:` list accept;
its error paths; the fit of its timings; and the step-time terms a calibrated profile turns on
(planner/costs/overheads.py). No timing is asserted: measured figures only have to be positive."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import pytest

from mithril_spec import calibrate as cal
from mithril_spec import cli
from mithril_spec.frontend import compile_file
from mithril_spec.planner.costs import estimate
from mithril_spec.planner.costs.overheads import ACTIVATION_PASSES, KERNELS_PER_LAYER, layer_count
from mithril_spec.planner.hardware import BUILTIN, lookup

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "specs" / "gpt-tiny.yaml"


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    """One real calibration (jax: the cheaper start-up), the smallest sizes, 2 simulated devices."""
    path = tmp_path_factory.mktemp("calibrate") / "hw.yaml"
    rc, _, err = run("calibrate", "--target", "jax", "--quick", "--processes", "2", "--name", "here", "-o", path)
    assert rc == 0, err
    return path


@pytest.mark.runs
def test_calibrate_writes_a_profile_plan_accepts(profile):
    hw = lookup(str(profile))
    assert hw.name == "here" and hw.devices_per_node == 2
    assert "# efficiency: that at which the cost model predicts a reference decoder block" in profile.read_text()
    assert hw.flops["float32"] > 0 and hw.hbm_bytes_per_s > 0 and hw.intra_node_bytes_per_s > 0
    assert 0 < hw.efficiency <= 1 and hw.kernel_overhead_s >= 0 and hw.elementwise_bytes_per_s > 0
    rc, out, err = run("plan", GPT, "--mesh", "data=2", "--hardware", profile, "--format", "json")
    assert rc == 0, err
    costs = json.loads(out)["costs"]
    assert costs["hardware"]["name"] == "here" and costs["time"]["step_s"] > 0
    t = costs["time"]
    assert t["elementwise_s"] > 0 and t["kernels"] > 0
    parts = t["compute_s"] + t["blocking_comm_s"] + t["exposed_comm_s"] + t["elementwise_s"] + t["overhead_s"]
    assert t["step_s"] == pytest.approx(parts + t["optimizer_s"] + t["offload_s"])
    # `FILE#NAME` picks the entry by name; a wrong name is a usage error
    assert run("plan", GPT, "--mesh", "data=2", "--hardware", f"{profile}#here")[0] == 0
    rc, _, err = run("plan", GPT, "--hardware", f"{profile}#there")
    assert rc == 2 and "no profile `there`" in err


@pytest.mark.runs
def test_calibrate_torch_ranks(tmp_path):
    """A real torch calibration: 2 ranks over gloo, the smallest sizes. Beside the figures jax measures too, the
    sharded-tensor layers' fixed cost from the reference block run tensor-parallel over the pair (DTensor
    modules, its all-reduces sent), which `plan --target torch` charges per tensor-parallel layer."""
    path = tmp_path / "hw.yaml"
    rc, _, err = run("calibrate", "--target", "torch", "--quick", "--processes", "2", "-o", path)
    assert rc == 0, err
    text = path.read_text()
    assert "predicts the same block run tensor-parallel over 2 ranks (DTensor modules), timed at" in text
    hw = lookup(str(path))
    assert hw.name == "torch-cpu-x2" and hw.devices_per_node == 2 and 0 < hw.efficiency <= 1
    assert hw.sharded_layer_overhead_s >= 0 and hw.intra_node_bytes_per_s > 0 and hw.elementwise_bytes_per_s > 0
    rc, out, err = run("plan", GPT, "--mesh", "data=1,tensor=2", "--hardware", path, "--target", "torch",
                       "--format", "json")
    assert rc == 0, err
    t = json.loads(out)["costs"]["time"]
    assert t["sharded_layers"] >= 24 and t["blocking_comm_s"] > 0  # q, k, v, o, fc, proj of 4 blocks


@pytest.mark.runs
def test_profile_pastes_into_a_spec(profile, tmp_path):
    """The file's `hardware:` list is the spec's section: appended to a spec, `--hardware here` finds it."""
    spec = tmp_path / "gpt.yaml"
    spec.write_text(GPT.read_text() + "\n" + profile.read_text())
    rc, out, err = run("plan", spec, "--mesh", "data=2", "--hardware", "here", "--format", "json")
    assert rc == 0, err
    assert json.loads(out)["costs"]["hardware"] == json.loads(
        run("plan", GPT, "--mesh", "data=2", "--hardware", profile, "--format", "json")[1])["costs"]["hardware"]


def test_calibrate_errors(tmp_path, monkeypatch):
    rc, _, err = run("calibrate", "--target", "mlx", "-o", tmp_path / "hw.yaml")
    assert rc == 2 and "unknown target `mlx`" in err
    rc, _, err = run("calibrate", "--target", "jax", "-o", tmp_path / "missing" / "hw.yaml")
    assert rc == 2 and "no such directory" in err
    rc, _, err = run("calibrate", "--target", "jax", "-o", tmp_path)
    assert rc == 2 and "is a directory" in err
    rc, _, err = run("calibrate", "--target", "jax", "--name", "a b", "-o", tmp_path / "hw.yaml")
    assert rc == 2 and "--name" in err
    rc, _, err = run("calibrate", "--target", "jax", "--processes", "0", "-o", tmp_path / "hw.yaml")
    assert rc == 2 and "--processes" in err
    # the framework is missing: said before anything runs
    monkeypatch.setattr(cal.importlib.util, "find_spec", lambda name: None)
    rc, _, err = run("calibrate", "--target", "torch", "-o", tmp_path / "hw.yaml")
    assert rc == 2 and "`torch` is not installed" in err
    monkeypatch.undo()
    # the measurement fails: its last line of output says why
    broken = tmp_path / "broken.py"
    broken.write_text("import sys\nprint('error: no devices here', file=sys.stderr)\nsys.exit(1)\n")
    monkeypatch.setattr(cal, "script", lambda target: broken)
    rc, _, err = run("calibrate", "--target", "jax", "-o", tmp_path / "hw.yaml")
    assert rc == 2 and "the measurement failed: error: no devices here" in err
    assert not (tmp_path / "hw.yaml").exists()


def test_hardware_file_errors(tmp_path):
    rc, _, err = run("plan", GPT, "--hardware", tmp_path / "none.yaml")
    assert rc == 2 and "no such file" in err
    other = tmp_path / "other.yaml"
    other.write_text("name: x\n")
    rc, _, err = run("plan", GPT, "--hardware", other)
    assert rc == 2 and "not a profile file" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("hardware:\n  - {name: b, base: cpu, efficiency: 2}\n")
    rc, _, err = run("plan", GPT, "--hardware", bad, "--color", "never")
    assert rc == 1 and "bad.yaml:2" in err
    two = tmp_path / "two.yaml"
    two.write_text("hardware:\n  - {name: a, base: cpu}\n  - {name: b, base: h100}\n")
    rc, _, err = run("plan", GPT, "--hardware", two)
    assert rc == 2 and "2 profiles there" in err and "a, b" in err
    assert lookup(f"{two}#b").flops == BUILTIN["h100-sxm-80gb"].flops


def test_ring_fit_recovers_bandwidth_and_latency():
    bw, lat, n = 2e9, 50e-6, 4
    points = [(b, 2 * (n - 1) / n * b / bw + 2 * (n - 1) * lat) for b in (4, 1 << 16, 1 << 20, 4 << 20)]
    got_bw, got_lat = cal.ring_fit(points, n)
    assert got_bw == pytest.approx(bw) and got_lat == pytest.approx(lat)
    # noise that makes the slope negative: bandwidth from the largest payload, no latency below zero
    bw2, lat2 = cal.ring_fit([(4, 1e-3), (1 << 20, 0.5e-3)], 2)
    assert bw2 > 0 and lat2 >= 0


def test_collective_fit_over_group_sizes():
    """Pairs and all devices (the torch script's groups): the bandwidth of all devices, the latency of the
    pairs."""
    pairs = [[b, 2 * 0.5 * b / 2e9 + 2 * 1 * 4e-3, 2] for b in (4, 1 << 20, 4 << 20)]
    alls = [[b, 2 * 0.75 * b / 1e9 + 2 * 3 * 1e-3, 4] for b in (4, 1 << 20, 4 << 20)]
    bw, lat = cal.collective_fit([(b, g, t) for b, t, g in pairs + alls])
    assert bw == pytest.approx(1e9) and lat == pytest.approx(4e-3)
    raw = {"device": "cpu", "platform": "cpu", "processes": 4, "memory_bytes": 8e9, "copy": [1e8, 0.1],
           "matmul": {"float32": [[100, 100, 100, 2e-3]]}, "tiny_op": 20e-6, "allreduce": pairs + alls}
    f = cal.profile_fields(raw, "p")
    assert f["intra_node_gb_per_s"] == pytest.approx(1.0) and f["intra_node_latency_us"] == pytest.approx(4000)
    # one group size is the ring fit (rows without a group size: all devices)
    one = [(b, 2, 2 * 1e-4 + b / 1e9) for b in (4, 1 << 20)]
    assert cal.collective_fit(one) == pytest.approx(cal.ring_fit([(b, t) for b, _, t in one], 2))
    assert cal.profile_fields(dict(raw, allreduce=[r[:2] for r in alls]), "q")["intra_node_latency_us"] == pytest.approx(1000)


def test_profile_fields_from_timings():
    raw = {"device": "cpu", "platform": "cpu", "processes": 2, "memory_bytes": 8e9,
           "matmul": {"float32": [[100, 100, 100, 2e-3], [200, 200, 200, 8e-3]], "bfloat16": [[100, 100, 100, 1e-3]]},
           "copy": [1e8, 0.1], "tiny_op": 20e-6, "allreduce": [[4, 1e-4], [1e6, 1e-4 + 1e6 / 1e9]]}
    f = cal.profile_fields(raw, "p")
    assert f["flops"] == {"float32": pytest.approx(2e-3), "bfloat16": pytest.approx(2e-3)}  # TFLOP/s, the best shape
    assert f["efficiency"] == pytest.approx((1e9 + 2e9) / 2 / 2e9)  # the mean shape against the best
    # without measured element-wise kernels, the copy's bandwidth stands in for them
    assert f["hbm_gb_per_s"] == pytest.approx(2.0) and f["elementwise_gb_per_s"] == f["hbm_gb_per_s"]
    # measured: ACTIVATION_PASSES passes over each kernel's output (the model's unit) per forward and backward
    measured = cal.profile_fields(dict(raw, elementwise=[1e6, 4, 0.01]), "e")
    assert measured["elementwise_gb_per_s"] == pytest.approx(ACTIVATION_PASSES * 4 * 1e6 / 0.01 / 1e9)
    assert measured["hbm_gb_per_s"] == f["hbm_gb_per_s"]
    assert f["intra_node_gb_per_s"] == pytest.approx(1.0) and f["intra_node_latency_us"] == pytest.approx(50)
    assert f["kernel_overhead_us"] == pytest.approx(20) and f["memory_gb"] == 8 and f["devices_per_node"] == 2
    # a product that takes no longer than a few kernel launches (a GPU's small shapes) is left out of the
    # efficiency: the kernel overhead accounts for it
    gpu = dict(raw, matmul={"float32": [[8, 8, 8, 19e-6], [100, 100, 100, 2e-3], [200, 200, 200, 8e-3]]})
    assert cal.profile_fields(gpu, "g")["efficiency"] == f["efficiency"]
    assert "sharded_layer_overhead_us" not in f  # not measured (jax, one process)
    # torch: a chain of tiny layers plain and as DTensor modules; the difference per layer
    dt = cal.profile_fields(dict(raw, sharded_layer=[0.01, 0.11, 100]), "t")
    assert dt["sharded_layer_overhead_us"] == pytest.approx(1000)
    text = cal.render(f, "mithril-spec calibrate --target jax", raw)
    assert text.startswith("# ") and "\nhardware:\n  - name: \"p\"\n" in text


def test_probe_sets_the_efficiency_the_model_needs():
    """The reference block (probe.py): the efficiency derived from its measured time is the one at which the
    cost model, costing the block as a spec with that profile, predicts that time; a slower block gives a lower
    efficiency; one no slower than the model's other terms and its matmuls at the best rate, 1."""
    from mithril_spec import probe

    raw = {"device": "cpu", "platform": "cpu", "processes": 4, "memory_bytes": 8e9,
           "matmul": {"float32": [[1024, 256, 256, 4e-3], [1024, 512, 512, 16e-3]]}, "copy": [1e8, 0.05],
           "tiny_op": 30e-6, "allreduce": [[4, 1e-4, 4], [1e6, 2e-3, 4]], "elementwise": [1 << 20, 4, 0.01]}
    dims = probe.QUICK_PROBE
    for target in ("torch", "jax"):
        base = cal.profile_fields(raw, "p", target)
        assert base["efficiency"] == pytest.approx(1.0)  # (the matmuls' mean: both shapes at the same rate)
        terms = probe.probe_terms(dims, base, target)
        assert terms.matmul_s > 0 and terms.elementwise_s > 0 and terms.overhead_s > 0
        floor = terms.matmul_s + terms.elementwise_s + terms.overhead_s
        effs = []
        for slower in (0.8, 1.5, 3.0):
            f = cal.profile_fields(dict(raw, probe=[*dims, floor * slower]), "p", target)
            effs.append(f["efficiency"])
            if slower > 1:  # round trip: the block costed with the derived profile takes the measured time
                t = probe.probe_terms(dims, dict(f, efficiency=1.0), target)
                assert t.matmul_s / f["efficiency"] + t.elementwise_s + t.overhead_s == pytest.approx(floor * slower,
                                                                                                      rel=1e-3)
        assert effs[0] == 1.0 and 1.0 > effs[1] > effs[2] > 0
        # without a target (or a timed block) the matmuls' mean stays
        assert cal.profile_fields(dict(raw, probe=[*dims, floor * 3]), "p")["efficiency"] == base["efficiency"]
    # torch stores no attention probabilities (its fused kernel): less element-wise traffic than jax
    assert (probe.probe_terms(dims, base, "torch").elementwise_s
            < probe.probe_terms(dims, base, "jax").elementwise_s)


def test_tensor_parallel_probe_sets_the_sharded_layer_overhead():
    """Torch on CPU devices: the reference block run tensor-parallel over pairs sets the sharded-tensor layers'
    fixed cost to that at which the model, costing the block as a tensor=2 spec, predicts its measured time;
    it replaces the tiny chain's figure; a block no slower than the model's other terms gives 0."""
    from mithril_spec import probe

    raw = {"device": "cpu", "platform": "cpu", "processes": 4, "memory_bytes": 8e9,
           "matmul": {"float32": [[1024, 256, 256, 4e-3], [1024, 512, 512, 16e-3]]}, "copy": [1e8, 0.05],
           "tiny_op": 30e-6, "allreduce": [[4, 1e-4, 2], [1e6, 2e-3, 2], [4, 1e-4, 4], [1e6, 2e-3, 4]],
           "elementwise": [1 << 20, 4, 0.01], "sharded_layer": [0.01, 0.11, 100]}
    dims = probe.QUICK_PROBE
    base = cal.profile_fields(raw, "p", "torch")
    assert base["sharded_layer_overhead_us"] == pytest.approx(1000)  # the chain's, without a tensor-parallel block
    terms = probe.probe_terms(dims, dict(base, sharded_layer_overhead_us=0.0), "torch", tensor=2)
    # the block split over two: half the matmuls, its four all-reduces, its six projections as DTensor modules
    whole = probe.probe_terms(dims, base, "torch")
    assert terms.matmul_s == pytest.approx(whole.matmul_s / 2, rel=0.05) and whole.blocking_s == 0
    assert terms.blocking_s > 0 and terms.sharded == 6 and whole.sharded == 0
    floor = terms.matmul_s + terms.elementwise_s + terms.overhead_s + terms.blocking_s
    f = cal.profile_fields(dict(raw, probe_tensor=[*dims, 2, floor + 0.012]), "p", "torch")
    assert f["sharded_layer_overhead_us"] == pytest.approx(0.012 / 6 * 1e6, rel=1e-3)
    # round trip: costed with the derived profile, the tensor-parallel block takes the measured time
    t = probe.probe_terms(dims, f, "torch", tensor=2)
    assert t.matmul_s + t.elementwise_s + t.overhead_s + t.blocking_s == pytest.approx(floor + 0.012, rel=1e-3)
    assert cal.profile_fields(dict(raw, probe_tensor=[*dims, 2, floor * 0.9]), "p", "torch")[
        "sharded_layer_overhead_us"] == 0
    # a plain block timed faster than the model predicts it at efficiency 1 (0.8 of that): the split block's own
    # work is scaled down alike, and the sharded layers take what is left beyond that
    whole = probe.probe_terms(dims, base, "torch").busy_s
    fast = cal.profile_fields(dict(raw, probe=[*dims, 0.8 * whole], probe_tensor=[*dims, 2, floor + 0.012]), "p",
                              "torch")
    assert fast["efficiency"] == 1.0
    assert fast["sharded_layer_overhead_us"] == pytest.approx(
        (floor + 0.012 - 0.8 * terms.busy_s - terms.blocking_s) / 6 * 1e6, rel=1e-3)
    assert fast["sharded_layer_overhead_us"] > f["sharded_layer_overhead_us"]
    # without a target the chain's figure stays
    assert cal.profile_fields(dict(raw, probe_tensor=[*dims, 2, floor * 2]), "p")["sharded_layer_overhead_us"] == 1000


def test_overhead_terms(tmp_path):
    """Element-wise traffic and the kernels' fixed cost: off for the built-in profiles (their efficiency covers
    them), and for a profile that sets them, the documented counts."""
    plan = compile_file(GPT, "data=2").plan
    base = estimate(plan, BUILTIN["cpu"])
    assert base.time.elementwise_s == 0 and base.time.overhead_s == 0
    prof = tmp_path / "p.yaml"
    prof.write_text("hardware:\n  - {name: p, base: cpu, kernel_overhead_us: 10, elementwise_gb_per_s: 1}\n")
    hw = lookup(str(prof))
    c = estimate(plan, hw)
    t, st = c.time, c.stages[0]
    acts = sum(st.activations.by_op.values())
    assert t.elementwise_s == pytest.approx(ACTIVATION_PASSES * acts * c.micro_batches / 1e9)
    layers = layer_count(plan)
    assert layers == 2 + 4 * 6 + 2 and len(plan.params) > 0
    calls = sum(x.count for x in st.collectives)
    assert t.kernels == KERNELS_PER_LAYER * layers * c.micro_batches + calls + len(plan.params)
    assert t.overhead_s == pytest.approx(t.kernels * 10e-6)
    assert t.step_s == pytest.approx(base.time.step_s + t.elementwise_s + t.overhead_s)
    full = estimate(plan, hw, dataclasses_replace_remat("full"))
    assert full.time.kernels == t.kernels + 4 * 6 * c.micro_batches  # the repeated blocks


def test_sharded_layer_overhead(tmp_path):
    """Torch runs each layer whose parameters split over `tensor` as a DTensor module: `plan --target torch`
    charges the profile's cost of one per layer, pipe rank and micro-batch; jax (one compiled program) and a
    plan without a target charge none."""
    from mithril_spec.planner.costs import CostOptions
    from mithril_spec.lowering import LOWERINGS

    prof = tmp_path / "p.yaml"
    prof.write_text("hardware:\n  - {name: p, base: cpu, sharded_layer_overhead_us: 1000}\n")
    hw = lookup(str(prof))
    plan = compile_file(GPT, "data=1,tensor=2").plan
    # q, k, v, o, fc, proj per copy of the block (specs/gpt-tiny.yaml: 4 copies)
    assert LOWERINGS["torch"].sharded_layers(plan) == 4 * 6
    assert LOWERINGS["jax"].sharded_layers(plan) == 0 and LOWERINGS["mlx"].sharded_layers(plan) == 0
    assert LOWERINGS["torch"].sharded_layers(compile_file(GPT, "data=2").plan) == 0  # no tensor axis
    # sequence parallel: the norms of the block (ln1, ln2) run as SequenceParallel DTensor modules too
    from torch_runs import SP_EDITS, spec_variant

    sp = compile_file(spec_variant(GPT, SP_EDITS), "data=1,tensor=2").plan
    assert LOWERINGS["torch"].sharded_layers(sp) == 4 * (6 + 2)
    plain = estimate(plan, hw)
    torch_ = estimate(plan, hw, CostOptions(sharded_layers=24))
    assert plain.time.sharded_layers == 0 and torch_.time.sharded_layers == 24 * torch_.micro_batches
    assert torch_.time.overhead_s - plain.time.overhead_s == pytest.approx(24 * torch_.micro_batches * 1e-3)
    assert torch_.time.step_s - plain.time.step_s == pytest.approx(24 * torch_.micro_batches * 1e-3)
    # full remat runs each forward again: a third of a layer's forward and backward more
    full = estimate(plan, hw, CostOptions(sharded_layers=24, remat="full"))
    plain_full = estimate(plan, hw, CostOptions(remat="full"))
    assert full.time.overhead_s - plain_full.time.overhead_s == pytest.approx(24 * full.micro_batches * 1e-3 * 4 / 3)
    # the CLI: `plan --target torch` counts them, `--target jax` and no target do not
    jsons = {}
    for target in ("torch", "jax", None):
        rc, out, err = run("plan", GPT, "--mesh", "data=1,tensor=2", "--hardware", prof, "--format", "json",
                           *(["--target", target] if target else []))
        assert rc == 0, err
        jsons[target] = json.loads(out)["costs"]["time"]
    assert jsons["torch"]["sharded_layers"] == 24 * torch_.micro_batches
    assert jsons["jax"]["sharded_layers"] == 0 and jsons[None]["sharded_layers"] == 0
    rc, out, _ = run("plan", GPT, "--mesh", "data=1,tensor=2", "--hardware", prof, "--target", "torch")
    assert f"and {24 * torch_.micro_batches} sharded-tensor layer passes" in out


def dataclasses_replace_remat(remat):
    from mithril_spec.planner.costs import CostOptions

    return CostOptions(remat=remat)


def test_a_build_embeds_what_plan_target_predicts():
    """The prediction a program carries (lowering/predicted.py, printed by its --profile) is costed with the
    target's own options, as `plan --target`: torch's FSDP2 reduces the gradients in one call per block and
    one for the root, and the step time of each built-in profile includes those calls' latency."""
    from mithril_spec.lowering.predicted import predicted
    from mithril_spec.lowering import LOWERINGS
    from mithril_spec.lowering.costing import costing

    c = compile_file(GPT, "data=2,tensor=2")  # (torch: FSDP2 over data, DTensor modules over tensor)
    for target in ("torch", "jax"):
        embedded = predicted(costing(c.plan, target))
        rc, out, err = run("plan", GPT, "--mesh", "data=2,tensor=2", "--target", target, "--hardware", "h100-sxm-80gb",
                           "--format", "json")
        assert rc == 0, err
        costs = json.loads(out)["costs"]
        calls = sum(x["count"] for x in costs["collectives"] if x["kind"] == "all-reduce")
        assert embedded["comm_calls"]["all-reduce"] == calls
        assert embedded["profiles"]["h100-sxm-80gb"]["step_s"] == pytest.approx(costs["time"]["step_s"], rel=1e-3)
    # torch issues more calls than one of all the gradients (jax's one psum)
    assert LOWERINGS["torch"].reduction_calls(c.plan) > 1
    calls = {t: predicted(costing(c.plan, t))["comm_calls"]["all-reduce"] for t in ("torch", "jax")}
    assert calls["torch"] > calls["jax"]


def test_overlap_collectives(tmp_path):
    """A profile whose collectives do not overlap compute exposes all the data-parallel communication; the
    calibration decides it from a burst alone, then an all-reduce, and the all-reduce beside the burst."""
    from mithril_spec.planner.costs import CostOptions
    from mithril_spec.lowering import LOWERINGS

    assert cal.overlaps(0.02, 0.03, 0.021) and not cal.overlaps(0.02, 0.03, 0.029)  # 9 of 10 ms hidden; 1 of 10
    assert cal.overlaps(0.02, 0.019, 0.02)  # an all-reduce adding no time: nothing to expose
    raw = {"device": "cpu", "platform": "cpu", "processes": 2, "memory_bytes": 8e9, "copy": [1e8, 0.1],
           "matmul": {"float32": [[100, 100, 100, 2e-3]]}, "tiny_op": 20e-6, "allreduce": [[4, 1e-4], [1e6, 2e-3]]}
    f = cal.profile_fields(dict(raw, overlap=[0.02, 0.03, 0.03]), "p")
    assert f["overlap_collectives"] is False and "overlap_collectives" not in cal.profile_fields(raw, "q")
    text = cal.render(f, "mithril-spec calibrate --target torch", raw)
    assert "    overlap_collectives: false\n" in text
    prof = tmp_path / "p.yaml"
    prof.write_text(text)
    off = lookup(str(prof))
    on = dataclasses.replace(off, overlap_collectives=True)
    plan = compile_file(GPT, "data=2").plan
    hidden, exposed = estimate(plan, on).time, estimate(plan, off).time
    assert hidden.overlapped_comm_s == exposed.overlapped_comm_s > 0
    assert exposed.exposed_comm_s == exposed.overlapped_comm_s
    assert hidden.exposed_comm_s == max(0.0, hidden.overlapped_comm_s - hidden.compute_s)
    assert exposed.step_s == pytest.approx(hidden.step_s - hidden.exposed_comm_s + exposed.overlapped_comm_s)
    # torch FSDP2 (data x tensor: hsdp) reduces each fully_shard unit on its own: the block's copies and the root,
    # each call a share of the gradients and paying the latency
    plan2 = compile_file(GPT, "data=2,tensor=2").plan
    calls = LOWERINGS["torch"].reduction_calls(plan2)
    assert calls == 4 + 1 and LOWERINGS["jax"].reduction_calls(plan2) is None
    assert LOWERINGS["torch"].reduction_calls(plan) is None  # data=2 alone: DDP, its buckets not modelled
    one = estimate(plan2, off)
    split = estimate(plan2, off, CostOptions(reduction_calls=calls))
    grad1 = [c for c in one.collectives if c.what.startswith("gradient all-reduce")]
    grads = [c for c in split.collectives if c.what.startswith("gradient all-reduce")]
    assert len(grad1) == len(grads) == 1 and grads[0].count == calls * grad1[0].count
    assert grads[0].bytes == -(-grad1[0].bytes // calls)
    latency = 2 * (grads[0].group - 1) * off.intra_node_latency_s
    assert split.time.exposed_comm_s == pytest.approx(one.time.exposed_comm_s + (calls - 1) * latency, rel=1e-3)
