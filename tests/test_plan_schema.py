"""`plan --format json` has a published JSON Schema (schemas/plan.schema.json), generated from the pydantic
models that produce the document, and every example's plan conforms to it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema  # a dev dependency: these tests must not skip themselves
import pytest

from mithril_spec import cli
from mithril_spec.schema import PLAN_SCHEMA_ID, plan_schema_text

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "plan.schema.json"
EXAMPLES = sorted(p for p in (ROOT / "specs").iterdir() if p.suffix in (".yaml", ".toml"))
BROKEN = ROOT / "tests" / "specs" / "broken"
STALE = "schemas/plan.schema.json is stale: run `mithril-spec schema --plan`"


def plan_output(capsys, spec: Path, *extra: str, expect_rc: int = 0) -> dict:
    rc = cli.main(["plan", str(spec), "--format", "json", *extra])
    out, err = capsys.readouterr()
    assert rc == expect_rc, err
    return json.loads(out)


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_committed_plan_schema_is_current():
    assert SCHEMA.is_file(), "schemas/plan.schema.json is missing: run `mithril-spec schema --plan`"
    assert SCHEMA.read_text(encoding="utf-8") == plan_schema_text(), STALE


def test_plan_schema_command(capsys, tmp_path):
    assert cli.main(["schema", "--plan", "--check"]) == 0  # the default path is the committed file
    capsys.readouterr()
    target = tmp_path / "plan.schema.json"
    assert cli.main(["schema", "--plan", "-o", str(target), "--check"]) == 1  # missing counts as stale
    assert "mithril-spec schema --plan" in capsys.readouterr().err
    assert cli.main(["schema", "--plan", "-o", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == SCHEMA.read_text(encoding="utf-8")


def test_plan_schema_is_reproducible_in_another_process():
    """Another hash seed (set and dict order) prints the committed file byte for byte."""
    proc = subprocess.run(
        [sys.executable, "-m", "mithril_spec.cli", "schema", "--plan", "-o", "-"],
        check=False, cwd=ROOT, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "4242"},
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == SCHEMA.read_bytes(), STALE


def test_plan_schema_is_a_2020_12_schema(validator):
    schema = validator.schema
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == PLAN_SCHEMA_ID
    assert list(schema["properties"]) == ["format", "name", "mesh", "batch", "inputs", "params", "repeats",
                                          "totals", "pipeline", "diagnostics", "costs", "predicted"]
    assert schema["required"] == list(schema["properties"])
    assert schema["additionalProperties"] is False

    def undescribed(node, where):  # every field is documented
        if isinstance(node, dict):
            for key, prop in node.get("properties", {}).items():
                if "description" not in prop:
                    yield f"{where}.{key}"
            for key, sub in node.items():
                yield from undescribed(sub, f"{where}.{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                yield from undescribed(sub, f"{where}[{i}]")

    assert not list(undescribed(schema, "#"))


@pytest.mark.parametrize("hardware", [None, "h100-sxm-80gb"], ids=["estimate", "h100"])
@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.name)
def test_example_plans_conform(capsys, validator, spec, hardware):
    doc = plan_output(capsys, spec, *(["--hardware", hardware] if hardware else []))
    validator.validate(doc)
    assert (doc["costs"]["hardware"] is None) == (hardware is None)
    assert (doc["costs"]["time"] is None) == (hardware is None)


@pytest.mark.parametrize("target", ["torch", "jax", "mlx"])
def test_target_plans_carry_the_programs_predictions(capsys, validator, target):
    """`plan --target T` (a build's plan.json): `predicted`, what T's program's --profile compares with; null
    without --target and for mlx (its programs do not profile)."""
    assert plan_output(capsys, ROOT / "specs" / "mlp-dp.yaml")["predicted"] is None
    doc = plan_output(capsys, ROOT / "specs" / "mlp-dp.yaml", "--target", target)
    validator.validate(doc)
    predicted = doc["predicted"]
    assert (predicted is None) == (target == "mlx")
    if predicted is not None:
        assert predicted["peak_bytes"] == doc["costs"]["peak_bytes"] and predicted["offload"] is None
        assert set(predicted["profiles"]) == {name for _, name in predicted["device_profiles"]} >= {"cpu"}
        bad = copy.deepcopy(doc)
        bad["predicted"]["profiles"]["cpu"]["step_s"] = "fast"
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(bad)


@pytest.mark.parametrize("extra", [[], ["--hardware", "h100"], ["--mesh", "pipe4"]], ids=["default", "h100", "pipe4"])
def test_pipelined_plan_conforms(capsys, validator, extra):
    doc = plan_output(capsys, ROOT / "specs" / "gpt-pipe.yaml", *extra)
    validator.validate(doc)
    assert doc["pipeline"] is not None and doc["pipeline"]["stages"]
    assert len(doc["costs"]["stages"]) == doc["pipeline"]["pipe"] > 1
    # a repeat's stage runs are the `blocks[a:b]` slices of the pipeline's stages
    slices = [(s["index"], layer) for s in doc["pipeline"]["stages"] for layer in s["layers"] if "[" in layer]
    (rep,) = doc["repeats"]
    assert [(st["stage"], f"{rep['name']}[{st['start']}:{st['end']}]") for st in rep["stages"]] == slices


def test_plans_with_diagnostics_conform(capsys, validator):
    warned = plan_output(capsys, BROKEN / "unused_rule_warning.yaml")
    assert [d["code"] for d in warned["diagnostics"]] == ["W002"]
    validator.validate(warned)
    # a plan that does not fit: exit 1, still the plan document, with E050 among its diagnostics
    full = plan_output(capsys, BROKEN / "does_not_fit_memory.yaml", "--hardware", "tpu-v5e", expect_rc=1)
    assert "E050" in [d["code"] for d in full["diagnostics"]] and full["costs"]["fits"] is False
    validator.validate(full)


@pytest.mark.parametrize(
    "path, value",
    [
        (("batch", "global"), "32"),  # a string for an integer
        (("mesh", "axes", "data"), 2.5),
        (("params", 0, "layout"), "tensor"),
        (("costs", "peak_bytes"), None),
        (("costs", "flops", "forward"), "1e9"),
        (("costs", "stages", 0, "collectives"), {}),
        (("diagnostics",), [{"code": "W001", "severity": "note", "message": "m"}]),
        (("format",), 1),  # format 1 listed every copy of a repeated block under `params`
        (("totals", "per_device", "vram"), 1),  # an unknown key
        (("repeats", 0, "params", 0, "stage"), 0),  # a block parameter's stage is its copy's: `stages`
        (("repeats", 0, "stages", 0, "end"), "4"),
        (("repeats", 0, "count"), None),
    ],
)
def test_schema_rejects_a_wrong_document(capsys, validator, path, value):
    doc = plan_output(capsys, ROOT / "specs" / "gpt-tiny.yaml")
    validator.validate(doc)
    bad = copy.deepcopy(doc)
    node = bad
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)


def test_schema_rejects_a_missing_key(capsys, validator):
    doc = plan_output(capsys, ROOT / "specs" / "mlp-tp.yaml")
    del doc["costs"]["stages"][0]["peak"]
    with pytest.raises(jsonschema.ValidationError, match="'peak' is a required property"):
        validator.validate(doc)
