"""One costing per build (mithril_spec/lowering/costing.py): for every example spec, each of its meshes, and
every target that builds it, the figures of the build's plan.json (its `costs`, and the `predicted` the
program's --profile reads), those embedded in its program (`PLANNED_BYTES`, `PREDICTED_DIGEST`), and what
`plan --target T --format json` prints (with its `--report`, and with `--hardware NAME` its step time) come
from one computation. Builds only: no program runs."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from mithril_spec import cli
from mithril_spec.frontend import compile_file
from mithril_spec.planner.table import human_bytes
from mithril_spec.lowering.predicted import digest
from mithril_spec.lowering.program import Program, lower
from mithril_spec.render.build import render_files, render_program
from mithril_spec.lowering import LOWERINGS
from mithril_spec.targets import TARGETS

ROOT = Path(__file__).resolve().parent.parent
# every example: specs/ (the TOML twins too) and the example projects, which build without their data
SPECS = sorted(p for p in (ROOT / "specs").iterdir() if p.suffix in (".yaml", ".toml") and not p.name.startswith("_")
               ) + sorted((ROOT / "examples").glob("*/*.yaml"))
STATES = ("params", "grads", "optimizer", "buffers")


def _cases() -> list[tuple[Path, str | None, str]]:
    """(spec, mesh, target) for each mesh of the spec (None: its default) and each target that builds the spec
    on it: those it names, and any other the build accepts."""
    out = []
    for spec in SPECS:
        for mesh in [None, *[m for m in (compile_file(spec).spec.meshes or {}) if m != "default"]]:
            c = compile_file(spec, mesh)
            assert c.plan is not None, (spec, mesh)
            for target in TARGETS:
                refused = LOWERINGS[target].check(c.plan, c.doc)
                assert not (refused and target in c.spec.targets), (spec.name, mesh, target, refused)
                if not refused:
                    out.append((spec, mesh, target))
    return out


CASES = _cases()


def _embedded(files: dict[str, str]) -> dict[str, object]:
    """The module-level literals PREDICTED, PREDICTED_DIGEST and PLANNED_BYTES of the generated Python files,
    by name."""
    found: dict[str, object] = {}
    for name, text in files.items():
        if not name.endswith(".py"):
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                var = node.targets[0].id
                if var in ("PREDICTED", "PREDICTED_DIGEST", "PLANNED_BYTES"):
                    assert var not in found, f"{var} assigned twice"
                    found[var] = ast.literal_eval(node.value)
    return found


def _plan(capsys, spec: Path, *extra: str) -> dict:
    rc = cli.main(["plan", str(spec), "--format", "json", *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def _seconds(x: float) -> float:
    return float(f"{x:.4g}")  # as the program's config rounds them (lowering/predicted.py)


def test_the_cases_cover_every_example_and_target():
    assert {s for s, _, _ in CASES} == set(SPECS)
    assert {t for _, _, t in CASES} == set(TARGETS)
    assert any(s.parent.parent.name == "examples" for s, _, _ in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{c[1] or 'default'}-{c[2]}")
def test_build_program_and_plan_share_one_costing(case, capsys, tmp_path):
    spec, mesh, target = case
    compiled = compile_file(spec, mesh)
    files = render_files(compiled, target, spec.name)
    built = json.loads(files["plan.json"])
    on_mesh = ("--mesh", mesh) if mesh else ()
    costs = built["costs"]

    # the program's planned bytes: the training state of the fullest pipe rank, as plan.json costs it
    embedded = _embedded(files)
    planned = embedded["PLANNED_BYTES"]
    assert isinstance(planned, dict) and planned and set(planned) <= set(STATES), planned
    fullest = max((s["states"] for s in costs["stages"]), key=lambda st: st["total"])
    assert planned == {k: fullest[k] for k in planned}
    held = compiled.plan.memory_for(target)  # what the running programs' tests hold them to
    assert planned == {k: getattr(held, k) for k in planned}

    # the predictions --profile prints are plan.json's; the program knows its own plan.json by their digest
    assert "PREDICTED" not in embedded, "the program embeds no prediction but the planned bytes"
    predicted = built["predicted"]
    assert (predicted is None) == (target == "mlx"), "the mlx program does not profile"
    assert embedded.get("PREDICTED_DIGEST") == digest(predicted)
    if predicted is not None:
        _check_predicted(predicted, costs, spec, on_mesh, target, capsys)

    # `plan --target T --format json` prints the build's plan.json; its --report shows the same peak
    report = tmp_path / "report.html"
    assert _plan(capsys, spec, *on_mesh, "--target", target, "--report", str(report)) == built

    # the build is a rendering of the target's Program (lowering/program.py): plan.json and its predictions
    # are views of its one costing
    program = lower(compiled.plan, compiled.doc, target, spec.name)
    assert isinstance(program, Program) and program.target == target == program.costing.target
    assert program.plan_json == built
    assert program.predicted == (predicted if predicted is not None else program.predicted)
    assert program.predicted_digest == embedded.get("PREDICTED_DIGEST")
    assert render_program(program) == files
    assert costs["target"] == target, "a build costs the plan as its target's program runs it"
    peak = f'<div class="k">peak memory / device</div><div class="v">{human_bytes(costs["peak_bytes"])}</div>'
    assert peak in report.read_text(encoding="utf-8")


def _check_predicted(predicted, costs: dict, spec: Path, on_mesh: tuple[str, ...], target: str, capsys) -> None:
    """plan.json's `predicted` against its `costs`, and its step times against `plan --target T --hardware
    NAME`."""
    assert isinstance(predicted, dict)
    assert predicted["peak_bytes"] == costs["peak_bytes"]
    comm_bytes: dict[str, int] = {}
    comm_calls: dict[str, int] = {}
    for c in costs["collectives"]:
        comm_bytes[c["kind"]] = comm_bytes.get(c["kind"], 0) + c["total_bytes"]
        comm_calls[c["kind"]] = comm_calls.get(c["kind"], 0) + c["count"]
    assert predicted["comm_bytes"] == {k: v for k, v in comm_bytes.items() if v}
    assert predicted["comm_calls"] == {k: n for k, n in comm_calls.items() if comm_bytes[k]}
    worst = max(costs["stages"], key=lambda s: s["peak"])
    assert predicted["offload"] == (None if costs["offload_threshold"] is None else {
        "threshold": costs["offload_threshold"], "per_step": worst["activations"]["offload_per_step"],
        "host_bytes": worst["activations"]["offloaded"]})

    # the step time on each profile a device's name selects: `plan --target T --hardware NAME`'s
    assert set(predicted["profiles"]) == {name for _, name in predicted["device_profiles"]}
    for name, want in predicted["profiles"].items():
        on = _plan(capsys, spec, *on_mesh, "--target", target, "--hardware", name)["costs"]
        assert {k: v for k, v in on.items() if k not in ("hardware", "fits", "capacity_bytes", "time")} == {
            k: v for k, v in costs.items() if k not in ("hardware", "fits", "capacity_bytes", "time")}
        t = on["time"]
        comm_s: dict[str, float] = {}
        for c, s in zip(on["collectives"], t["collective_s"]):
            comm_s[c["kind"]] = comm_s.get(c["kind"], 0.0) + s
        assert want == {"step_s": _seconds(t["step_s"]), "compute_s": _seconds(t["compute_s"]),
                        "offload_s": _seconds(t["offload_s"]),
                        "comm_s": {k: _seconds(v) for k, v in comm_s.items() if comm_bytes[k]}}, name
