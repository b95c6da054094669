"""The command line: exit codes, `validate`, `plan` (text and JSON), output formats, `--strict`, `explain`."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from mithril_spec import cli
from mithril_spec.codes import CATALOG
from mithril_spec.planner.plan_json import per_copy_params

ROOT = Path(__file__).resolve().parent.parent
SPECS_DIR = ROOT / "specs"
EXAMPLES = sorted(
    p for p in SPECS_DIR.iterdir() if p.suffix in (".yaml", ".yml", ".toml") and not p.name.startswith("_")
)
BROKEN = ROOT / "tests" / "specs" / "broken"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "internal error" not in err
    return rc, out, err


def plan_json(capsys, spec, *extra) -> dict:
    rc, out, err = run(capsys, "plan", spec, "--format", "json", *extra)
    assert rc == 0, err
    return json.loads(out)


def mesh_names(capsys, spec) -> list[str | None]:
    """None (the default) plus every named mesh of the spec."""
    from mithril_spec.frontend import compile_file

    c = compile_file(spec)
    return [None] + list(c.spec.meshes or {})


def table_rows(text: str) -> dict[str, list[str]]:
    """The plan table as {first cell: cells}, cells split on runs of two or more spaces."""
    rows = {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 5:
            rows[cells[0]] = cells
    return rows


# ---------------------------------------------------------------- exit codes


def test_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"mlp-dp.yaml", "mlp-dp.toml", "cnn-dp.yaml", "gpt-tiny.yaml", "mlp-tp.yaml"} <= names


def test_validate_examples_directory_exits_0(capsys):
    rc, _out, err = run(capsys, "validate", SPECS_DIR)
    assert rc == 0, err
    assert f"{len(EXAMPLES)} spec(s) checked: 0 error(s), 0 warning(s) - ok" in err


def test_validate_examples_strict_exits_0(capsys):
    rc, out, _err = run(capsys, "validate", SPECS_DIR, "--strict", "--format", "json")
    assert rc == 0, out
    assert json.loads(out) == []


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.name)
def test_validate_each_example(spec, capsys):
    assert run(capsys, "validate", spec)[0] == 0


def test_validate_broken_exits_1(capsys):
    rc, _out, err = run(capsys, "validate", BROKEN / "undefined_dim.yaml")
    assert rc == 1
    assert "1 spec(s) checked: 1 error(s), 0 warning(s) - failed" in err


def test_validate_good_and_bad_together_exits_1(capsys):
    rc, _out, err = run(capsys, "validate", SPECS_DIR / "mlp-dp.yaml", BROKEN / "undefined_dim.yaml")
    assert rc == 1
    assert "2 spec(s) checked: 1 error(s)" in err


def test_validate_directory_of_broken_specs_reports_every_file(capsys):
    rc, out, _err = run(capsys, "validate", BROKEN, "--format", "json")
    assert rc == 1
    files = {Path(d["file"]).name for d in json.loads(out)}
    # base specs in bases/ are found too (they are not `_`-prefixed); at least every corpus file is there
    corpus = {
        p.name
        for p in BROKEN.iterdir()
        if p.is_file() and p.suffix in (".yaml", ".toml") and "# args:" not in p.read_text(errors="replace")
    }
    extends_into_bases = {n for n in corpus if n.startswith("extends_base") or n == "extends_cycle.yaml"}
    assert corpus - extends_into_bases <= files


def test_validate_skips_underscore_base_files_in_directories(tmp_path, capsys):
    (tmp_path / "_base.yaml").write_text("version: 1\nname: [unfinished\n")
    shutil.copy(SPECS_DIR / "mlp-dp.yaml", tmp_path / "mlp.yaml")
    rc, _out, err = run(capsys, "validate", tmp_path)
    assert rc == 0, err
    assert "1 spec(s) checked" in err
    # named explicitly, a base file is checked
    assert run(capsys, "validate", tmp_path / "_base.yaml")[0] == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "no/such/file.yaml"],
        ["plan", "no/such/file.yaml"],
        ["validate", "README.md"],  # not a spec file
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--mesh", "data=x"],
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--mesh", "data:2"],
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--mesh", "data=2,data=2"],
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--mesh", "dta=2"],
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--mesh", "nosuch"],
        ["validate", SPECS_DIR, "--mesh", "nosuch"],
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--mesh", "data=\u0662"],  # an Arabic-Indic 2: not a size
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--mesh", "data=" + "\u0669" * 5000],  # (was an internal error)
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--devices", "0"],  # (was E046 "0 are given", exit 1)
        ["validate", SPECS_DIR / "gpt-tiny.yaml", "--devices", "-1"],
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--top", "3"],  # --top without --auto (was ignored)
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--auto", "--top", "0", "--hardware", "cpu"],
        ["plan", SPECS_DIR],  # a directory (was "no such file")
        ["explain", "E999"],
        ["explain", "nonsense"],
        ["validate"],  # argparse: PATH required
        ["plan", SPECS_DIR / "gpt-tiny.yaml", "--format", "github"],  # not a plan format
        ["frobnicate"],
        [],
    ],
    ids=lambda a: " ".join(map(str, a))[:60].replace(str(ROOT) + "/", ""),
)
def test_usage_errors_exit_2(argv, capsys):
    rc, _out, err = run(capsys, *argv)
    assert rc == 2
    assert "error" in err


def test_count_flags_below_1_and_directories_are_said_so(capsys):
    err = run(capsys, "plan", SPECS_DIR / "gpt-tiny.yaml", "--devices", "0")[2]
    assert "--devices must be at least 1 (got 0)" in err and "E046" not in err
    err = run(capsys, "plan", SPECS_DIR / "gpt-tiny.yaml", "--top", "2")[2]
    assert "--top needs --auto" in err
    err = run(capsys, "build", SPECS_DIR, "--target", "jax", "-o", "unused")[2]
    assert f"{SPECS_DIR}: is a directory, not a spec file" in err


def test_validate_walk_skips_directories_named_like_specs(tmp_path, capsys):
    (tmp_path / "old.yaml").mkdir()  # a directory whose name ends in .yaml is walked, not read
    shutil.copy(SPECS_DIR / "mlp-dp.yaml", tmp_path / "old.yaml" / "mlp.yaml")
    rc, _out, err = run(capsys, "validate", tmp_path)
    assert rc == 0, err
    assert "1 spec(s) checked" in err


def test_usage_error_messages(capsys):
    err = run(capsys, "plan", SPECS_DIR / "gpt-tiny.yaml", "--mesh", "nosuch")[2]
    assert "no mesh named `nosuch`" in err and "default, fsdp_tp, single" in err
    err = run(capsys, "plan", SPECS_DIR / "gpt-tiny.yaml", "--mesh", "tensr=2")[2]
    assert "unknown mesh axis `tensr`" in err and "did you mean `tensor`?" in err
    _rc, _out, err = run(capsys, "validate", "no/such/file.yaml")
    assert "no/such/file.yaml: no such file" in err


def test_mesh_override_and_named_mesh(capsys):
    spec = SPECS_DIR / "gpt-tiny.yaml"
    j = plan_json(capsys, spec, "--mesh", "data=4,tensor=2")
    assert j["mesh"] == {"name": "cli", "axes": {"data": 4, "tensor": 2}, "devices": 8}
    assert j["batch"]["data_parallel"] == 4
    j = plan_json(capsys, spec, "--mesh", "fsdp_tp")
    assert j["mesh"]["name"] == "fsdp_tp" and j["mesh"]["axes"] == {"fsdp": 2, "tensor": 2}


def test_mesh_override_that_breaks_the_plan_exits_1(capsys):
    rc, _out, err = run(capsys, "plan", SPECS_DIR / "mlp-dp.yaml", "--mesh", "data=3", "--color", "never")
    assert rc == 1
    assert "error[E043]" in err and "data-parallel degree of 3" in err


def test_devices_flag(capsys):
    assert run(capsys, "validate", SPECS_DIR / "gpt-tiny.yaml", "--devices", "8", "--mesh", "default")[0] == 0
    assert run(capsys, "plan", SPECS_DIR / "gpt-tiny.yaml", "--devices", "4", "--mesh", "fsdp_tp")[0] == 0
    rc, out, _err = run(capsys, "validate", SPECS_DIR / "gpt-tiny.yaml", "--devices", "4", "--format", "json")
    assert rc == 1
    diags = json.loads(out)
    assert {d["code"] for d in diags} == {"E046"}
    # every named mesh is checked: default (8), fsdp_tp (4 devices: fine) and single (1)
    assert any("(mesh `single`)" in d["message"] for d in diags)
    assert not any("fsdp_tp" in d["message"] for d in diags)


# ---------------------------------------------------------------- plan


def _all_plans(capsys):
    for spec in EXAMPLES:
        for mesh in mesh_names(capsys, spec):
            yield spec, mesh


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.name)
def test_plan_text_and_json_for_every_example_and_mesh(spec, capsys):
    for mesh in mesh_names(capsys, spec):
        extra = ["--mesh", mesh] if mesh else []
        j = plan_json(capsys, spec, *extra)
        rc, out, err = run(capsys, "plan", spec, *extra)
        assert rc == 0, err
        assert err == ""
        lines = out.splitlines()
        assert lines[0].startswith(f"plan for {j['name']} on mesh `{j['mesh']['name']}`")
        assert re.split(r"\s{2,}", lines[3].strip()) == [
            "parameter",
            "shape",
            "logical axes",
            "layout",
            "per device",
            "bytes/device",
        ] + (["stage"] if j["pipeline"] else [])
        rows = table_rows(out)
        entries = [(p["name"], p, 1) for p in j["params"]] + [
            (f"{r['name']}.[0-{r['count'] - 1}].{p['name']}" if r["count"] > 1 else f"{r['name']}.[0].{p['name']}",
             p, r["count"]) for r in j["repeats"] for p in r["params"]]
        for name, p, _n in entries:  # one row per parameter, one per block parameter for all its copies
            assert name in rows or f"{name} (buffer)" in rows
            row = rows.get(name) or rows[f"{name} (buffer)"]
            assert row[1] == "[" + ", ".join(map(str, p["shape"])) + "]"
            assert row[4] == "[" + ", ".join(map(str, p["local_shape"])) + "]"
        table = lines[5:lines.index("", 5)]
        assert len([r for r in table if not r.startswith("input ")]) == len(entries)
        for i in j["inputs"]:
            assert f"input {i['name']}" in rows
        assert f"parameters: {j['totals']['param_count']:,} " in out
        assert f"forward FLOPs per sample: {j['totals']['flops_per_sample_forward']:,}" in out

        # JSON: self-consistent
        assert j["format"] == 2
        assert j["mesh"]["devices"] == math.prod(j["mesh"]["axes"].values())
        assert j["totals"]["param_count"] == sum(math.prod(p["shape"]) * n for _, p, n in entries if not p["buffer"])
        assert j["totals"]["param_bytes"] == sum(p["bytes"] * n for _, p, n in entries if not p["buffer"])
        for r in j["repeats"]:  # the stage runs cover the copies in order
            assert [(s["start"], s["end"]) for s in r["stages"]] == list(
                zip([0] + [s["end"] for s in r["stages"][:-1]], [s["end"] for s in r["stages"]]))
            assert r["stages"][-1]["end"] == r["count"] and all(s["start"] < s["end"] for s in r["stages"])
        for _, p, _n in entries:
            assert len(p["layout"]) == len(p["shape"]) == len(p["local_shape"]) == len(p["axes"])
            for size, local, axes in zip(p["shape"], p["local_shape"], p["layout"]):
                degree = math.prod(j["mesh"]["axes"].get(a, 1) for a in axes or [])
                assert size % degree == 0 and local == size // degree
        b = j["batch"]
        assert b["micro_batch"] * b["grad_accum"] == b["global"]
        assert b["per_device"] * b["data_parallel"] == b["micro_batch"]
        assert j["diagnostics"] == []


def test_plan_gpt_tiny_default_mesh(capsys):
    spec = SPECS_DIR / "gpt-tiny.yaml"
    rc, out, _err = run(capsys, "plan", spec)
    assert rc == 0
    assert out.startswith("plan for gpt-tiny on mesh `default`: data=2, fsdp=2, tensor=2 (8 device(s))\n")
    assert "split over data, fsdp (data-parallel degree 4): 4 per device" in out
    rows = table_rows(out)
    assert rows["wte.weight"][1:] == ["[256, 128]", "[vocab, embed]", "[-, fsdp]", "[256, 64]", "64.0 KiB"]
    assert rows["wpe.weight"][1:] == ["[64, 128]", "[-, embed]", "[-, fsdp]", "[64, 64]", "16.0 KiB"]
    assert rows["blocks.[0-3].attn.q.weight"][1:] == [
        "[128, 128]",
        "[embed, heads]",
        "[fsdp, tensor]",
        "[64, 64]",
        "16.0 KiB",
    ]
    assert rows["blocks.[0-3].attn.o.weight"][3] == "[tensor, fsdp]"
    assert rows["blocks.[0-3].mlp.fc.weight"][1:] == [
        "[128, 512]",
        "[embed, mlp]",
        "[fsdp, tensor]",
        "[64, 256]",
        "64.0 KiB",
    ]
    assert rows["blocks.[0-3].mlp.fc.bias"][3:5] == ["[(tensor,fsdp)]", "[128]"]
    assert rows["ln_f.bias"][3] == "[fsdp]"
    assert rows["input tokens"][1:] == ["[batch, 64]", "[batch, seq]", "[(data,fsdp), -]", "[4, 64]", "int32"]
    assert "lm_head.weight" not in rows  # tied to wte
    # the copies of the repeated block are one row each block parameter, not one per copy
    assert "blocks.[0-3].ln1.weight" in rows and not [r for r in rows if re.match(r"blocks\.\d", r)]
    assert "blocks.[0-3].*: 4 copies of block `decoder` (copy i is `blocks.i.*`)" in out
    assert "parameters: 832,256 (3.2 MiB in float32)" in out

    j = plan_json(capsys, spec)
    assert j["totals"]["param_count"] == 832_256
    wte = next(p for p in j["params"] if p["name"] == "wte.weight")
    assert wte["layout"] == [None, ["fsdp"]] and wte["local_shape"] == [256, 64]
    assert [p["name"] for p in j["params"]] == ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
    (blocks,) = j["repeats"]
    assert (blocks["name"], blocks["block"], blocks["count"]) == ("blocks", "decoder", 4)
    assert blocks["stages"] == [{"stage": 0, "start": 0, "end": 4}]
    assert len(blocks["params"]) == 12 and blocks["params"][2]["name"] == "attn.q.weight"
    assert len(per_copy_params(j)) == 2 + 4 * 12 + 2


def test_plan_explicit_param_layout(tmp_path, capsys):
    """`sharding.params` overrides the rules for the parameters its glob matches."""
    text = (SPECS_DIR / "gpt-tiny.yaml").read_text()
    text = text.replace("sharding:\n  rules:\n", 'sharding:\n  params:\n    "wte.weight": [tensor, fsdp]\n  rules:\n')
    spec = tmp_path / "gpt.yaml"
    spec.write_text(text)
    rc, out, err = run(capsys, "plan", spec)
    assert rc == 0, err
    assert table_rows(out)["wte.weight"][3:5] == ["[tensor, fsdp]", "[128, 64]"]
    j = plan_json(capsys, spec, "--mesh", "single")
    assert next(p for p in j["params"] if p["name"] == "wte.weight")["layout"] == [None, None]


def test_plan_single_mesh_replicates_everything(capsys):
    j = plan_json(capsys, SPECS_DIR / "gpt-tiny.yaml", "--mesh", "single")
    assert j["mesh"]["devices"] == 1
    assert all(all(d is None for d in p["layout"]) for p in per_copy_params(j))
    assert j["totals"]["per_device"]["params"] == j["totals"]["param_bytes"]


def test_plan_mlp_tp_megatron_layout(capsys):
    rows = table_rows(run(capsys, "plan", SPECS_DIR / "mlp-tp.yaml")[1])
    assert rows["fc1.weight"][3] == "[-, tensor]"  # column-parallel
    assert rows["fc1.bias"][3] == "[tensor]"
    assert rows["fc2.weight"][3] == "[tensor, -]"  # row-parallel
    assert rows["fc2.bias"][3] == "[-]"
    assert rows["input x"][3:5] == ["[data, -]", "[16, 128]"]


def test_plan_cnn_buffers_and_counts(capsys):
    j = plan_json(capsys, SPECS_DIR / "cnn-dp.yaml")
    names = [p["name"] for p in j["params"]]
    assert names == ["conv1.weight", "conv1.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert j["params"][0]["shape"] == [32, 3, 3, 3]
    assert j["params"][2]["shape"] == [32 * 15 * 15, 128]
    assert j["batch"]["per_device"] == 8
    # sgd with momentum: one optimizer slot
    assert j["totals"]["per_device"]["optimizer"] == j["totals"]["per_device"]["params"]


def _with_layers(tmp_path, spec: Path, layers: int, name: str | None = None) -> Path:
    text = spec.read_text()
    assert "layers: 4}" in text
    out = tmp_path / (name or f"{spec.stem}-{layers}.yaml")
    out.write_text(text.replace("layers: 4}", f"layers: {layers}}}"))
    return out


def _param_sections(j: dict) -> dict:
    """`params` and `repeats` without what says how many copies there are."""
    reps = [{k: v for k, v in r.items() if k not in ("count", "stages")} for r in j["repeats"]]
    return {"params": j["params"], "repeats": reps}


@pytest.mark.parametrize("spec, few, many", [("gpt-tiny.yaml", 2, 16), ("gpt-pipe.yaml", 4, 32)])
def test_plan_does_not_grow_with_the_copies(tmp_path, capsys, spec, few, many):
    """A repeated block is one block in the plan: the text table has one row per block parameter and the
    JSON one entry, whatever the repeat count; only the counts, the stage runs' bounds and the totals differ."""
    small, big = (_with_layers(tmp_path, SPECS_DIR / spec, n) for n in (few, many))
    texts = [run(capsys, "plan", s)[1] for s in (small, big)]
    assert len(texts[0].splitlines()) == len(texts[1].splitlines())
    assert f"blocks.[0-{many - 1}].attn.q.weight" in texts[1] and "blocks.5." not in texts[1]
    js = [plan_json(capsys, s) for s in (small, big)]
    assert _param_sections(js[0]) == _param_sections(js[1])
    assert len(js[0]["params"]) == len(js[1]["params"])
    assert [len(r["params"]) for r in js[0]["repeats"]] == [len(r["params"]) for r in js[1]["repeats"]] == [12]
    (r0,), (r1,) = js[0]["repeats"], js[1]["repeats"]
    assert (r0["count"], r1["count"]) == (few, many)
    assert len(r0["stages"]) == len(r1["stages"]) == (2 if js[0]["pipeline"] else 1)
    # the document's size depends on the number of digits only
    assert abs(len(json.dumps(js[1])) - len(json.dumps(js[0]))) < 400
    assert js[1]["totals"]["param_count"] > js[0]["totals"]["param_count"]
    assert len(per_copy_params(js[1])) - len(per_copy_params(js[0])) == 12 * (many - few)


def test_plan_pipeline_stage_of_every_copy(capsys):
    """gpt-pipe: copies 0-1 on stage 0, 2-3 on stage 1, in the text's stage column and in the JSON."""
    _rc, out, _err = run(capsys, "plan", SPECS_DIR / "gpt-pipe.yaml")
    rows = table_rows(out)
    assert rows["blocks.[0-3].attn.q.weight"][6] == "[0-1]: 0, [2-3]: 1"
    assert rows["wte.weight"][6] == "0" and rows["lm_head.weight"][6] == "1"
    j = plan_json(capsys, SPECS_DIR / "gpt-pipe.yaml")
    assert j["repeats"][0]["stages"] == [{"stage": 0, "start": 0, "end": 2}, {"stage": 1, "start": 2, "end": 4}]
    assert j["pipeline"]["stages"][0]["layers"][-1] == "blocks[0:2]"
    stage = {p["name"]: p["stage"] for p in per_copy_params(j)}
    assert stage["blocks.1.mlp.fc.weight"] == 0 and stage["blocks.2.ln1.weight"] == 1
    # pipe4 (4 stages, one copy each)
    j = plan_json(capsys, SPECS_DIR / "gpt-pipe.yaml", "--mesh", "pipe4")
    assert [(s["stage"], s["start"], s["end"]) for s in j["repeats"][0]["stages"]] == [(i, i, i + 1) for i in range(4)]
    rows = table_rows(run(capsys, "plan", SPECS_DIR / "gpt-pipe.yaml", "--mesh", "pipe4")[1])
    assert rows["blocks.[0-3].ln1.weight"][6] == "[0]: 0, [1]: 1, [2]: 2, [3]: 3"


@pytest.mark.parametrize("spec", EXAMPLES + [ROOT / "tests" / "specs" / "all-ops.yaml"], ids=lambda p: p.name)
def test_plan_json_copies_expand_to_the_plan(spec, capsys):
    """Expanding every block parameter to its copies (`<repeat>.<i>.<name>`) gives exactly the plan's
    parameters and buffers, with their shapes, layouts, local shapes, bytes and stages; totals unchanged."""
    from mithril_spec.frontend import compile_file

    for mesh in mesh_names(capsys, spec):
        c = compile_file(spec, mesh)
        j = plan_json(capsys, spec, *(["--mesh", mesh] if mesh else []))
        got = {p["name"]: p for p in per_copy_params(j)}
        plan = c.plan
        assert len(got) == len(per_copy_params(j)) == len(plan.params) + len(plan.buffers)
        for p in plan.params + plan.buffers:
            e = got[p.name]
            assert (e["shape"], e["local_shape"], e["dtype"], e["bytes"], e["local_bytes"], e["stage"], e["buffer"]) == (
                list(p.param.shape), list(p.local_shape), p.dtype, p.bytes, p.local_bytes, p.stage, not p.param.trainable)
            assert e["layout"] == [list(d) if d else None for d in p.spec] and e["axes"] == list(p.param.axes)
        assert j["totals"]["param_count"] == plan.param_count
        assert j["totals"]["param_bytes"] == sum(p.bytes for p in plan.params)
        assert j["totals"]["per_device"]["params"] == plan.memory.params
        assert [p["name"] for p in j["params"]] == [p.name for p in plan.top_params + plan.top_buffers]
        for r, rep in zip(j["repeats"], plan.repeats, strict=True):  # a block buffer is listed once too
            assert [p["name"] for p in r["params"]] == [b.local for b in rep.params + rep.buffers]


def test_plan_of_broken_spec_exits_1_with_diagnostics(capsys):
    rc, out, _err = run(capsys, "plan", BROKEN / "undefined_dim.yaml", "--format", "json")
    assert rc == 1
    assert [d["code"] for d in json.loads(out)] == ["E020"]


# ---------------------------------------------------------------- formats


def test_text_rendering_header_source_line_and_caret(capsys):
    path = BROKEN / "unknown_op.yaml"
    rc, _out, err = run(capsys, "validate", path, "--color", "never")
    assert rc == 1
    lines = err.splitlines()
    i = lines.index(f"{path}:11:12: error[E024]: unknown operator `layernorm`")
    assert lines[i + 1] == "    |"
    assert lines[i + 2] == " 11 |     - {op: layernorm, name: ln, input: x}"
    assert lines[i + 3] == "    |            ^^^^^^^^^"  # the whole span of `layernorm`
    assert lines[i + 3].index("^") - lines[i + 3].index("|") - 2 == 11  # column 12
    assert lines[i + 4] == "  = help: did you mean `layer_norm`?"


def test_text_rendering_colour(capsys):
    err = run(capsys, "validate", BROKEN / "unknown_op.yaml", "--color", "always")[2]
    assert "\x1b[1;31merror[E024]\x1b[0m" in err
    _rc, _out, err = run(capsys, "validate", BROKEN / "unknown_op.yaml", "--color", "never")
    assert "\x1b[" not in err


def test_text_rendering_of_a_warning(capsys):
    path = BROKEN / "unused_rule_warning.yaml"
    rc, _out, err = run(capsys, "validate", path, "--color", "never")
    assert rc == 0
    assert f"{path}:20:5: warning[W002]: the rule for `mpl` matches no parameter or input axis" in err
    assert "1 spec(s) checked: 0 error(s), 1 warning(s) - ok" in err


def test_json_format(capsys):
    path = BROKEN / "shape_mismatch_add.yaml"
    rc, out, err = run(capsys, "validate", path, "--format", "json")
    assert rc == 1
    assert err == ""
    (d,) = json.loads(out)
    assert d == {
        "code": "E028",
        "severity": "error",
        "file": str(path),
        "line": 12,
        "col": 36,
        "end_line": 12,
        "end_col": 45,
        "message": "`res`: add needs inputs of one shape, got [batch, 16] and [batch, 32]",
        "help": None,
        "notes": [],
        "labels": [],
        "path": ["model", "layers", 1, "inputs"],
        "key": None,
        "mesh": None,
        "spec": None,
    }


def test_github_format(capsys):
    path = BROKEN / "glob_matches_nothing.yaml"
    rc, out, _ = run(capsys, "validate", path, "--format", "github")
    assert rc == 1
    (line,) = out.splitlines()
    m = re.fullmatch(r"::error file=(.+),line=(\d+),col=(\d+),title=(E\d{3})::(.+)", line)
    assert m, line
    assert m.groups()[:4] == (str(path).replace(":", "%3A").replace(",", "%2C"), "20", "5", "E045")
    assert m.group(5).startswith("`attn.qq.weight` matches no parameter (help: did you mean `attn.q.weight`?)")

    rc, out, _err = run(capsys, "validate", BROKEN / "unused_rule_warning.yaml", "--format", "github")
    assert rc == 0 and out.startswith("::warning file=") and ",title=W002::" in out


def test_github_format_escapes_newlines_and_percent():
    from mithril_spec.diagnostics import Diagnostic, Position, render_github

    d = Diagnostic("E013", "50% of\nit", Position("a,b:c.yaml", 1, 2))
    assert render_github([d]) == "::error file=a%2Cb%3Ac.yaml,line=1,col=2,title=E013::50%25 of%0Ait\n"


def test_github_format_tells_secondary_labels_in_the_message():
    from mithril_spec.diagnostics import Diagnostic, Label, Position, render_github

    d = Diagnostic("E003", "duplicate key `a`", Position("s.yaml", 2, 1), labels=(
        Label(Position("s.yaml", 1, 1), "first defined here"), Label(Position("b.yaml", 3, 5), "extended here")))
    assert render_github([d]) == ("::error file=s.yaml,line=2,col=1,title=E003::duplicate key `a` "
                                  "(first defined here: line 1, column 1) (extended here: b.yaml:3:5)\n")


# ---------------------------------------------------------------- --strict


def test_strict_turns_w001_into_an_error(capsys):
    path = BROKEN / "large_param_replicated.yaml"
    rc, out, err = run(capsys, "validate", path, "--format", "json")
    assert rc == 0 and [d["severity"] for d in json.loads(out)] == ["warning"]
    rc, out, err = run(capsys, "validate", path, "--format", "json", "--strict")
    assert rc == 1 and [(d["code"], d["severity"]) for d in json.loads(out)] == [("W001", "error")]
    # plan: a warning is printed and the plan still shown; under --strict the plan is refused
    rc, out, err = run(capsys, "plan", path, "--color", "never")
    assert rc == 0 and "warning[W001]" in err and "fc.weight" in out
    rc, out, err = run(capsys, "plan", path, "--strict", "--color", "never")
    assert rc == 1 and "error[W001]" in err and out == ""


def test_strict_turns_w002_into_an_error(capsys):
    path = BROKEN / "unused_rule_warning.yaml"
    assert run(capsys, "validate", path)[0] == 0
    rc, _out, err = run(capsys, "validate", path, "--strict", "--color", "never")
    assert rc == 1 and "error[W002]" in err


def test_plan_json_carries_warnings(capsys):
    j = plan_json(capsys, BROKEN / "unused_rule_warning.yaml")
    assert [(d["code"], d["severity"]) for d in j["diagnostics"]] == [("W002", "warning")]


# ---------------------------------------------------------------- explain and schema


def test_explain_code(capsys):
    rc, out, _ = run(capsys, "explain", "E042")
    assert rc == 0
    assert out.startswith("E042 (error): sharded size not divisible\n\n")
    assert "6 heads over tensor=4" in out
    assert run(capsys, "explain", "e042")[1] == out  # case-insensitive
    rc, out, _err = run(capsys, "explain", "W001")
    assert out.startswith("W001 (warning): large parameter fully replicated")


def test_explain_lists_every_code(capsys):
    rc, out, _err = run(capsys, "explain")
    assert rc == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == list(CATALOG)
    assert f"E004  {CATALOG['E004'][0]}" in lines


def test_explain_unknown_code(capsys):
    rc, out, err = run(capsys, "explain", "E999")
    assert rc == 2 and "unknown code 'E999'" in err and out == ""


def test_schema_check_and_stdout(tmp_path, capsys):
    from mithril_spec.schema import schema_text

    rc, out, err = run(capsys, "schema", "-o", "-")
    assert rc == 0 and out == schema_text()
    target = tmp_path / "s.json"
    assert run(capsys, "schema", "-o", target, "--check")[0] == 1  # missing counts as stale
    rc, out, err = run(capsys, "schema", "-o", target)
    assert rc == 0 and target.read_text() == schema_text()
    assert run(capsys, "schema", "-o", target, "--check")[0] == 0
    target.write_text("{}")
    rc, out, err = run(capsys, "schema", "-o", target, "--check")
    assert rc == 1 and "run `mithril-spec schema`" in err


def test_non_utf8_file_is_a_broken_spec(tmp_path, capsys):
    """A file that exists but is not UTF-8 is a broken spec (exit 1, with a position), not a usage error."""
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("version: 1\nname: caf\xe9\n".encode("latin-1"))
    rc, _out, err = run(capsys, "validate", bad, "--color", "never")
    assert rc == 1
    assert f"{bad}:2:10: error[E001]: YAML syntax error: the file is not UTF-8 text (byte 0xe9)" in err
