"""`plan --auto`: the search over meshes and knobs, checked by the real planner and the targets' E049 checks,
ranked by predicted step time, then memory, then communication; `--write` and the bottleneck warning."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from mithril_spec import cli
from mithril_spec.frontend import compile_file
from mithril_spec.auto import KNOBS, factorizations, fit_hints, rank_key, search, spread
from mithril_spec.planner.costs import CostOptions, estimate
from mithril_spec.planner.hardware import lookup
from mithril_spec.planner.plan import make_plan
from mithril_spec.targets import attention_kernels

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "specs" / "gpt-tiny.yaml"
FIT = Path(__file__).parent / "specs" / "broken" / "does_not_fit_memory.yaml"

# A small GPT (untied output layer, so that a pipeline may split it) with a hardware profile of its own:
# each test below makes one knob the best choice through the model's shape and the profile.
GPT_SPEC = """\
version: 1
name: auto-{name}
dims: {{vocab: 256, seq: {seq}, d: {d}, heads: {heads}, ff: {ff}, layers: {layers}{extra_dims}}}
model:
  inputs:
    tokens: {{shape: [batch, seq], dtype: int32}}
    targets: {{shape: [batch, seq], dtype: int32}}
  blocks:
    decoder:
      - {{op: layer_norm, name: ln1}}
      - {{op: attention, name: attn, heads: heads, causal: true}}
      - {{op: add, name: res1, inputs: [block_input, attn]}}
      - {{op: layer_norm, name: ln2}}
      - {ffn}
      - {{op: add, name: res2, inputs: [res1, ffn]}}
  layers:
    - {{op: embedding, name: wte, vocab: vocab, dim: d, input: tokens}}
    - {{repeat: layers, block: decoder, name: blocks}}
    - {{op: layer_norm, name: ln_f}}
    - {{op: linear, name: lm_head, dimension: vocab, bias: false}}
  loss: {{op: cross_entropy, logits: lm_head, targets: targets}}
mesh: {{data: 1}}
sharding:
  rules: {{heads: tensor, kv_heads: tensor, mlp: tensor}}
training:
  batch_size: {batch}
  steps: 1
  optimizer: {{name: adamw, lr: 1.0e-4}}
hardware:
  - {{name: lab, base: h100-sxm-80gb, {hw}}}
"""
MLP_FFN = "{op: mlp, name: ffn, hidden: ff, activation: gelu}"
MOE_FFN = "{op: moe, name: ffn, experts: experts, top_k: 1, hidden: ff}"

MLP_SPEC = """\
version: 1
name: auto-mlp
dims: {features: 1024, hidden: 4096, classes: 16}
model:
  inputs:
    x: {shape: [batch, features], dtype: float32}
    y: {shape: [batch], dtype: int32}
  layers:
    - {op: linear, name: fc1, dimension: hidden, input: x}
    - {op: relu, name: act1}
    - {op: linear, name: fc2, dimension: hidden}
    - {op: relu, name: act2}
    - {op: linear, name: head, dimension: classes}
  loss: {op: cross_entropy, logits: head, targets: y}
mesh: {data: 1}
training:
  batch_size: 64
  steps: 1
  optimizer: {name: adamw, lr: 1.0e-3}
hardware:
  - {name: lab, base: h100-sxm-80gb, memory_gb: 0.25, reserved_gb: 0, devices_per_node: 1, inter_node_gb_per_s: 1}
"""


def gpt(tmp_path: Path, name="t", **kw) -> Path:
    values = {"name": name, "seq": 64, "d": 256, "heads": 4, "ff": 1024, "layers": 4, "extra_dims": "", "batch": 16, "ffn": MLP_FFN,
                  "hw": "memory_gb: 80"}
    values.update(kw)
    path = tmp_path / f"{name}.yaml"
    path.write_text(GPT_SPEC.format(**values))
    return path


def searched(path: Path, devices: int, targets=None):
    c = compile_file(path)
    hw = lookup("lab", c.spec, c.doc)
    options = CostOptions(fused_attention=all(attention_kernels(targets or c.spec.targets).values()))
    return c, hw, search(c.spec, c.doc, c.graph, devices, hw, options, targets=targets)


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err, err
    return rc, out, err


def test_factorizations_and_spread():
    assert sorted(factorizations(8, 3)) == sorted(
        [(1, 1, 8), (1, 8, 1), (8, 1, 1), (1, 2, 4), (1, 4, 2), (2, 1, 4), (4, 1, 2), (2, 4, 1), (4, 2, 1),
         (2, 2, 2)])
    assert len(factorizations(512, 3)) == 55
    assert all(math.prod(f) == 512 for f in factorizations(512, 3))
    assert spread([1, 2, 3]) == [1, 2, 3]
    picked = spread(list(range(1, 1025)), 6, keep=(7,))
    assert picked[0] == 1 and picked[-1] == 1024 and 7 in picked and len(picked) <= 7


# ---------------------------------------------------------------- each knob can be chosen


def test_pipe_and_its_schedule_are_chosen_when_parameters_dwarf_activations_on_a_slow_network(tmp_path):
    # 8 layers of d=2048 on 16-token sequences, one device per node on 1 GB/s: data and fsdp move the
    # parameters every step, a pipeline only the small activations between stages
    path = gpt(tmp_path, d=2048, ff=8192, heads=16, seq=16, layers=8, batch=32,
               hw="devices_per_node: 1, inter_node_gb_per_s: 1")
    _c, _hw, res = searched(path, 4)
    assert "pipe" in res.axes and "expert" not in res.axes  # (no moe layer: no expert axis)
    best = res.best
    assert dict(best.sizes)["pipe"] == 4
    schedule, _virtual, m = dict(best.settings)["pipeline"]
    assert schedule in ("1f1b", "interleaved") and m >= 4
    # the micro-batch count is the one with the smallest bubble that the batch allows (8 per rank at most)
    others = [x for x in res.candidates if dict(x.sizes)["pipe"] == 4 and dict(x.settings)["pipeline"][2] < m]
    assert others and all(rank_key(best) < rank_key(x) for x in others)


def test_a_placed_model_is_searched_on_the_pipe_its_placement_runs_on(tmp_path):
    # uneven stages written with `device:` (3 copies, then 1 with the head): only a target that runs explicit
    # placement gets pipe meshes, and only pipe=2 (the placement's devices), with its one virtual stage
    path = gpt(tmp_path, d=2048, ff=8192, heads=16, seq=16, layers=3, batch=32,
               hw="devices_per_node: 1, inter_node_gb_per_s: 1")
    text = path.read_text().replace(
        "    - {repeat: layers, block: decoder, name: blocks}\n",
        "    - {repeat: layers, block: decoder, name: blocks, device: 0}\n"
        "    - {repeat: 1, block: decoder, name: tail, device: 1}\n")
    path.write_text(text.replace("mesh: {data: 1}", "targets: [torch]\nmesh: {data: 1}"))
    _c, _hw, res = searched(path, 4)
    assert "pipe" in res.axes
    pipes = {dict(x.sizes)["pipe"] for x in res.candidates}
    assert 2 in pipes and pipes <= {1, 2}
    assert dict(res.best.sizes)["pipe"] == 2  # parameters dwarf activations on the slow network, as above
    assert all(dict(x.settings)["pipeline"][:2] in (("1f1b", 1), ("gpipe", 1))
               for x in res.candidates if dict(x.sizes)["pipe"] == 2)
    # jax runs it as well (each stage padded to 3 copies): the same pipe meshes
    _c, _hw, res = searched(path, 4, targets=["jax"])
    assert "pipe" in res.axes and {dict(x.sizes)["pipe"] for x in res.candidates} <= {1, 2}


def test_expert_is_chosen_for_large_experts_and_only_with_moe_layers(tmp_path):
    path = gpt(tmp_path, extra_dims=", experts: 4", d=512, ff=4096, seq=16, layers=2, batch=32, ffn=MOE_FFN,
               hw="devices_per_node: 1, inter_node_gb_per_s: 1")
    _c, _hw, res = searched(path, 4)
    assert "expert" in res.axes
    # (expert=4, or pipe=2 x expert=2 where both targets run that: the slow network favours the pipeline's
    # few activations over moving the experts' tokens between 4 devices)
    assert dict(res.best.sizes)["expert"] > 1
    assert {(dict(x.sizes)["expert"], dict(x.sizes)["pipe"]) for x in res.candidates} >= {(4, 1), (2, 2)}


def test_tensor_is_chosen_when_the_batch_cannot_split(tmp_path):
    path = gpt(tmp_path, batch=1, seq=256)
    # the work splits within the one sample: over tensor, or over context (ring attention's few small
    # messages cost less than tensor parallelism's all-reduces here)
    _c, _hw, res = searched(path, 4)
    sizes = dict(res.best.sizes)
    assert sizes["data"] == sizes["fsdp"] == 1 and sizes["tensor"] * sizes["context"] == 4
    assert res.pruned["the batch does not divide over the batch axes"] > 0
    # a target without context parallelism (mlx): tensor
    _c, _hw, res = searched(path, 4, targets=("mlx",))
    assert dict(res.best.sizes)["tensor"] == 4


def test_sequence_parallelism_is_chosen_when_activations_are_tight(tmp_path):
    # (float32 matmuls at full precision: in TensorFloat-32, 7x faster, recomputing the activations costs so
    # little that remat beats sequence parallelism on tensor=4)
    path = gpt(tmp_path, batch=1, seq=2048, d=512, heads=8, hw="memory_gb: 3, reserved_gb: 0, flops: {tfloat32: 66.9}")
    _c, _hw, res = searched(path, 4)
    # the best splits the sequence: over context (ring attention), or over tensor (sequence parallelism), which
    # is the best on the tensor=4 mesh
    assert dict(res.best.sizes)["context"] > 1 or dict(res.best.settings)["sequence_parallel"]
    best = min((x for x in res.candidates if dict(x.sizes)["tensor"] == 4), key=rank_key)
    assert dict(best.settings)["sequence_parallel"] is True
    plain = [x for x in res.candidates if not dict(x.settings)["sequence_parallel"] and x.sizes == best.sizes]
    assert plain and all(x.costs.peak > best.costs.peak for x in plain if x.remat == best.remat)


def test_grad_accum_and_remat_are_chosen_when_one_device_is_short_of_memory(tmp_path):
    path = gpt(tmp_path, batch=64, seq=1024, layers=2, hw="memory_gb: 2, reserved_gb: 0")
    c, hw, res = searched(path, 1)
    assert dict(res.best.settings)["grad_accum"] > 1
    # the spec as written (grad_accum 1) does not fit under any remat policy
    plan = make_plan(c.spec, c.doc, c.graph, "data=1", 1)
    assert all(not estimate(plan, hw, CostOptions(remat=r)).fits for r in ("none", "selective", "full"))
    # remat: one 2048-token sample (no smaller micro-batch) in 0.5 GB: selective fits, none does not
    path = gpt(tmp_path, name="remat", batch=1, seq=2048, layers=8, hw="memory_gb: 0.5, reserved_gb: 0")
    c, hw, res = searched(path, 1)
    assert res.best.remat == "selective"
    # faster first; none does not fit, unless it offloads activations (which the transfers make slower)
    assert [x.remat for x in res.candidates if dict(x.settings)["offload"] is None] == ["selective", "full"]
    offloading = [x for x in res.candidates if dict(x.settings)["offload"] is not None]
    assert all(x.step_s > res.best.step_s for x in offloading)


def test_zero_is_chosen_over_fsdp_when_the_optimizer_state_does_not_fit_replicated(tmp_path):
    path = tmp_path / "mlp.yaml"
    path.write_text(MLP_SPEC)
    _c, _hw, res = searched(path, 4)
    best = res.best
    assert best.mesh == "data=4" and dict(best.settings)["zero"] == 2
    # the model has no repeated block: no pipe axis, and the remat policies (which cost the same) listed once
    assert "pipe" not in res.axes
    assert len({(x.sizes, x.settings[:-1]) for x in res.candidates}) == len(res.candidates)


# ---------------------------------------------------------------- only what every target builds


def test_a_target_that_refuses_a_knob_keeps_it_out_of_every_candidate():
    c = compile_file(GPT)
    hw = lookup("h100")
    free = search(c.spec, c.doc, c.graph, 8, hw, targets=("jax", "torch"))
    assert any(dict(x.sizes).get("fsdp", 1) > 1 for x in free.candidates)
    assert any(x.remat == "selective" for x in free.candidates)
    with_mlx = search(c.spec, c.doc, c.graph, 8, hw, targets=("jax", "torch", "mlx"))
    # mlx: data and tensor axes only (never together), no ZeRO, remat none or full
    assert with_mlx.axes == ("data", "tensor")
    assert with_mlx.candidates
    for x in with_mlx.candidates:
        sizes, settings = dict(x.sizes), dict(x.settings)
        assert not (sizes["data"] > 1 and sizes["tensor"] > 1)
        assert settings["zero"] == 0 and x.remat in ("none", "full")
    # torch refuses ZeRO with an fsdp axis: no candidate has both
    for x in free.candidates:
        assert not (dict(x.sizes).get("fsdp", 1) > 1 and dict(x.settings)["zero"] > 0)


def test_fit_hints_suggest_only_what_the_targets_build(tmp_path):
    c = compile_file(FIT, mesh="dp")
    hw = lookup("tpu-v5e")
    plan = c.plan
    costs = estimate(plan, hw)
    assert not costs.fits
    hints = fit_hints(c.spec, c.doc, c.graph, plan, hw, costs, CostOptions())
    assert any("training.zero" in h for h in hints)
    mlx_only = c.spec.model_copy(update={"targets": ["mlx"]})
    hints = fit_hints(mlx_only, c.doc, c.graph, plan, hw, costs, CostOptions())
    assert not any("training.zero" in h or "fsdp" in h or "selective" in h for h in hints)


# ---------------------------------------------------------------- ranking


def test_ties_break_by_memory_then_communication():
    c = compile_file(GPT)
    res = search(c.spec, c.doc, c.graph, 8, lookup("h100"))
    keys = [rank_key(x) for x in res.candidates]
    assert keys == sorted(keys)
    # equal predicted times: the smaller peak first, whatever the remat policy (none never ahead of a policy
    # that holds less at the same time)
    pairs = [(a, b) for a, b in zip(res.candidates, res.candidates[1:]) if rank_key(a)[1] == rank_key(b)[1]]
    assert pairs
    for a, b in pairs:
        assert a.costs.peak < b.costs.peak or (a.costs.peak == b.costs.peak and a.comm_bytes <= b.comm_bytes)


def test_every_candidate_plans_to_the_same_figures():
    c = compile_file(GPT)
    hw = lookup("h100")
    res = search(c.spec, c.doc, c.graph, 8, hw)
    from mithril_spec.auto import candidate_spec

    for cand in res.candidates[:3]:
        spec = candidate_spec(c.spec, c.graph, cand)
        plan = make_plan(spec, c.doc, c.graph, cand.mesh, 8)
        again = estimate(plan, hw, CostOptions(remat=cand.remat))
        assert again.peak == cand.costs.peak and again.time.step_s == pytest.approx(cand.step_s)
    assert {k.name for k in KNOBS} <= {name for name, _ in res.candidates[0].settings}


def test_the_spec_pipeline_micro_batches_do_not_reject_meshes_without_a_pipeline():
    # gpt-pipe's `pipeline: {microbatches: 4}` and batch 16: data=8 without a pipeline is still a candidate
    c = compile_file(ROOT / "specs" / "gpt-pipe.yaml")
    res = search(c.spec, c.doc, c.graph, 8, lookup("h100"))
    assert any(dict(x.sizes) .get("data") == 8 and dict(x.settings)["pipeline"] is None for x in res.candidates)
    assert not any(r.code == "E052" for r in res.rejected)


# ---------------------------------------------------------------- the warning


def test_warning_names_the_bottleneck(tmp_path):
    c = compile_file(GPT)
    res = search(c.spec, c.doc, c.graph, 8, lookup("h100"))
    assert res.best.costs.time.mfu < 0.5 * 2 / 3
    assert res.warning and "far below the compute bound" in res.warning and "communication" in res.warning
    # a compute-bound plan: one device, a large batch of long sequences
    path = gpt(tmp_path, batch=64, seq=1024, layers=2, hw="memory_gb: 2, reserved_gb: 0")
    _, _, res = searched(path, 1)
    assert res.warning is None
    # compute repeated on every device of an axis that does not split the batch (the rules give the batch
    # to `data` alone, and only fsdp shards the parameters enough): named with its factor
    from mithril_spec.auto import Candidate, bottleneck

    text = path.read_text().replace("rules: {", "rules: {batch: data, ")
    path.write_text(text.replace("training:", "mesh: {fsdp: 4}\ntraining:", 1).replace("mesh: {data: 1}\n", ""))
    c = compile_file(path)
    cand = Candidate((("fsdp", 4),), (("remat", "none"),), estimate(c.plan, lookup("lab", c.spec, c.doc)))
    (what, _secs), *_ = bottleneck(cand)  # the largest part of the step
    assert what.startswith("compute beyond this device's share (") and 3.5 < float(what.split("(")[1].split("x")[0]) <= 4


# ---------------------------------------------------------------- the command line


def test_plan_auto_cli(capsys):
    rc, out, _err = run(capsys, "plan", GPT, "--auto", "--devices", "8", "--hardware", "h100")
    assert rc == 0
    assert "auto plan for gpt-tiny on 8 x h100-sxm-80gb" in out
    assert "1     --mesh " in out and "best: mithril-spec plan" in out and "--write NEW.yaml" in out
    assert "ranked by predicted step time, then peak memory, then uncompressed before compressed, then bytes" in out
    assert "warning: " in out
    rc, out, _err = run(capsys, "plan", GPT, "--auto", "--devices", "8", "--hardware", "h100", "--format", "json")
    j = json.loads(out)
    assert j["devices"] == 8 and j["candidates"][0]["fits"] and j["candidates"][0]["argument"].startswith("--mesh")
    assert set(j["searched_knobs"]) == {"pipeline", "grad_accum", "zero", "sequence_parallel", "offload",
                                        "compression", "remat"}
    assert j["warning"]


def test_plan_auto_needs_hardware(capsys):
    rc, _out, err = run(capsys, "plan", GPT, "--auto", "--devices", "8")
    assert rc == 2 and "--hardware" in err


def test_plan_auto_when_nothing_fits(capsys):
    rc, out, _err = run(capsys, "plan", FIT, "--auto", "--devices", "1", "--hardware", "tpu-v5e")
    assert rc == 1 and "nothing fits" in out


def test_write_round_trip(tmp_path, capsys):
    base = tmp_path / "gpt-pipe.yaml"
    shutil.copy(ROOT / "specs" / "gpt-pipe.yaml", base)
    new = tmp_path / "auto.yaml"
    rc, out, err = run(capsys, "plan", base, "--auto", "--devices", "16", "--hardware", "h100", "--write", new)
    assert rc == 0 and f"wrote {new}" in err
    text = new.read_text()
    assert "extends: gpt-pipe.yaml" in text and "meshes: null" in text
    # the written spec validates and plans to the search's prediction
    c = compile_file(base)
    res = search(c.spec, c.doc, c.graph, 16, lookup("h100"),
                 CostOptions(fused_attention=all(attention_kernels(c.spec.targets).values())))
    best = res.best
    rc, out, err = run(capsys, "validate", new)
    assert rc == 0, err
    rc, out, err = run(capsys, "plan", new, "--hardware", "h100", "--format", "json")
    assert rc == 0
    j = json.loads(out)
    assert j["costs"]["peak_bytes"] == best.costs.peak
    assert j["costs"]["time"]["step_s"] == pytest.approx(best.step_s)
    # a spec one directory down is written with its path
    sub = tmp_path / "sub"
    sub.mkdir()
    shutil.copy(base, sub / "gpt-pipe.yaml")
    rc, out, err = run(capsys, "plan", sub / "gpt-pipe.yaml", "--auto", "--devices", "8", "--hardware", "h100",
                       "--write", tmp_path / "up.yaml")
    assert rc == 0 and "extends: sub/gpt-pipe.yaml" in (tmp_path / "up.yaml").read_text()


@pytest.mark.parametrize("extra, message", [
    (["--write", "{sub}/new.yaml"], "only extend a spec in its own directory or below it"),
    (["--write", "{tmp}/new.json"], "YAML"),
    (["--write", "{tmp}/new.yaml", "--format", "json"], "without --format json"),
    (["--write", "{tmp}/new.yaml", "--set", "training.steps=2"], "--set"),
    (["--write", "{tmp}/gpt-tiny.yaml"], "SPEC itself"),
    (["--write", "{tmp}/nowhere/new.yaml"], "no such directory"),
])
def test_write_refusals(tmp_path, capsys, extra, message):
    base = tmp_path / "gpt-tiny.yaml"
    shutil.copy(GPT, base)
    (tmp_path / "sub").mkdir()
    extra = [e.format(tmp=tmp_path, sub=tmp_path / "sub") for e in extra]
    rc, _out, err = run(capsys, "plan", base, "--auto", "--devices", "8", "--hardware", "h100", *extra)
    assert rc == 2 and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt-tiny.yaml", "sub"]  # nothing written
    rc, _out, err = run(capsys, "plan", base, "--write", tmp_path / "x.yaml")
    assert rc == 2 and "--write needs --auto" in err


# ---------------------------------------------------------------- offload, compression, context parallelism


def _with(path: Path, targets=None, compute=None) -> Path:
    """The spec at `path` with a `targets` list and a compute dtype of its own."""
    text = path.read_text()
    if targets:
        text = text.replace("mesh: {data: 1}\n", f"targets: [{', '.join(targets)}]\nmesh: {{data: 1}}\n")
    if compute:
        text = text.replace("  steps: 1\n", f"  steps: 1\n  precision: {{compute: {compute}}}\n")
    path.write_text(text)
    return path


def offload_spec(tmp_path, targets=("torch",)) -> Path:
    # one 2048-token sample on one device with 0.155 GB: remat full alone holds 0.16 GiB, offloading the block
    # inputs it keeps brings the peak under
    return _with(gpt(tmp_path, name="offload", batch=1, seq=2048, layers=8, hw="memory_gb: 0.155, reserved_gb: 0"),
                 targets)


def compression_spec(tmp_path, targets=("torch",), compute="bfloat16") -> Path:
    # 4 one-device nodes on 1 GB/s: the data-parallel gradient reduction dominates the step (3 layers: no pipe)
    return _with(gpt(tmp_path, name="compression", d=1024, ff=4096, heads=8, seq=16, layers=3, batch=32,
                     hw="devices_per_node: 1, inter_node_gb_per_s: 1"), targets, compute)


def context_spec(tmp_path, targets=("torch",)) -> Path:
    # one 8192-token sample, 2 heads (tensor at most 2) on 4 devices: only context splits the rest of the work
    return _with(gpt(tmp_path, name="context", batch=1, seq=8192, heads=2, hw="memory_gb: 1, reserved_gb: 0"),
                 targets)


def test_offload_is_chosen_when_only_it_fits(tmp_path):
    c, hw, res = searched(offload_spec(tmp_path), 1)
    assert "offload" in {k.name for k in KNOBS}
    best = res.best
    threshold = dict(best.settings)["offload"]
    assert best.fits and threshold is not None and best.costs.time.offload_s > 0
    # without offload nothing fits, under any remat policy
    assert all(dict(x.settings)["offload"] is not None for x in res.candidates)
    plan = make_plan(c.spec, c.doc, c.graph, "data=1", 1)
    assert not any(estimate(plan, hw, CostOptions(remat=r)).fits for r in ("none", "selective", "full"))
    # jax refuses offload: with jax too, no candidate offloads (and none fits)
    _c, _hw, both = searched(offload_spec(tmp_path, ("jax", "torch")), 1)
    assert both.candidates and all(dict(x.settings)["offload"] is None for x in both.candidates)
    assert both.best is None


def test_offload_is_not_chosen_where_the_plan_fits_without_it(tmp_path):
    path = gpt(tmp_path, name="roomy", batch=1, seq=2048, layers=8, hw="memory_gb: 1, reserved_gb: 0")
    _c, _hw, res = searched(_with(path, ("torch",)), 1)
    assert dict(res.best.settings)["offload"] is None  # its transfers only add time


def test_compression_in_the_compute_dtype_is_chosen_when_the_gradient_reduction_is_exposed(tmp_path):
    _c, _hw, res = searched(compression_spec(tmp_path), 4)
    best = res.best
    assert dict(best.sizes)["data"] > 1 and dict(best.settings)["compression"] == "bf16"
    same = [x for x in res.candidates if x.sizes == best.sizes and dict(x.settings)["compression"] == "none"]
    assert same and all(x.step_s > best.step_s for x in same)
    # never PowerSGD, and never a cast over fp32 compute, unless the spec names it (it changes the numerics)
    assert all(dict(x.settings)["compression"] in ("none", "bf16") for x in res.candidates)
    _c, _hw, fp32 = searched(compression_spec(tmp_path, compute="float32"), 4)
    assert all(dict(x.settings)["compression"] == "none" for x in fp32.candidates)
    # jax compresses over a `data` axis alone (not fsdp, pipe, context or expert): with jax among the
    # targets, only such candidates compress; mlx compresses nothing
    _c, _hw, res = searched(compression_spec(tmp_path, ("jax", "torch")), 4)
    compressed = [dict(x.sizes) for x in res.candidates if dict(x.settings)["compression"] != "none"]
    assert compressed and all(s["data"] > 1 and all(s.get(a, 1) == 1 for a in ("fsdp", "pipe", "context", "expert"))
                              for s in compressed)
    _c, _hw, res = searched(compression_spec(tmp_path, ("mlx", "torch")), 4)
    assert res.candidates and all(dict(x.settings)["compression"] == "none" for x in res.candidates)


def test_a_compression_the_spec_names_is_searched_as_an_opt_in(tmp_path):
    # PowerSGD over float32 compute: never proposed by itself; named by the spec, kept where it is faster
    path = compression_spec(tmp_path, compute="float32")
    path.write_text(path.read_text().replace(
        "mesh: {data: 1}\n", "mesh: {data: 1}\ncommunication: {compression: {name: powersgd, rank: 4, start_step: 10}}\n"))
    _c, _hw, res = searched(path, 4)
    assert {dict(x.settings)["compression"] for x in res.candidates} <= {"none", ("powersgd", 4, 10)}
    assert dict(res.best.settings)["compression"] == ("powersgd", 4, 10)
    assert res.best.to_json()["settings"]["compression"] == {"name": "powersgd", "rank": 4, "start_step": 10}


def test_compression_is_not_chosen_where_it_is_no_faster(tmp_path):
    # one device per node but fast links, a large batch: the reduction hides behind the compute
    path = _with(gpt(tmp_path, name="hidden", batch=64, seq=512, hw="devices_per_node: 1"), ("torch",), "bfloat16")
    _c, _hw, res = searched(path, 2)
    best = res.best
    assert dict(best.settings)["compression"] == "none"
    assert not any(rank_key(x) < rank_key(best) for x in res.candidates)


def test_context_is_chosen_for_a_long_sequence_that_nothing_else_splits(tmp_path):
    _c, _hw, res = searched(context_spec(tmp_path), 4)
    assert "context" in res.axes
    best = res.best
    assert dict(best.sizes)["context"] > 1 and best.fits
    # context parallelism runs with zero 0 and without selective remat (the targets' E049)
    for x in res.candidates:
        if dict(x.sizes)["context"] > 1:
            assert dict(x.settings)["zero"] == 0 and x.remat != "selective"


def test_mlx_gets_no_offload_no_context_no_compression(tmp_path):
    for path, devices in ((offload_spec(tmp_path, ("mlx",)), 1), (context_spec(tmp_path, ("mlx",)), 4),
                          (compression_spec(tmp_path, ("mlx",)), 4)):
        _c, _hw, res = searched(path, devices)
        assert "context" not in res.axes
        for x in res.candidates:
            settings = dict(x.settings)
            assert settings["offload"] is None and settings["compression"] == "none"
            assert dict(x.sizes).get("context", 1) == 1


@pytest.mark.parametrize("make, devices", [(offload_spec, 1), (compression_spec, 4), (context_spec, 4)])
def test_write_round_trip_of_the_new_knobs(tmp_path, capsys, make, devices):
    base = make(tmp_path)
    new = tmp_path / "auto.yaml"
    rc, out, err = run(capsys, "plan", base, "--auto", "--devices", devices, "--hardware", "lab", "--write", new)
    assert rc == 0, err
    _c, _hw, res = searched(base, devices)
    best = res.best
    text = new.read_text()
    settings = dict(best.settings)
    if settings["offload"] is not None:
        assert f"threshold: {settings['offload']}" in text
    if settings["compression"] != "none":
        assert f"compression: {settings['compression']}" in text
    if dict(best.sizes)["context"] > 1:
        assert f"context: {dict(best.sizes)['context']}" in text
    rc, out, err = run(capsys, "validate", new)
    assert rc == 0, err
    rc, out, err = run(capsys, "plan", new, "--hardware", "lab", "--format", "json")
    assert rc == 0, err
    j = json.loads(out)
    assert j["costs"]["peak_bytes"] == best.costs.peak
    assert j["costs"]["time"]["step_s"] == pytest.approx(best.step_s)
