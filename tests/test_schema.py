"""The committed JSON Schema is the one the pydantic models generate, and editors can find it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def test_schema_text_is_deterministic():
    assert schema_text() == schema_text()


@pytest.mark.parametrize("spec", YAML_EXAMPLES, ids=lambda p: p.name)
def test_yaml_examples_name_the_schema(spec):
    first = spec.read_text(encoding="utf-8").splitlines()[0]
    assert first == "# yaml-language-server: $schema=../schemas/mithril-spec.schema.json"
    assert (spec.parent / "../schemas/mithril-spec.schema.json").resolve() == SCHEMA.resolve()


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_json_schema(spec):
    jsonschema = pytest.importorskip("jsonschema")
    data = load_file(spec).data
    jsonschema.validate(data, json.loads(SCHEMA.read_text(encoding="utf-8")))


def test_schema_rejects_what_the_validator_rejects():
    """A few broken documents fail the JSON Schema too (when jsonschema is installed)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    good = load_file(ROOT / "specs" / "mlp-dp.yaml").data
    for broken in (
        {**good, "descripton": "x"},
        {**good, "training": {**good["training"], "batch_size": "sixteen"}},
        {k: v for k, v in good.items() if k != "model"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)
