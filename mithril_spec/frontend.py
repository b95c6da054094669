"""The front end in one call: file -> Document (with extends) -> Spec -> Graph -> Plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from .extends import load_spec_file
from .graph import Graph, resolve
from .planner.plan import Plan, make_plan
from .source import Document
from .spec.root import Spec
from .validate import validate

SPEC_SUFFIXES = (".yaml", ".yml", ".toml")


@dataclasses.dataclass(frozen=True)
class Compiled:
    doc: Document
    spec: Spec
    graph: Graph
    plan: Plan


def compile_document(doc: Document, mesh: Optional[str] = None, devices: Optional[int] = None) -> Compiled:
    spec = validate(doc)
    graph = resolve(spec, doc)
    plan = make_plan(spec, doc, graph, mesh, devices)
    return Compiled(doc, spec, graph, plan)


def compile_file(path: str | Path, mesh: Optional[str] = None, devices: Optional[int] = None) -> Compiled:
    return compile_document(load_spec_file(path), mesh, devices)
