"""The front end: file -> Document (with extends and `--set` overrides) -> Spec -> Graph -> Plan, in one call
(`compile_file`, raising the first stage's diagnostics) or stage by stage with every stage's diagnostics
kept, as the commands report them (`SpecFile`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from .diagnostics import Diagnostic, DiagnosticError, Label
from .extends import load_spec_file
from .graph import Graph, resolve
from .overrides import apply, is_override, source_name
from .planner.mesh import UsageError
from .planner.plan import Plan, make_plan
from .source import Document, load_file, read_source
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


def read_spec_file(path: Path, settings: Sequence[str] = ()):
    try:
        return apply(load_spec_file(path), settings)
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: cannot read as UTF-8 text ({e})") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror or e}") from None


class SpecFile:
    """One spec file as a command reads it: loaded (with `extends` and its `--set` overrides), validated and
    resolved once, and planned once per mesh, each stage's diagnostics kept (not raised) with their structured
    fields filled in (`finish`), so that a command reports every stage's problems, mesh by mesh."""

    def __init__(self, path: Path, devices: int | None, settings: Sequence[str] = ()):
        if path.is_dir():
            raise UsageError(f"{path}: is a directory, not a spec file")
        if not path.is_file():
            broken = path.is_symlink() and not path.exists()
            raise UsageError(f"{path}: " + (f"a broken symbolic link (to {os.readlink(path)})" if broken else
                                            "no such file"))
        if path.suffix.lower() not in SPEC_SUFFIXES:
            raise UsageError(f"{path}: not a spec file (expected {', '.join(SPEC_SUFFIXES)})")
        self.path, self.devices = path, devices
        self.doc = self.spec = self.graph = None
        self.diags: list[Diagnostic] = []  # of loading, validation and resolution
        self._plans: dict[str | None, tuple[Compiled | None, list[Diagnostic]]] = {}
        try:
            self.doc = read_spec_file(path, settings)
        except DiagnosticError as e:
            # (at most MAX_FILE_BYTES of each file: a file over the limit is shown from its start)
            self.sources = {str(path): read_source(path)} | {source_name(i): a for i, a in enumerate(settings, 1)}
            for d in e.diagnostics:  # an error inside a base spec reached through `extends`
                for where in [d.pos] + [lab.pos for lab in d.labels]:
                    if where and where.file not in self.sources and Path(where.file).is_file():
                        self.sources[where.file] = read_source(where.file)
            self.diags = self.finish(e.diagnostics)
            return
        self.sources = dict(self.doc.sources)
        try:
            self.spec = validate(self.doc)
            self.graph = resolve(self.spec, self.doc)
        except DiagnosticError as e:
            self.diags = self.finish(e.diagnostics)

    def compiled(self, mesh: str | None) -> tuple[Compiled | None, list[Diagnostic]]:
        """The plan for `mesh` (None: the spec's default) as a `Compiled`, or None when it failed; and its
        diagnostics (the planner's warnings, or the errors that stopped it, or those of an earlier stage)."""
        if self.graph is None:
            return None, list(self.diags)
        if mesh not in self._plans:
            try:
                plan = make_plan(self.spec, self.doc, self.graph, mesh, self.devices)
            except DiagnosticError as e:
                self._plans[mesh] = (None, self.finish(e.diagnostics))
            else:
                self._plans[mesh] = (Compiled(self.doc, self.spec, self.graph, plan), self.finish(plan.warnings))
        c, diags = self._plans[mesh]
        return c, list(diags)

    def finish(self, diags) -> list[Diagnostic]:
        """Fills in what a stage does not know: the path of the node a diagnostic points at, the spec that
        reached a base file through `extends` (with a label on that `extends`), the base spec's (or, for a
        `--set`, the spec's) value that the pointed-at value replaced, and the `--set KEY=null` that removed a
        missing key."""
        out = []
        for d in diags:
            changes: dict = {}
            labels = list(d.labels)
            if d.path is None and d.pos is not None and self.doc is not None:
                path = self.doc.path_at(d.pos)
                if path is not None:
                    changes["path"] = path
            path = changes.get("path", d.path)
            if d.pos is not None and d.pos.file != str(self.path) and not is_override(d.pos.file):
                if d.spec is None:
                    changes["spec"] = str(self.path)
                ext = self._extends_pos()
                if ext is not None:
                    labels.append(Label(ext, "the base spec is extended here"))
            if self.doc is not None and path is not None and d.pos is not None:
                base = self.doc.overridden.get(path)
                if base is not None and base != d.pos:
                    what = "the spec's value it replaces" if is_override(d.pos.file) else "the value it replaces in the base spec"
                    labels.append(Label(base, what))
                gone = self.doc.removed.get(path)  # a missing key that a `--set KEY=null` removed
                if gone is not None:
                    labels.append(Label(gone, "removed by this --set"))
            if len(labels) != len(d.labels):
                changes["labels"] = tuple(labels)
            out.append(dataclasses.replace(d, **changes) if changes else d)
        return out

    def _extends_pos(self):
        """Where this spec's own `extends:` value stands, if it has one."""
        if self.doc is not None:
            pos = self.doc.values.get(("extends",))
            return pos if pos is not None and pos.file == str(self.path) else None

        try:
            doc = load_file(self.path)
        except (DiagnosticError, OSError, ValueError):
            return None
        if isinstance(doc.data, dict) and "extends" in doc.data:
            return doc.pos(("extends",))
        return None
