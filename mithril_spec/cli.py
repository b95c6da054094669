"""The `mithril-spec` command line: validate, plan, build, schema, explain, import, data, calibrate.

Exit codes: 0 success, 1 invalid spec (or warnings under --strict), 2 usage error, 3 internal error; 141 when
the reader of the output goes away (`| head`), quietly, like a Unix tool ended by SIGPIPE.

Each spec file is loaded, validated and resolved once per call, and planned once per mesh (`frontend.SpecFile`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import codes
from .codes import Example
from .diagnostics import (
    Diagnostic,
    DiagnosticError,
    escape,
    render_github,
    render_json,
    render_text,
    sort_key,
)
from .frontend import SPEC_SUFFIXES, Compiled, SpecFile
from .planner.hardware import BUILTIN
from .planner.mesh import UsageError
from .targets import TARGET_NAMES

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_PIPE = 128 + 13  # as a process ended by SIGPIPE


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 2 without a traceback (argparse's default too)
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {escape(message)}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mithril-spec", description="Validate, plan and build parallel training programs from specs.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp, fmt=("text", "json", "github")):
        sp.add_argument("--format", choices=fmt, default="text", help="diagnostics/output format")
        sp.add_argument("--strict", action="store_true", help="treat warnings as errors")
        sp.add_argument("--mesh", help="a mesh name from the spec, or AXIS=SIZE,... (e.g. data=4,tensor=2)")
        sp.add_argument("--devices", type=int, help="check that the mesh uses exactly this many devices")
        sp.add_argument("--color", choices=("auto", "always", "never"), default="auto")
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="override a value of the spec after `extends` (repeatable): a dotted path the spec has and "
                        "a YAML value, e.g. --set training.optimizer.lr=3e-4 --set dims.layers=8; +KEY=VALUE adds a "
                        "key the spec lacks, ++KEY=VALUE sets KEY either way")

    def hardware(sp):
        sp.add_argument("--hardware", metavar="NAME",
                        help=f"a device profile (built in: {', '.join(BUILTIN)}; or "
                        "one from the spec's `hardware` section; or a profile file FILE.yaml, as `calibrate` writes): "
                        "predict step time and check that every device's peak memory fits (E050)")

    v = sub.add_parser("validate", help="check spec files or directories (for CI)")
    v.add_argument("paths", nargs="+", metavar="PATH")
    common(v)
    hardware(v)

    pl = sub.add_parser("plan", help="show every parameter's layout, per-device memory, communication and FLOPs")
    pl.add_argument("spec", metavar="SPEC")
    common(pl, ("text", "json"))
    hardware(pl)
    pl.add_argument("--auto", action="store_true",
                    help="search meshes (every axis the spec's targets run) and settings (pipeline, gradient "
                    "accumulation, ZeRO, sequence parallelism, remat) for --devices N on --hardware NAME and list "
                    "the best that fit, ranked by predicted step time, then memory, then communication")
    pl.add_argument("--top", type=int, metavar="K", help="with --auto: how many candidates to list (default: 5)")
    pl.add_argument("--write", metavar="NEW.yaml",
                    help="with --auto: write the best candidate as a spec that `extends` SPEC (in SPEC's directory "
                    "or one above it)")
    pl.add_argument("--report", metavar="FILE.html",
                    help="also write a self-contained HTML report (partition map, memory, communication)")
    pl.add_argument("--target", choices=TARGET_NAMES,
                    help="cost the plan as this target's program runs it, as `build --target` does for its "
                    "plan.json and program (default: target-neutral, the largest over the spec's targets)")

    b = sub.add_parser("build", help="render the training program for a target")
    b.add_argument("spec", metavar="SPEC")
    b.add_argument("--target", choices=TARGET_NAMES, required=True)
    b.add_argument("-o", "--output", required=True, metavar="DIR")
    b.add_argument("--force", action="store_true",
                   help="replace files of the previous build in DIR even where they were edited since")
    common(b, ("text", "json", "github"))

    s = sub.add_parser("schema", help="write the JSON Schema of the spec language (or, with --plan, of "
                       "`plan --format json`)")
    s.add_argument("--plan", action="store_true",
                   help="the schema of `plan --format json` (default output schemas/plan.schema.json)")
    s.add_argument("-o", "--output", default=None,
                   help="path, or - for stdout (default schemas/mithril-spec.schema.json)")
    s.add_argument("--check", action="store_true", help="exit 1 if the file differs from the current schema")

    e = sub.add_parser("explain", help="explain a diagnostic code")
    e.add_argument("code", nargs="?", help="e.g. E042; omit to list every code")

    d = sub.add_parser("data", help="prepare training data")
    dsub = d.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    dp = dsub.add_parser("prepare", help="encode text files (with a byte-level BPE tokenizer trained on them, or "
                         "a model's own tokenizer) and write token files for `data: {kind: tokens}` (train.bin, "
                         "val.bin, tokenizer.json, data.json)")
    dp.add_argument("inputs", nargs="+", metavar="INPUT", help="text files, or directories (their text files)")
    dp.add_argument("--vocab", type=int, default=None, help="train a tokenizer of this vocabulary size (257 or more)")
    dp.add_argument("--tokenizer", default=None, metavar="MODEL_DIR",
                    help="encode with this model's tokenizer.json instead (a model directory or the file): no training")
    dp.add_argument("--format", choices=("text", "chat", "prompt-response"), default="text",
                    help="text: documents; chat / prompt-response: one JSONL file of examples (needs --tokenizer), "
                    "with a loss mask (train.mask, val.mask) counting only the responses (default: %(default)s)")
    dp.add_argument("-o", "--output", required=True, metavar="DIR")
    dp.add_argument("--val-fraction", type=float, default=0.1,
                    help="the last fraction of the token stream held out as val.bin (default: %(default)s)")

    im = sub.add_parser("import", help="write a spec for an existing model (hf: a Hugging Face transformers "
                        "config.json or model directory)")
    im.add_argument("source", choices=("hf",), help="what PATH is: hf = a transformers model directory or config.json")
    im.add_argument("path", metavar="PATH")
    im.add_argument("-o", "--output", required=True, metavar="SPEC.yaml", help="the spec to write, or - for stdout")
    im.add_argument("--mesh", help="the spec's mesh, AXIS=SIZE,... (default: one device)")
    im.add_argument("--seq", type=int, help="training sequence length (default: max_position_embeddings, at most 2048)")
    im.add_argument("--name", help="the spec's name (default: the model directory's name)")
    im.add_argument("--format", choices=("text", "json", "github"), default="text", help="diagnostics format")
    im.add_argument("--color", choices=("auto", "always", "never"), default="auto")

    ca = sub.add_parser("calibrate", help="measure this machine (matmul FLOP/s per dtype, memory bandwidth, "
                        "all-reduce bandwidth and latency, kernel overhead) and write a hardware profile for "
                        "`plan --hardware FILE.yaml`")
    ca.add_argument("--target", required=True, metavar="{torch,jax}",
                    help="measure the devices as this target's programs start them")
    ca.add_argument("-o", "--output", required=True, metavar="FILE.yaml", help="the profile to write")
    ca.add_argument("--name", help="the profile's name (default: TARGET-PLATFORM-xN)")
    ca.add_argument("--processes", type=int, default=1, metavar="N",
                    help="devices working at once, as a program on an N-device mesh runs them on this machine "
                    "(default: %(default)s)")
    ca.add_argument("--quick", action="store_true", help="the smallest sizes: a few seconds, rougher figures")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        rc = _main(argv)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return rc
    except BrokenPipeError:
        return _broken_pipe()


def _main(argv: Sequence[str] | None) -> int:
    from .atomic import OutputError

    args = _parser().parse_args(argv)
    try:
        _check_numbers(args)
        return _COMMANDS[args.command](args)
    except (UsageError, OutputError) as e:
        print(f"mithril-spec: error: {escape(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise
    except Exception as e:  # noqa: BLE001 (a bug in mithril-spec, not in the user's spec: say so in one line)
        print(f"mithril-spec: internal error: {type(e).__name__}: {escape(str(e))} (please report this)", file=sys.stderr)
        return EXIT_INTERNAL


def _check_numbers(args) -> None:
    """Numbers on the command line obey the spec's limits (E015): below 2^53, a mesh's product too."""
    from .limits import MAX_INT

    for flag in ("devices", "top", "seq", "processes"):
        n = getattr(args, flag, None)
        if n is not None and abs(n) >= MAX_INT:
            raise UsageError(f"--{flag} {n if n < 10**30 else 'of ' + str(len(str(n))) + ' digits'}: out of range "
                             "(numbers are below 2^53)")
        if n is not None and n < 1:  # a count: 0 or -4 devices, candidates, processes, positions mean nothing
            raise UsageError(f"--{flag} must be at least 1 (got {n})")
    mesh = getattr(args, "mesh", None)
    if mesh:
        product = 1
        for part in mesh.split(","):
            axis, eq, size = part.partition("=")
            size = size.strip()
            if eq and size.isdigit() and size.isascii():
                if len(size) > 16 or int(size) >= MAX_INT:
                    raise UsageError(f"--mesh: size of `{axis.strip()}` is out of range (sizes are below 2^53)")
                product *= int(size)
        if product >= MAX_INT:
            raise UsageError(f"--mesh: {product:,} devices; a mesh has fewer than 2^53")


def _broken_pipe() -> int:
    """The reader of the output went away (`mithril-spec explain | head -2`): stop quietly. Whatever is still
    buffered for stdout goes to /dev/null, so that the interpreter's last flush does not fail either (the
    standard recipe; SIGPIPE itself stays ignored, so that `main` can run inside other programs)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return EXIT_PIPE
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:
        pass
    return EXIT_PIPE


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


def _escape_lines(text: str) -> str:
    """Text for a terminal, each line escaped (`escape`): names and globs from the spec reach the output."""
    return "\n".join(escape(line) for line in text.split("\n"))


def _strict(diags: list[Diagnostic], strict: bool) -> list[Diagnostic]:
    return [d.as_error() for d in diags] if strict else diags


def _compile(path: Path, mesh: str | None, devices: int | None,
             settings: Sequence[str] = ()) -> tuple[Compiled | None, list, dict]:
    """Compiles one spec (with its `--set` overrides) for one mesh; returns (result or None, diagnostics,
    sources)."""
    s = SpecFile(path, devices, settings)
    c, diags = s.compiled(mesh)
    return c, diags, s.sources


def _spec_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            # Files starting with `_` are base specs, checked through the specs that extend them.
            out += sorted(
                f for f in p.rglob("*")
                if f.suffix.lower() in SPEC_SUFFIXES and not f.name.startswith("_") and not f.is_dir()
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
        s = SpecFile(f, args.devices, args.settings)
        sources.update(s.sources)
        diags = list(s.diags) if s.graph is None else _check_meshes(s, args)
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


def _check_meshes(s: SpecFile, args) -> list[Diagnostic]:
    """Plans a resolved spec for `--mesh` or, without it, for every named mesh (not only the default one,
    which may fail on its own): the planner's diagnostics, what the spec's targets refuse (E049) and, with
    `--hardware`, whether each device's memory suffices (E050). On named meshes each diagnostic says which."""
    from .auto import fit_diagnostics
    from .planner.costs import CostOptions, estimate
    from .planner.hardware import float8_diagnostics, lookup
    from .targets import attention_kernels

    spec = s.spec
    names = list(spec.meshes or ())
    every = args.mesh is None and bool(names) and spec.mesh is None
    out: list[Diagnostic] = []
    hw = None
    if args.hardware:
        try:
            hw = lookup(args.hardware, spec, s.doc)  # UsageError, or DiagnosticError for a bad spec profile
        except DiagnosticError as e:
            out += s.finish(e.diagnostics)
        else:
            out += s.finish(float8_diagnostics(spec, s.doc, hw))  # FP8 matmuls on a device without them
    for choice in [None] + names[1:] if every else [args.mesh]:
        c, diags = s.compiled(choice)
        if c is not None:
            diags += s.finish(_target_checks(c))
            if hw is not None:
                options = CostOptions(fused_attention=all(attention_kernels(c.spec.targets).values()))
                diags += s.finish(fit_diagnostics(c.spec, c.doc, c.graph, c.plan, hw, estimate(c.plan, hw, options),
                                                  options))
        mesh = names[0] if every and choice is None else choice if choice in names else None
        out += [dataclasses.replace(d, mesh=mesh) for d in diags] if mesh else diags
    return out


def _target_checks(c: Compiled) -> list[Diagnostic]:
    """What `build` would refuse (E049) for each target the spec names, so that CI catches it too."""
    from .lowering import check_target

    out: list[Diagnostic] = []
    for target in c.spec.targets:
        out += check_target(c.plan, c.doc, target)
    return out


def _dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic per problem: the same code, span and message found on several meshes is kept once
    (the first, on the default mesh)."""
    seen, out = set(), []
    for d in diags:
        key = (d.code, d.pos, d.message)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def _hardware(c: Compiled, name: str):
    from .planner.hardware import lookup

    return lookup(name, c.spec, c.doc)  # UsageError, or DiagnosticError for a bad spec profile


def cmd_plan(args) -> int:
    from .auto import fit_diagnostics
    from .lowering.costing import costing
    from .lowering.predicted import profile_predictions
    from .planner.costs import CostOptions
    from .planner.hardware import float8_diagnostics
    from .planner.plan_json import plan_to_json
    from .planner.table import render_plan

    if args.report:
        _check_report(Path(args.report))  # (a usage error before any work)
    if args.auto:
        return _plan_auto(args)
    if args.write:
        raise UsageError("--write needs --auto (it writes the best candidate the search finds)")
    if args.top is not None:
        raise UsageError("--top needs --auto (it is how many of the search's candidates to list)")
    c, diags, sources = _compile(Path(args.spec), args.mesh, args.devices, args.settings)
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
        f8 = float8_diagnostics(c.spec, c.doc, hw)  # FP8 matmuls on a device without them
        if f8:
            _emit(diags + f8, sources, args)
            return EXIT_INVALID
    # one costing for the text, the JSON and the report: with --target, as that target's program runs the
    # plan (what a build for it embeds); without, target-neutral (the largest over the spec's targets)
    cost = costing(c.plan, args.target)
    costs = cost.costs if hw is None else cost.on(hw)
    if hw is not None:
        diags += fit_diagnostics(c.spec, c.doc, c.graph, c.plan, hw, costs,
                                 CostOptions(fused_attention=cost.options.fused_attention))
    if args.report:
        _write_report(Path(args.report), c, costs)
    if args.format == "json":
        # with --target, what that target's program compares --profile with (a build's plan.json holds it)
        out = plan_to_json(c.plan, costs, profile_predictions(cost) if args.target else None)
        out["diagnostics"] += [d.to_json() for d in diags if d.code == codes.E050]
        sys.stdout.write(json.dumps(out, indent=2, sort_keys=False) + "\n")
    else:
        _emit(diags, sources, args)
        sys.stdout.write(_escape_lines(render_plan(c.plan, costs)))
    return EXIT_INVALID if any(d.severity == "error" for d in diags) else EXIT_OK


def _check_report(path: Path) -> None:
    """`--report FILE`: its directory must exist (it is not created) and FILE must not be a directory."""
    if path.is_dir():
        raise UsageError(f"--report {path}: is a directory")
    parent = path.parent
    if not parent.is_dir():
        what = "not a directory" if parent.exists() else "no such directory"
        raise UsageError(f"--report {path}: {what}: {parent}")


def _write_report(path: Path, c: Compiled, costs) -> None:
    from .atomic import write_atomic
    from .render.report import render_report

    write_atomic(path, render_report(c.plan, costs), create_parents=False)
    print(f"wrote {escape(str(path))}", file=sys.stderr)


def _plan_auto(args) -> int:
    from .auto import search
    from .planner.costs import CostOptions
    from .planner.hardware import float8_diagnostics
    from .planner.table import human_bytes, human_seconds
    from .targets import attention_kernels

    if args.write:
        _check_write(Path(args.write), Path(args.spec), args)
    c, diags, sources = _compile(Path(args.spec), args.mesh, None, args.settings)
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
    f8 = float8_diagnostics(c.spec, c.doc, hw)  # FP8 matmuls on a device without them
    if f8:
        _emit(f8, sources, args)
        return EXIT_INVALID
    devices = args.devices or c.spec.devices or c.plan.mesh.devices
    res = search(c.spec, c.doc, c.graph, devices, hw,
                 options=CostOptions(fused_attention=all(attention_kernels(c.spec.targets).values())))
    top = args.top or 5
    best = res.fitting[:top]
    if args.report and best:
        from .auto import candidate_spec
        from .planner.plan import make_plan

        spec = candidate_spec(c.spec, c.graph, best[0])
        plan = make_plan(spec, c.doc, c.graph, best[0].mesh, devices)
        _write_report(Path(args.report), dataclasses.replace(c, spec=spec, plan=plan), best[0].costs)
    if args.write and best:
        _write_auto(Path(args.write), Path(args.spec), c, best[0], args, devices, args.hardware or hw.name)
    if args.format == "json":
        sys.stdout.write(json.dumps(res.to_json(top), indent=2) + "\n")
        return EXIT_OK if best else EXIT_INVALID
    out = [(f"auto plan for {c.spec.name} on {devices} x {hw.name}: {res.meshes} mesh(es) over "
            f"{', '.join(res.axes)}, {res.evaluations} setting(s) costed; the best {len(res.fitting)} that fit in "
            f"{human_bytes(int(hw.usable_bytes))} usable per device kept")]
    if best:
        rows = [("rank", "mesh", "settings", "peak/device", "step time", "MFU")]
        for i, cand in enumerate(best, 1):
            t = cand.costs.time
            rows.append((str(i), cand.argument, cand.describe(), human_bytes(cand.costs.peak),
                         human_seconds(t.step_s), f"{t.mfu:.1%}"))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        out.append("")
        out += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        out.append("")
        out.append("ranked by predicted step time, then peak memory, then uncompressed before compressed, then bytes "
                   "communicated")
        if args.write:
            out.append(f"best: written to {args.write} (`mithril-spec plan {args.write}` plans it)")
        else:
            out.append(f"best: mithril-spec plan {args.spec} {best[0].argument}   (settings: {best[0].describe()}; "
                       "`--write NEW.yaml` writes them as a spec)")
    else:
        closest = res.candidates[0] if res.candidates else None
        out.append("nothing fits" + (f"; the smallest peak found is {human_bytes(closest.costs.peak)} with "
                                     f"{closest.argument}, {closest.describe()}" if closest else "") +
                   ": use more devices, a larger device, or a smaller micro-batch (training.grad_accum)")
    if res.warning:
        out.append(f"warning: {res.warning}")
    if res.pruned:
        out.append("not costed: " + ", ".join(f"{why}: {n}" for why, n in res.pruned.items()))
    for what, items in (("rejected by the planner", res.rejected), ("refused by a target (E049)", res.refused)):
        if items:
            by_code: dict[str, int] = {}
            for r in items:
                by_code[r.code] = by_code.get(r.code, 0) + 1
            out.append(f"{what}: {len(items)} mesh(es) (" + ", ".join(
                f"{code} {codes.title(code)}: {n}" for code, n in sorted(by_code.items())) + ")")
    sys.stdout.write(_escape_lines("\n".join(out) + "\n"))
    return EXIT_OK if best else EXIT_INVALID


def _check_write(path: Path, spec: Path, args) -> None:
    """`--write NEW.yaml`: refused (a usage error, before the search) where the written spec could not
    `extends` SPEC or would lose something: another directory tree, not YAML, SPEC itself, `--set` values
    (they are not in SPEC), or JSON output (the search's, not the written spec's)."""
    from .extends import relative_base

    if args.format == "json":
        raise UsageError("--write writes a spec; use it without --format json")
    if args.settings:
        raise UsageError("--write extends SPEC as it is on disk: put the --set values into SPEC (or a spec that "
                         "extends it) first")
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise UsageError(f"--write {path}: the written spec is YAML (.yaml or .yml)")
    if path.is_dir():
        raise UsageError(f"--write {path}: is a directory")
    if path.resolve() == spec.resolve():
        raise UsageError(f"--write {path}: would replace SPEC itself; write a new file beside it")
    if not path.parent.is_dir():
        raise UsageError(f"--write {path}: no such directory: {path.parent}")
    if relative_base(path, spec) is None:
        raise UsageError(f"--write {path}: a spec can only extend a spec in its own directory or below it, and "
                         f"{spec} is not; write the new spec in {spec.parent} or a directory above it")


def _write_auto(path: Path, spec_path: Path, c: Compiled, cand, args, devices: int, hw: str) -> None:
    from .atomic import write_atomic
    from .auto import written_spec

    command = f"mithril-spec plan {spec_path} --auto --devices {devices} --hardware {hw}"
    write_atomic(path, written_spec(c.spec, c.graph, cand, path, spec_path, command), create_parents=False)
    print(f"wrote {escape(str(path))}", file=sys.stderr)


def cmd_build(args) -> int:
    from .render import build

    build.check_output(Path(args.output))  # (usage errors before any work)
    if not args.force:
        build.check_unedited(Path(args.output))
    c, diags, sources = _compile(Path(args.spec), args.mesh, args.devices, args.settings)
    diags = _strict(diags, args.strict)
    if c is None or any(d.severity == "error" for d in diags):
        _emit(diags, sources, args)
        return EXIT_INVALID
    try:
        # (the program names where it came from: the spec file and the overrides applied to it)
        written = build.build(c, args.target, Path(args.output), spec_path=args.spec, force=args.force,
                              overrides=args.settings)
    except DiagnosticError as e:
        _emit(e.diagnostics, sources, args)
        return EXIT_INVALID
    _emit(diags, sources, args)
    for f in written:
        print(f"wrote {escape(str(f))}")
    from .lowering import LOWERINGS

    for name, why in LOWERINGS[args.target].left_out(c.plan).items():
        print(f"note: no {name}: {why}", file=sys.stderr)
    return EXIT_OK


def cmd_schema(args) -> int:
    from .atomic import write_atomic
    from .schema import plan_schema_text, schema_text

    text = plan_schema_text() if args.plan else schema_text()
    if args.output == "-":
        sys.stdout.write(text)
        return EXIT_OK
    out = Path(args.output or ("schemas/plan.schema.json" if args.plan else "schemas/mithril-spec.schema.json"))
    if args.check:
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current != text:
            print(f"{out} is stale: run `mithril-spec schema{' --plan' if args.plan else ''}`", file=sys.stderr)
            return EXIT_INVALID
        print(f"{out} is up to date", file=sys.stderr)
        return EXIT_OK
    write_atomic(out, text)
    print(f"wrote {escape(str(out))}")
    return EXIT_OK


def cmd_explain(args) -> int:
    if args.code is None:
        for code, entry in codes.CATALOG.items():
            sys.stdout.write(f"{code}  {entry.title}\n")
        return EXIT_OK
    text = codes.explain(args.code)
    if text is None:
        raise UsageError(f"unknown code {args.code!r}; `mithril-spec explain` lists them")
    sys.stdout.write(text + "\nExample:\n\n" + example_text(args.code.upper()))
    return EXIT_OK


# ---------------------------------------------------------------- examples (explain, docs/diagnostics.md)


def example_command(ex: Example, fmt: str | None = None) -> str:
    return " ".join(["mithril-spec", *ex.command, ex.file, *ex.args, *(["--format", fmt] if fmt else [])])


def run_example(ex: Example, fmt: str = "text") -> tuple[int, str]:
    """Writes the example's files to a temporary directory and validates it there; returns the exit code and
    the output (stderr for text, stdout for json), with file names relative to that directory."""
    with tempfile.TemporaryDirectory(prefix="mithril-example-") as tmp:
        root = Path(tmp)
        for rel, text in ((ex.file, ex.spec), *ex.files):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
        out, err = io.StringIO(), io.StringIO()
        argv = [*ex.command, str(root / ex.file), *[str(root / a) if a.endswith(".yaml") else a for a in ex.args],
                "--format", fmt]
        if fmt == "text":
            argv += ["--color", "never"]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
        text = out.getvalue() if fmt == "json" else err.getvalue()
        for prefix in (str(root) + os.sep, json.dumps(str(root) + os.sep)[1:-1]):
            text = text.replace(prefix, "")
    return rc, text


def example_text(code: str, markdown: bool = False) -> str:
    """The example of a code: its files, the command and what it reports (indented, or fenced markdown)."""
    ex = codes.CATALOG[code].example
    out = []

    def block(text: str, lang: str) -> None:
        lines = text.rstrip("\n").split("\n")
        if markdown:
            out.extend([f"```{lang}", *lines, "```"])
        else:
            out.extend(("    " + ln).rstrip() for ln in lines)

    for rel, text in ((ex.file, ex.spec), *ex.files):
        out += [f"`{rel}`:", ""]
        block(text, "toml" if rel.endswith(".toml") else "json" if rel.endswith(".json") else "yaml")
        out.append("")
    _rc, output = run_example(ex)
    block(f"$ {example_command(ex)}\n{output}", "console")
    return "\n".join(out) + "\n"


def cmd_import(args) -> int:
    """`import hf PATH -o SPEC`: the spec of a transformers model (mithril_spec/hf_import.py), checked like
    `validate` before it is written."""
    from .atomic import write_atomic
    from .frontend import compile_document
    from .hf_import import config_path, import_hf
    from .planner.mesh import parse_override
    from .source import load_text

    path = Path(args.path)
    if path.is_file() and (path.suffix != ".json" or path.name.endswith(".index.json")):
        # a weights file (model.safetensors, pytorch_model.bin, the shards' index): its model directory
        if not (path.parent / "config.json").is_file():
            raise UsageError(f"{args.path}: a weights file without a config.json beside it (give the transformers "
                             "model directory, or its config.json)")
        path = path.parent
    if not config_path(path).is_file():
        raise UsageError(f"{args.path}: no config.json there (give a transformers model directory or its config.json)")
    mesh = parse_override(args.mesh) if args.mesh else None
    cfg = str(config_path(path))
    try:
        config_path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{cfg}: not a config.json (not UTF-8 text); give the transformers model directory, its "
                         "config.json, or a weights file beside it") from None
    try:
        imported = import_hf(path, name=args.name, seq=args.seq, mesh=mesh)
    except DiagnosticError as e:
        _emit(e.diagnostics, {cfg: config_path(path).read_text(encoding="utf-8")}, args)
        return EXIT_INVALID
    out = "<stdout>" if args.output == "-" else args.output
    try:  # what is written must compile: a spec `validate` rejects is an internal error here
        c = compile_document(load_text(imported.spec, out))
    except DiagnosticError as e:
        _emit(e.diagnostics, {out: imported.spec}, args)
        return EXIT_INVALID
    _emit(imported.diagnostics, {cfg: config_path(path).read_text(encoding="utf-8")}, args)
    if args.output == "-":
        sys.stdout.write(imported.spec)
    else:
        write_atomic(Path(args.output), imported.spec)
        print(f"wrote {escape(args.output)} ({imported.family}, {c.plan.param_count:,} parameters)", file=sys.stderr)
    return EXIT_OK


def cmd_data(args) -> int:
    from .data_prepare import prepare

    masked = args.format != "text"
    if masked:
        from .data_prepare import prepare_instructions

        if args.tokenizer is None or args.vocab is not None:
            raise UsageError(f"--format {args.format}: give --tokenizer MODEL_DIR (the model's tokenizer; no --vocab)")
        if len(args.inputs) != 1:
            raise UsageError(f"--format {args.format}: one JSONL file of examples")
        p = prepare_instructions(args.inputs[0], args.format, args.tokenizer, Path(args.output), args.val_fraction)
    else:
        p = prepare(args.inputs, args.vocab, Path(args.output), args.val_fraction, tokenizer=args.tokenizer)
    where = escape(str(p.out.resolve()))
    empty = f" ({p.empty_files} empty input file(s) left out)" if p.empty_files else ""
    print(f"{p.documents} document(s){empty}: {p.train_tokens:,} training and {p.val_tokens:,} held-out tokens, "
          f"vocab {p.vocab:,} ({p.dtype}) in {where}")
    print("in the spec (or paths relative to the spec's directory):")
    mask = f", mask: {where}/train.mask" if masked else ""
    print(f"  data: {{kind: tokens, path: {where}/train.bin, dtype: {p.dtype}, tokenizer: {where}/tokenizer.json{mask}}}")
    if not masked:
        print(f"  eval: {{path: {where}/val.bin, every: 50, batches: 4}}")
    return EXIT_OK


def cmd_calibrate(args) -> int:
    """`calibrate --target T -o FILE`: measure in a subprocess (mithril_spec/calibrate.py), write the profile."""
    from .calibrate import calibrate

    command = " ".join(["mithril-spec calibrate", "--target", args.target, "--processes", str(args.processes),
                        *(["--quick"] if args.quick else [])])
    fields = calibrate(args.target, Path(args.output), args.name, args.processes, args.quick, command)
    flops = ", ".join(f"{k} {v * 1e3:.3g}" for k, v in fields["flops"].items())
    print(f"wrote {escape(args.output)}: profile `{escape(fields['name'])}`: GFLOP/s {flops}, "
          f"efficiency {fields['efficiency']:.3g}; memory "
          f"{fields['hbm_gb_per_s']:.3g} GB/s, element-wise kernels {fields['elementwise_gb_per_s']:.3g} GB/s; "
          f"all-reduce {fields['intra_node_gb_per_s']:.3g} GB/s, "
          f"{fields['intra_node_latency_us']:.3g} us per step; kernel {fields['kernel_overhead_us']:.3g} us"
          + (f", tensor-parallel layer {fields['sharded_layer_overhead_us']:.3g} us"
             if "sharded_layer_overhead_us" in fields else "") + " "
          f"(use: mithril-spec plan SPEC --hardware {escape(args.output)})", file=sys.stderr)
    return EXIT_OK


_COMMANDS = {"validate": cmd_validate, "plan": cmd_plan, "build": cmd_build, "schema": cmd_schema,
             "explain": cmd_explain, "import": cmd_import, "data": cmd_data, "calibrate": cmd_calibrate}

if __name__ == "__main__":
    sys.exit(main())
