"""The `mithril-spec` command line: validate, plan, build, schema, explain.

Exit codes: 0 success, 1 invalid spec (or warnings under --strict), 2 usage error, 3 internal error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from . import codes
from .diagnostics import Diagnostic, DiagnosticError, render_github, render_json, render_text, sort_key
from .frontend import SPEC_SUFFIXES, Compiled, compile_document
from .planner.mesh import UsageError

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 2 without a traceback (argparse's default too)
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mithril-spec", description="Validate, plan and build parallel training programs from specs.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp, fmt=("text", "json", "github")):
        sp.add_argument("--format", choices=fmt, default="text", help="diagnostics/output format")
        sp.add_argument("--strict", action="store_true", help="treat warnings as errors")
        sp.add_argument("--mesh", help="a mesh name from the spec, or AXIS=SIZE,... (e.g. data=4,tensor=2)")
        sp.add_argument("--devices", type=int, help="check that the mesh uses exactly this many devices")
        sp.add_argument("--color", choices=("auto", "always", "never"), default="auto")

    v = sub.add_parser("validate", help="check spec files or directories (for CI)")
    v.add_argument("paths", nargs="+", metavar="PATH")
    common(v)

    pl = sub.add_parser("plan", help="show every parameter's layout and per-device memory")
    pl.add_argument("spec", metavar="SPEC")
    common(pl, ("text", "json"))

    b = sub.add_parser("build", help="render the training program for a target")
    b.add_argument("spec", metavar="SPEC")
    b.add_argument("--target", choices=("jax", "torch"), required=True)
    b.add_argument("-o", "--output", required=True, metavar="DIR")
    common(b, ("text", "json", "github"))

    s = sub.add_parser("schema", help="write the JSON Schema of the spec language")
    s.add_argument("-o", "--output", default="schemas/mithril-spec.schema.json", help="path, or - for stdout")
    s.add_argument("--check", action="store_true", help="exit 1 if the file differs from the current schema")

    e = sub.add_parser("explain", help="explain a diagnostic code")
    e.add_argument("code", nargs="?", help="e.g. E042; omit to list every code")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except UsageError as e:
        print(f"mithril-spec: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug in mithril-spec, not in the user's spec: say so in one line
        print(f"mithril-spec: internal error: {type(e).__name__}: {e} (please report this)", file=sys.stderr)
        return EXIT_INTERNAL


# ---------------------------------------------------------------- helpers


def _color(args) -> bool:
    if args.color == "always":
        return True
    if args.color == "never" or os.environ.get("NO_COLOR"):
        return False
    return sys.stderr.isatty()


def _emit(diags: list[Diagnostic], sources: dict[str, str], args) -> None:
    if not diags:
        return
    diags = sorted(diags, key=sort_key)
    if args.format == "json":
        sys.stdout.write(render_json(diags))
    elif args.format == "github":
        sys.stdout.write(render_github(diags))
    else:
        sys.stderr.write(render_text(diags, sources, color=_color(args)))


def _strict(diags: list[Diagnostic], strict: bool) -> list[Diagnostic]:
    return [d.as_error() for d in diags] if strict else diags


def _read(path: Path):
    from .extends import load_spec_file

    try:
        return load_spec_file(path)
    except (UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{path}: cannot read as UTF-8 text ({e})")


def _compile(path: Path, mesh: Optional[str], devices: Optional[int]) -> tuple[Optional[Compiled], list, dict]:
    """Compiles one spec; returns (result or None, diagnostics, sources)."""
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    if path.suffix.lower() not in SPEC_SUFFIXES:
        raise UsageError(f"{path}: not a spec file (expected {', '.join(SPEC_SUFFIXES)})")
    try:
        doc = _read(path)
    except DiagnosticError as e:
        sources = {str(path): path.read_text(encoding="utf-8", errors="replace")}
        for d in e.diagnostics:  # an error inside a base spec reached through `extends`
            if d.pos and d.pos.file not in sources and Path(d.pos.file).is_file():
                sources[d.pos.file] = Path(d.pos.file).read_text(encoding="utf-8", errors="replace")
        return None, e.diagnostics, sources
    try:
        c = compile_document(doc, mesh, devices)
    except DiagnosticError as e:
        return None, e.diagnostics, doc.sources
    return c, list(c.plan.warnings), doc.sources


def _spec_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            # Files starting with `_` are base specs, checked through the specs that extend them.
            out += sorted(
                f for f in p.rglob("*") if f.suffix.lower() in SPEC_SUFFIXES and not f.name.startswith("_")
            )
        elif p.exists():
            out.append(p)
        else:
            raise UsageError(f"{raw}: no such file or directory")
    return out


# ---------------------------------------------------------------- commands


def cmd_validate(args) -> int:
    files = _spec_files(args.paths)
    if not files:
        raise UsageError("no spec files found (looked for " + ", ".join(SPEC_SUFFIXES) + ")")
    all_diags: list[Diagnostic] = []
    sources: dict[str, str] = {}
    for f in files:
        c, diags, src = _compile(f, args.mesh, args.devices)
        sources.update(src)
        if c is not None:
            diags += _target_checks(c)
        if args.mesh is None:
            diags += _other_meshes(f, c, args.devices)
        all_diags += _dedupe(_strict(diags, args.strict))
    _emit(all_diags, sources, args)
    if args.format == "json" and not all_diags:
        sys.stdout.write(render_json([]))  # machine readers always get a list
    errors = sum(d.severity == "error" for d in all_diags)
    warnings = len(all_diags) - errors
    if args.format == "text":
        status = "ok" if not errors else "failed"
        print(f"{len(files)} spec(s) checked: {errors} error(s), {warnings} warning(s) - {status}", file=sys.stderr)
    return EXIT_INVALID if errors else EXIT_OK


def _other_meshes(path: Path, c: Optional[Compiled], devices: Optional[int]) -> list[Diagnostic]:
    """Every named mesh must plan, not only the default one (which may have failed on its own)."""
    from .validate import validate

    if c is not None:
        doc, spec = c.doc, c.spec
    else:
        try:
            doc = _read(path)
            spec = validate(doc)
        except (DiagnosticError, UsageError):
            return []  # reported by the default mesh's compile already
    if not spec.meshes or spec.mesh is not None:
        return []
    out: list[Diagnostic] = []
    for name in list(spec.meshes)[1:]:
        try:
            extra = compile_document(doc, name, devices)
            more = list(extra.plan.warnings) + _target_checks(extra)
        except DiagnosticError as e:
            more = e.diagnostics
        out += [Diagnostic(d.code, f"{d.message} (mesh `{name}`)", d.pos, d.help, d.notes, d.severity) for d in more]
    return out


def _target_checks(c: Compiled) -> list[Diagnostic]:
    """What `build` would refuse (E049) for each target the spec names, so that CI catches it too."""
    from .planner.targets import check_target

    out: list[Diagnostic] = []
    for target in c.spec.targets:
        out += check_target(c.plan, c.doc, target)
    return out


def _dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen, out = set(), []
    for d in diags:
        key = (d.code, d.pos, d.message.split(" (mesh `")[0])
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def cmd_plan(args) -> int:
    from .planner.plan import plan_to_json
    from .planner.table import render_plan

    c, diags, sources = _compile(Path(args.spec), args.mesh, args.devices)
    diags = _strict(diags, args.strict)
    if c is None or any(d.severity == "error" for d in diags):
        _emit(diags, sources, args)
        return EXIT_INVALID
    if args.format == "json":
        sys.stdout.write(json.dumps(plan_to_json(c.plan), indent=2, sort_keys=False) + "\n")
    else:
        _emit(diags, sources, args)
        sys.stdout.write(render_plan(c.plan))
    return EXIT_OK


def cmd_build(args) -> int:
    from .render import build

    c, diags, sources = _compile(Path(args.spec), args.mesh, args.devices)
    diags = _strict(diags, args.strict)
    if c is None or any(d.severity == "error" for d in diags):
        _emit(diags, sources, args)
        return EXIT_INVALID
    try:
        written = build.build(c, args.target, Path(args.output), spec_path=args.spec)
    except DiagnosticError as e:
        _emit(e.diagnostics, sources, args)
        return EXIT_INVALID
    _emit(diags, sources, args)
    for f in written:
        print(f"wrote {f}")
    return EXIT_OK


def cmd_schema(args) -> int:
    from .schema import schema_text
    from .atomic import write_atomic

    text = schema_text()
    if args.output == "-":
        sys.stdout.write(text)
        return EXIT_OK
    out = Path(args.output)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current != text:
            print(f"{out} is stale: run `mithril-spec schema`", file=sys.stderr)
            return EXIT_INVALID
        print(f"{out} is up to date", file=sys.stderr)
        return EXIT_OK
    write_atomic(out, text)
    print(f"wrote {out}")
    return EXIT_OK


def cmd_explain(args) -> int:
    if args.code is None:
        for code, (title, _) in codes.CATALOG.items():
            print(f"{code}  {title}")
        return EXIT_OK
    text = codes.explain(args.code)
    if text is None:
        raise UsageError(f"unknown code {args.code!r}; `mithril-spec explain` lists them")
    sys.stdout.write(text)
    return EXIT_OK


_COMMANDS = {"validate": cmd_validate, "plan": cmd_plan, "build": cmd_build, "schema": cmd_schema,
             "explain": cmd_explain}

if __name__ == "__main__":
    sys.exit(main())
