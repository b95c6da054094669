"""The cost model against what XLA compiles: a jax.jit train step built from the plan (tests/jax_truth_step.py)
on 8 simulated CPU devices, for data, fully sharded data and tensor parallelism.

Compared per (collective class, mesh axes): the predicted and compiled kinds and total bytes per device per
step (within 25%), and the predicted parameter and optimizer-state bytes per device against the addressable
shards of the arrays the compiled step takes.

Two notes on reading XLA:CPU's HLO. It lowers a reduce-scatter as an all-reduce followed by a slice, so
reductions are compared as one class ("reduce": all-reduce and reduce-scatter, by the full buffer reduced).
And without remat XLA keeps the parameters it gathered for the forward pass until the backward pass, so the
step is costed with `CostOptions(regather=False)` (PyTorch FSDP2 and the ZeRO-3 paper gather again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from jax_runs import FAST_COMPILE

pytest.importorskip("jax")
pytest.importorskip("optax")

from mithril_spec.frontend import compile_file  # noqa: E402
from mithril_spec.planner.costs import CostOptions, estimate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CASES = [  # (name, spec, mesh)
    ("dp", "specs/mlp-dp.yaml", "data=8"),
    ("tp-mlp", "specs/mlp-tp.yaml", "data=2,tensor=4"),
    ("fsdp", "specs/gpt-tiny.yaml", "fsdp=8"),
    ("tp-gpt", "specs/gpt-tiny.yaml", "data=2,tensor=4"),
]
CLASS = {"all-reduce": "reduce", "reduce-scatter": "reduce", "all-gather": "gather", "all-to-all": "all-to-all",
         "collective-permute": "permute", "send/recv": "permute"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("truth") / "truth.json"
    # (XLA's cheapest compilation, as every jax test run: tests/jax_runs.py; the HLO, its collectives and its
    # buffers are those of the default, only the code generation is cheaper)
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}", JAX_PLATFORMS="cpu")
    args = [a for _, spec, mesh in CASES for a in (spec, mesh)]
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "jax_truth_step.py"), str(out), *args], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(out.read_text())
    return {name: res for (name, _, _), res in zip(CASES, results)}


def predicted(spec: str, mesh: str):
    return estimate(compile_file(ROOT / spec, mesh).plan, options=CostOptions(regather=False))


def by_class(items) -> Counter:
    c: Counter = Counter()
    for kind, axes, nbytes in items:
        c[(CLASS[kind], tuple(axes))] += nbytes
    return c


@pytest.mark.parametrize("name,spec,mesh", CASES, ids=[c[0] for c in CASES])
def test_collectives_match_the_compiled_step(compiled, name, spec, mesh):
    costs = predicted(spec, mesh)
    pred = by_class((c.kind, c.axes, c.total_bytes) for c in costs.collectives)
    got = by_class((c["kind"], c["axes"], c["bytes"]) for c in compiled[name]["collectives"])
    total = sum(got.values())
    report = f"{name}: predicted {dict(pred)}, compiled {dict(got)}"
    # every predicted collective is there, on the same mesh axes, with the same bytes (within 25%)
    for key, nbytes in pred.items():
        if nbytes < 0.01 * total:
            continue  # scalars (the loss, the gradient norm) may be fused into other collectives
        assert key in got, report
        assert got[key] == pytest.approx(nbytes, rel=0.25), report
    # and nothing sizeable that the model does not predict
    for key, nbytes in got.items():
        assert key in pred or nbytes < 0.05 * total, report
    print(report)


@pytest.mark.parametrize("name,spec,mesh", CASES, ids=[c[0] for c in CASES])
def test_state_bytes_match_the_addressable_shards(compiled, name, spec, mesh):
    st = predicted(spec, mesh).worst.states
    assert st.params == compiled[name]["param_shard_bytes"]
    assert st.optimizer == compiled[name]["optimizer_shard_bytes"]


@pytest.mark.parametrize("name,spec,mesh", CASES, ids=[c[0] for c in CASES])
def test_peak_is_in_the_range_of_xla_memory_analysis(compiled, name, spec, mesh):
    """Informational bound: XLA's autodiff keeps other residuals than the paper's count (docs/cost-model.md)."""
    m = compiled[name]["memory"]
    xla = m["argument_size_in_bytes"] + m["temp_size_in_bytes"] + m["output_size_in_bytes"] - m["alias_size_in_bytes"]
    peak = predicted(spec, mesh).peak
    print(f"{name}: predicted peak {peak}, XLA arguments + temporaries + outputs {xla} ({peak / xla:.2f}x)")
    assert 0.5 < peak / xla < 2
