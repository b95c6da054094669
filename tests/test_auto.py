"""`plan --auto`: the mesh and remat search, checked by the real planner and ranked by predicted step time."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mithril_spec import cli
from mithril_spec.frontend import compile_file
from mithril_spec.planner.auto import SEARCH_AXES, factorizations, search
from mithril_spec.planner.costs import CostOptions, estimate
from mithril_spec.planner.hardware import lookup
from mithril_spec.planner.plan import make_plan

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "specs" / "gpt-tiny.yaml"
FIT = Path(__file__).parent / "broken" / "does_not_fit_memory.yaml"


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err, err
    return rc, out, err


def test_factorizations():
    assert sorted(factorizations(8, 3)) == sorted(
        [(1, 1, 8), (1, 8, 1), (8, 1, 1), (1, 2, 4), (1, 4, 2), (2, 1, 4), (4, 1, 2), (2, 4, 1), (4, 2, 1),
         (2, 2, 2)])
    assert len(factorizations(512, 3)) == 55
    assert all(math.prod(f) == 512 for f in factorizations(512, 3))


def test_search_uses_the_planner_checks_and_ranks_by_step_time():
    c = compile_file(GPT)
    hw = lookup("h100")
    res = search(c.spec, c.doc, c.graph, 8, hw)
    assert res.meshes == 10
    # heads=4 cannot split over tensor=8: the planner's own E042 rejects it
    assert any(r.code == "E042" and "tensor=8" in r.mesh for r in res.rejected)
    assert len(res.candidates) == 3 * (res.meshes - len(res.rejected))
    fitting = res.fitting
    assert fitting and all(x.fits for x in fitting)
    times = [x.step_s for x in fitting]
    assert times == sorted(times, key=lambda t: float(f"{t:.4g}"))
    # every candidate is a ready --mesh argument that plans to the same figures
    best = fitting[0]
    assert best.argument.startswith("--mesh data=") and ",fsdp=" in best.argument and ",tensor=" in best.argument
    plan = make_plan(c.spec, c.doc, c.graph, best.mesh, 8)
    again = estimate(plan, hw, CostOptions(remat=best.remat))
    assert again.peak == best.costs.peak and again.time.step_s == pytest.approx(best.step_s)
    assert set(dict(best.sizes)) == set(SEARCH_AXES)


def test_auto_only_lists_meshes_that_fit():
    c = compile_file(FIT)
    hw = lookup("tpu-v5e")
    res = search(c.spec, c.doc, c.graph, 4, hw)
    assert res.fitting and all(x.costs.peak <= hw.usable_bytes for x in res.fitting)
    assert any(not x.fits for x in res.candidates)  # data=4 alone does not fit
    assert res.fitting[0].sizes != (("data", 4), ("fsdp", 1), ("tensor", 1))


def test_plan_auto_cli(capsys):
    rc, out, err = run(capsys, "plan", GPT, "--auto", "--devices", "8", "--hardware", "h100")
    assert rc == 0
    assert "auto plan for gpt-tiny on 8 x h100-sxm-80gb" in out
    assert "1     --mesh data=" in out and "best: mithril-spec plan" in out
    assert "not searched: pipe" in out and "rejected by the planner" in out
    rc, out, err = run(capsys, "plan", GPT, "--auto", "--devices", "8", "--hardware", "h100", "--format", "json")
    j = json.loads(out)
    assert j["devices"] == 8 and j["candidates"][0]["fits"] and j["candidates"][0]["argument"].startswith("--mesh")
    assert set(j["not_searched"]) == {"pipe", "expert"}


def test_plan_auto_needs_hardware(capsys):
    rc, out, err = run(capsys, "plan", GPT, "--auto", "--devices", "8")
    assert rc == 2 and "--hardware" in err


def test_plan_auto_when_nothing_fits(capsys):
    rc, out, err = run(capsys, "plan", FIT, "--auto", "--devices", "1", "--hardware", "tpu-v5e")
    assert rc == 1 and "nothing fits" in out
