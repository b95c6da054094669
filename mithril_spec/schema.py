"""The JSON Schema of the spec language, generated from the pydantic models."""

from __future__ import annotations

import json

SCHEMA_ID = "https://mithril-spec.dev/schemas/mithril-spec.schema.json"


def schema_text() -> str:
    from .spec.root import Spec

    schema = Spec.model_json_schema()
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
