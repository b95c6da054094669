"""Per-layer device placement (`device: K`, Mithril's device_id): devices along `pipe` mapped to pipeline
stages (planner/pipeline.py), the same stages `stage:` fields give, and E054 with the nearest placement that
runs for every assignment the schedules cannot execute."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from program_files import program_text

from mithril_spec.diagnostics import DiagnosticError
from mithril_spec.frontend import compile_file
from mithril_spec.lowering import check_target
from mithril_spec.render.build import render_files

SPEC = """\
version: 1
name: placement
targets: [torch]
dims: {features: 16, classes: 4}
model:
  inputs:
    x: {shape: [batch, features], dtype: float32}
    y: {shape: [batch], dtype: int32}
  blocks:
    res:
      - {op: linear, name: fc, dimension: features, input: block_input FC}
      - {op: relu, name: act ACT}
  layers:
    - {op: linear, name: inp, dimension: features INP}
    - {repeat: 4, block: res, name: blocks BLOCKS}
    - {op: linear, name: mid, dimension: features MID}
    - {op: linear, name: head, dimension: classes HEAD}
  loss: {op: cross_entropy, logits: head, targets: y}
meshes:
  two: {pipe: 2}
  one: {data: 1}
pipeline: {microbatches: 2 PIPELINE}
training:
  batch_size: 8
  steps: 4
  optimizer: {name: adam, lr: 1.0e-2}
data: {kind: synthetic}
"""
SLOTS = ("FC", "ACT", "INP", "BLOCKS", "MID", "HEAD", "PIPELINE")


def spec(tmp_path, name="p", **fields) -> object:
    text = SPEC
    for slot in SLOTS:
        text = text.replace(f" {slot}}}", (", " + fields[slot.lower()] if slot.lower() in fields else "") + "}")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def errors(path, mesh="two", target=None):
    try:
        c = compile_file(path, mesh)
    except DiagnosticError as e:
        diags = e.diagnostics
    else:
        diags = check_target(c.plan, c.doc, target) if target else []
    return [(d.code, d.message, d.help or "") for d in diags if d.severity == "error"]


def stages(path, mesh="two"):
    pp = compile_file(path, mesh).plan.pipeline
    return {s.index: (s.rank, s.units) for s in pp.stages}


def test_devices_give_the_stages_stage_fields_give(tmp_path):
    # a block's layers on device 1: every copy there, as `stage: 1` on the repeat
    by_device = spec(tmp_path, "dev", inp="device: 0", fc="device: 1")
    by_stage = spec(tmp_path, "stage", inp="stage: 0", blocks="stage: 1")
    assert stages(by_device) == stages(by_stage) == {0: (0, ("inp",)), 1: (1, ("blocks[0:4]", "mid", "head"))}
    # the torch programs are the same but for the spec's name and hashes
    strip = re.compile(r"^(SPEC_HASH|MODEL_HASH|SPEC_FILE) = .*$", re.MULTILINE)
    a, b = (strip.sub("", program_text(render_files(compile_file(p, "two"), "torch", "x"))) for p in (by_device, by_stage))
    assert a == b
    # interleaved: devices 0, 1, 0, 1 are stages 0-3 on pipe 2 x virtual_stages 2
    inter = spec(tmp_path, "inter", blocks="device: 1", mid="device: 0", head="device: 1",
                 pipeline="schedule: interleaved, virtual_stages: 2")
    assert stages(inter) == {0: (0, ("inp",)), 1: (1, ("blocks[0:4]",)), 2: (0, ("mid",)), 3: (1, ("head",))}
    # a mesh without `pipe` runs every layer on its one device
    assert set(compile_file(inter, "one").plan.pipeline.layer_stage.values()) == {0}


@pytest.mark.parametrize("fields, message, hint", [
    # a stage boundary inside every copy of a block
    (dict(fc="device: 0", act="device: 1", blocks=None),
     "block `res` puts its layers on devices 0, 1", "splits the 4 copies of `blocks` evenly, 2 per stage"),
    # runs out of the schedules' order
    (dict(inp="device: 1", blocks="device: 0"),
     "`inp` on device 1 would run stage 0, which the schedules run on device 0",
     "nearest placement that runs: `inp`: device 0; `blocks`..`head`: device 1"),
    # back to device 0: three runs for two stages; the last ones join the last stage
    (dict(blocks="device: 1", head="device: 0"), "make 3 stages",
     "nearest placement that runs: `inp`: device 0; `blocks`..`head`: device 1"),
    # one run for two stages
    (dict(inp="device: 0"), "make 1 stages", "or no `pipe` axis"),
    (dict(head="device: 2"), "`head` is on device 2, but the `pipe` axis has 2 devices", "use devices 0 to 1"),
    (dict(inp="stage: 0, device: 0"), "`inp` has both `stage:` and `device:`", "give one of them"),
    (dict(inp="stage: 0", head="device: 1"), "`inp` has a `stage:` and `head` a `device:`", "place the layers one way"),
    (dict(fc="device: 1", blocks="device: 0"), "`blocks` is on device 0 and its block `res`'s layers on device 1",
     "give the device once"),
])
def test_placements_no_schedule_runs_are_e054_with_the_nearest_one(tmp_path, fields, message, hint):
    fields = {k: v for k, v in fields.items() if v}
    (err,) = errors(spec(tmp_path, **fields))
    assert err[0] == "E054" and message in err[1] and hint in err[2], err


def test_the_nearest_placement_validates(tmp_path):
    # the help's placement, written back into the spec, is accepted
    (err,) = errors(spec(tmp_path, "bad", inp="device: 1", blocks="device: 0"))
    assert "`inp`: device 0; `blocks`..`head`: device 1" in err[2]
    assert errors(spec(tmp_path, "good", inp="device: 0", blocks="device: 1")) == []


def test_jax_runs_device_placement_of_one_block_and_refuses_a_layer_between_its_repeats(tmp_path):
    # every copy on device 1, `inp` alone on device 0: the jax program pads stage 0 (tests/test_jax_pipeline.py)
    path = spec(tmp_path, fc="device: 1")
    path.write_text(path.read_text().replace("targets: [torch]", "targets: [jax]"))
    assert errors(path, target="jax") == []
    # two repeats of the block with `mid` between them: torch runs it, the jax pipeline does not
    split = spec(tmp_path, "split", blocks="device: 0", mid="device: 1")
    split.write_text(split.read_text().replace("    - {op: linear, name: head", "    - {repeat: 2, block: res, name: more}\n"
                                               "    - {op: linear, name: head"))
    assert errors(split, target="torch") == []
    (err,) = errors(split, target="jax")
    assert err[0] == "E049" and "`mid` runs between the repeats `blocks` and `more`" in err[1], err


MOE_STAGES = Path(__file__).parent / "specs" / "moe-stages.yaml"


def test_jax_runs_stages_of_several_blocks_and_counts_each_blocks_rows(tmp_path):
    """tests/specs/moe-stages.yaml (dense, sparse x 2, dense on pipe=3): the jax program stacks each block's
    copies apart, each stage holding as many rows of each as the stage with the most copies of it (tests/
    test_pipeline_moe.py runs it); the plan counts exactly those rows on every pipe rank."""
    c = compile_file(MOE_STAGES)
    assert errors(MOE_STAGES, None, target="jax") == []
    plan = c.plan
    size = {p.name: p.bytes for p in plan.params}
    copy = {r: sum(b for n, b in size.items() if n.startswith(f"{r}.0.")) for r in ("first", "middle")}
    outside = sum(b for n, b in size.items() if n.split(".")[0] not in ("first", "middle", "last"))
    # every rank: 1 row of the dense stack, 2 of the sparse one (stage 1's copies), and the layers outside
    assert plan.memory_for("jax").params == outside + copy["first"] + 2 * copy["middle"]
    text = program_text(render_files(c, "jax", "x"))
    assert 'STACK_ORDERS = {"first": (0, -1, 3), "middle": (-1, -1, 1, 2, -1, -1)}' in text
    assert 'PIPELINED_COPIES = ("first.0", "middle.0", "middle.1", "last.0")' in text
    assert "jax.lax.switch(chunk * PIPE + jax.lax.axis_index(\"pipe\"), stages, sp, x)" in text
    # (the stacked arrays of each block, under its first repeat's name; `last` has none of its own)
    assert '"middle.*.ffn.router.weight": P("pipe"' in text and '"last.*.' not in text


def test_jax_refuses_batch_norm_in_stages_of_several_blocks(tmp_path):
    path = tmp_path / "bn.yaml"
    path.write_text(MOE_STAGES.read_text().replace(
        "      - {op: add, name: res2, inputs: [res1, ffn]}\n    sparse:",
        "      - {op: batch_norm, name: bn}\n      - {op: add, name: res2, inputs: [res1, bn]}\n    sparse:"))
    assert errors(path, None, target="torch") == []
    (err,) = errors(path, None, target="jax")
    assert err[0] == "E049" and "`middle` repeats block `sparse` and `first` block `dense`, and `bn` keeps running " \
        "statistics" in err[1], err
