"""The committed JSON Schema is the one the pydantic models generate, and editors can find it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema  # a dev dependency: these tests must not skip themselves
import pytest

from mithril_spec import cli
from mithril_spec.schema import schema_text
from mithril_spec.source import load_file

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "mithril-spec.schema.json"
YAML_EXAMPLES = sorted((ROOT / "specs").glob("*.yaml"))
EXAMPLES = sorted(p for p in (ROOT / "specs").iterdir() if p.suffix in (".yaml", ".toml"))


def test_committed_schema_is_current():
    assert SCHEMA.is_file(), "schemas/mithril-spec.schema.json is missing: run `mithril-spec schema`"
    assert SCHEMA.read_text(encoding="utf-8") == schema_text(), (
        "schemas/mithril-spec.schema.json is stale: run `mithril-spec schema`"
    )


def test_schema_is_json_schema():
    schema = json.loads(schema_text())
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["type"] == "object"
    assert {"version", "name", "model", "training"} <= set(schema["required"])
    assert schema["additionalProperties"] is False  # unknown keys are errors for editors too


@pytest.mark.parametrize("seed", ["0", "4242"])
def test_schema_command_writes_the_committed_schema_in_any_process(seed):
    """`mithril-spec schema` in a fresh process (another hash seed: set and dict order) prints the committed
    file byte for byte, so regenerating it never produces a spurious diff."""
    proc = subprocess.run(
        [sys.executable, "-m", "mithril_spec.cli", "schema", "-o", "-"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        env={**os.environ, "PYTHONHASHSEED": seed},
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == SCHEMA.read_bytes()


@pytest.mark.parametrize("spec", YAML_EXAMPLES, ids=lambda p: p.name)
def test_yaml_examples_name_the_schema(spec):
    first = spec.read_text(encoding="utf-8").splitlines()[0]
    assert first == "# yaml-language-server: $schema=../schemas/mithril-spec.schema.json"
    assert (spec.parent / "../schemas/mithril-spec.schema.json").resolve() == SCHEMA.resolve()


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_json_schema(spec):
    data = load_file(spec).data
    jsonschema.validate(data, json.loads(SCHEMA.read_text(encoding="utf-8")))


def test_schema_rejects_what_the_validator_rejects(tmp_path, capsys):
    """A few broken documents fail both the validator (E010, E012, E011) and the JSON Schema."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    good = load_file(ROOT / "specs" / "mlp-dp.yaml").data
    for code, broken in (
        ("E010", {**good, "descripton": "x"}),
        ("E012", {**good, "training": {**good["training"], "batch_size": "sixteen"}}),
        ("E011", {k: v for k, v in good.items() if k != "model"}),
    ):
        spec = tmp_path / "broken.yaml"
        spec.write_text(json.dumps(broken), encoding="utf-8")  # JSON is YAML
        assert cli.main(["validate", str(spec), "--format", "json"]) == 1
        assert [d["code"] for d in json.loads(capsys.readouterr().out)] == [code]
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)
