"""Test-session setup: the suite builds programs from several threads while other tests (and coverage's
analysis of the generated programs) parse Python too; CPython 3.11's ast.parse is not thread-safe, so
every parse in the test process takes one lock (mithril_spec/pyast.py)."""

import os

import pytest

from mithril_spec import pyast

pyast.install()


# ------------------------------------------------------------------- pytest-xdist (scripts/test.sh runs -n 2)
# Builds and runs are memoised per process (tests/torch_runs.py, jax_runs.py, program_coverage.py) and a file's
# module fixture runs all of its cases at once, so the workers take whole files, and files that read the same
# runs go to the same worker as one unit (SHARED: file -> the unit it joins). Units start longest first (the
# order of LONGEST, seconds on 2 cores; then the rest in file order) so that the last to start is a short one.
# (A scheduler of our own: xdist's `--dist loadgroup` does not group under pytest 9.)
SHARED = {"test_cross_target": "test_mlx", "test_torch_equivalence": "test_torch_program",
          "test_jax_equivalence": "test_jax_program"}
LONGEST = ["test_program_coverage_torch", "test_torch_program", "test_capability_matrix", "test_mlx",
           "test_jax_program", "test_jax_pipeline", "test_program_coverage", "test_hf_weights", "test_generate",
           "test_tp_collectives", "test_names", "test_loss_scaling", "test_fuzz"]


def _unit(nodeid: str) -> str:
    stem = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return SHARED.get(stem, stem)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # (the collection's order: see pytest_collection_modifyitems)
    return Units(config, log)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # (each worker sorts the same collection the same way)
        rank = {name: i for i, name in enumerate(LONGEST)}
        items.sort(key=lambda item: rank.get(_unit(item.nodeid), len(rank)))
