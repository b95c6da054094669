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
from .targets import TARGET_NAMES

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

    def hardware(sp):
        sp.add_argument("--hardware", metavar="NAME",
                        help="a device profile (built in: h100-sxm-80gb, h200-141gb, a100-80gb, tpu-v5e, cpu; or "
                        "one from the spec's `hardware` section): predict step time and check that every device's "
                        "peak memory fits (E050)")

    v = sub.add_parser("validate", help="check spec files or directories (for CI)")
    v.add_argument("paths", nargs="+", metavar="PATH")
    common(v)
    hardware(v)

    pl = sub.add_parser("plan", help="show every parameter's layout, per-device memory, communication and FLOPs")
    pl.add_argument("spec", metavar="SPEC")
    common(pl, ("text", "json"))
    hardware(pl)
    pl.add_argument("--auto", action="store_true",
                    help="search meshes (data, fsdp, tensor) and remat settings for --devices N on --hardware NAME "
                    "and list the best that fit, ranked by predicted step time")
    pl.add_argument("--top", type=int, default=5, metavar="K", help="with --auto: how many candidates to list")
    pl.add_argument("--report", metavar="FILE.html",
                    help="also write a self-contained HTML report (partition map, memory, communication)")

    b = sub.add_parser("build", help="render the training program for a target")
    b.add_argument("spec", metavar="SPEC")
    b.add_argument("--target", choices=TARGET_NAMES, required=True)
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
        if c is not None and args.hardware:
            diags += _fit_all(c, args)
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
    from .targets import check_target

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


def _hardware(c: Compiled, name: str):
    from .planner.hardware import lookup

    return lookup(name, c.spec, c.doc)  # UsageError, or DiagnosticError for a bad spec profile


def _fit_all(c: Compiled, args) -> list[Diagnostic]:
    """E050 for the default mesh (or --mesh) and, without --mesh, every other named mesh (for `validate`)."""
    from .planner.auto import fit_diagnostics
    from .planner.costs import estimate

    try:
        hw = _hardware(c, args.hardware)
    except DiagnosticError as e:
        return e.diagnostics
    out = fit_diagnostics(c.spec, c.doc, c.graph, c.plan, hw, estimate(c.plan, hw),
                          mesh_label=f" (mesh `{c.plan.mesh.name}`)" if c.spec.meshes else "")
    if args.mesh is None and c.spec.meshes:
        for name in list(c.spec.meshes)[1:]:
            try:
                extra = compile_document(c.doc, name, args.devices)
            except DiagnosticError:
                continue  # reported by the planner already
            out += fit_diagnostics(c.spec, c.doc, c.graph, extra.plan, hw, estimate(extra.plan, hw),
                                   mesh_label=f" (mesh `{name}`)")
    return out


def cmd_plan(args) -> int:
    from .planner.auto import fit_diagnostics
    from .planner.costs import estimate
    from .planner.plan_json import plan_to_json
    from .planner.table import render_plan

    if args.auto:
        return _plan_auto(args)
    c, diags, sources = _compile(Path(args.spec), args.mesh, args.devices)
    diags = _strict(diags, args.strict)
    if c is None or any(d.severity == "error" for d in diags):
        _emit(diags, sources, args)
        return EXIT_INVALID
    hw = None
    if args.hardware:
        try:
            hw = _hardware(c, args.hardware)
        except DiagnosticError as e:
            _emit(e.diagnostics, sources, args)
            return EXIT_INVALID
    costs = estimate(c.plan, hw)
    if hw is not None:
        diags += fit_diagnostics(c.spec, c.doc, c.graph, c.plan, hw, costs)
    if args.report:
        _write_report(Path(args.report), c, costs)
    if args.format == "json":
        out = plan_to_json(c.plan, costs)
        out["diagnostics"] += [d.to_json() for d in diags if d.code == "E050"]
        sys.stdout.write(json.dumps(out, indent=2, sort_keys=False) + "\n")
    else:
        _emit(diags, sources, args)
        sys.stdout.write(render_plan(c.plan, costs))
    return EXIT_INVALID if any(d.severity == "error" for d in diags) else EXIT_OK


def _write_report(path: Path, c: Compiled, costs) -> None:
    from .atomic import write_atomic
    from .planner.report import render_report

    write_atomic(path, render_report(c.plan, costs))
    print(f"wrote {path}", file=sys.stderr)


def _plan_auto(args) -> int:
    from .planner.auto import search
    from .planner.table import human_bytes, human_seconds

    c, diags, sources = _compile(Path(args.spec), args.mesh, None)
    if c is None:
        _emit(diags, sources, args)
        return EXIT_INVALID
    name = args.hardware
    if name is None:
        own = c.spec.hardware or []
        if len(own) != 1:
            raise UsageError("--auto needs --hardware NAME (the device profile to fit and time)")
        name = own[0].name
    try:
        hw = _hardware(c, name)
    except DiagnosticError as e:
        _emit(e.diagnostics, sources, args)
        return EXIT_INVALID
    devices = args.devices or c.spec.devices or c.plan.mesh.devices
    if devices < 1:
        raise UsageError("--devices must be at least 1")
    res = search(c.spec, c.doc, c.graph, devices, hw)
    best = res.fitting[: max(args.top, 1)]
    if args.report and best:
        from .planner.plan import make_plan

        plan = make_plan(c.spec, c.doc, c.graph, best[0].mesh, devices)
        import dataclasses

        spec = c.spec.model_copy(update={"training": c.spec.training.model_copy(update={"remat": best[0].remat})})
        _write_report(Path(args.report), dataclasses.replace(c, plan=dataclasses.replace(plan, spec=spec)),
                      best[0].costs)
    if args.format == "json":
        sys.stdout.write(json.dumps(res.to_json(max(args.top, 1)), indent=2) + "\n")
        return EXIT_OK if best else EXIT_INVALID
    out = [f"auto plan for {c.spec.name} on {devices} x {hw.name}: {res.meshes} mesh(es) x 3 remat settings; "
           f"{len(res.candidates)} valid, {len(res.fitting)} fit in {human_bytes(int(hw.usable_bytes))} usable "
           f"per device"]
    if best:
        rows = [("rank", "mesh", "remat", "peak/device", "step time", "MFU")]
        for i, cand in enumerate(best, 1):
            t = cand.costs.time
            rows.append((str(i), cand.argument, cand.remat, human_bytes(cand.costs.peak), human_seconds(t.step_s),
                         f"{t.mfu:.1%}"))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        out.append("")
        out += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        out.append("")
        out.append(f"best: mithril-spec plan {args.spec} {best[0].argument}" +
                   (f"   (with `training.remat: {best[0].remat}`)" if best[0].remat != c.spec.training.remat else ""))
    else:
        closest = res.candidates[0] if res.candidates else None
        out.append("nothing fits" + (f"; the smallest peak is {human_bytes(closest.costs.peak)} with "
                                     f"{closest.argument}, remat {closest.remat}" if closest else "") +
                   ": use more devices, a larger device, or a smaller micro-batch (training.grad_accum)")
    from .planner.auto import NOT_SEARCHED

    out.append("not searched: " + "; ".join(f"{a} ({why})" for a, why in NOT_SEARCHED.items()))
    if res.rejected:
        by_code: dict[str, int] = {}
        for r in res.rejected:
            by_code[r.code] = by_code.get(r.code, 0) + 1
        out.append(f"rejected by the planner: {len(res.rejected)} mesh(es) (" + ", ".join(
            f"{code} {codes.title(code)}: {n}" for code, n in sorted(by_code.items())) + ")")
    sys.stdout.write("\n".join(out) + "\n")
    return EXIT_OK if best else EXIT_INVALID


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
