"""Mixture-of-experts layers on some pipeline stages only, on none and on all (torch): three explicit stages
on pipe=3, 1F1B over 4 micro-batches, plain SGD. Each equals the one-process build of the same spec (which
runs the pipeline's micro-batches one after the other) at the gradient level (docs/program.md
"Equivalence"): the first step's gradients and the losses. (A stage without moe layers once ended every
rank at step 1: its load-balancing loss was the int 0.)"""

from __future__ import annotations

import numpy as np
import pytest
from gradients import assert_same_gradients
from torch_runs import TESTS, build, report, run, run_many

SPEC = TESTS / "specs" / "moe-stages.yaml"
WHERE = {  # which stages hold moe layers -> edits of the spec's blocks
    "stage 1 only": (),
    "none": (("block: sparse", "block: dense"),),
    "all": (("block: dense", "block: sparse"),),
}
ARGS = ("--steps", "3", "--export-grads", "grads.npz")


def runs(where):
    edits = WHERE[where]
    return build(SPEC, "data=1", edits), build(SPEC, None, edits)


@pytest.fixture(scope="module", autouse=True)
def all_runs():
    run_many([(program, *ARGS) for w in WHERE for program in runs(w)])


@pytest.mark.slow
@pytest.mark.parametrize("where", list(WHERE))
def test_moe_on_some_pipeline_stages_equals_one_process(where):
    one, pipe = (run(program, *ARGS) for program in runs(where))
    grads = [dict(np.load(r.cwd / "grads.npz")) for r in (one, pipe)]
    dg = assert_same_gradients(*grads, 1e-5, f"moe on {where}")
    dl = float(np.abs(pipe.losses - one.losses).max())
    report(f"pipeline moe on {where}", max_rel_dgrad=dg, max_dloss=dl)
    assert dl < 1e-5, (pipe.losses, one.losses)
    assert any(k.startswith("middle.") and ".ffn.experts" in k for k in grads[0]) == (where != "none")
