"""The JSON Schemas of the spec language and of `plan --format json`, generated from the pydantic models."""

from __future__ import annotations

import json

SCHEMA_ID = "https://mithril-spec.dev/schemas/mithril-spec.schema.json"


def schema_text() -> str:
    from .spec.root import Spec

    schema = Spec.model_json_schema()
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


PLAN_SCHEMA_ID = "https://mithril-spec.dev/schemas/plan.schema.json"


def plan_schema_text() -> str:
    """The JSON Schema of `plan --format json` (schemas/plan.schema.json), generated from the models in
    `planner/plan_document.py`. Properties keep the order the document prints its keys in."""
    from .planner.plan_document import PlanDocument

    schema = PlanDocument.model_json_schema(mode="serialization")
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": PLAN_SCHEMA_ID, **schema}
    return json.dumps(schema, indent=2) + "\n"
