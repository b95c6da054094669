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


# ------------------------------------------------------------------ the fast tier (scripts/test.sh --fast)
# `--fast` runs `-m "not slow and not runs"` with MITHRIL_FAST=1: the compiler's tests only, no generated program
# and no framework. So that the tier stays what it says, a test in it fails if it starts a program
# (train.py, generate.py, a launcher, torchrun, sbatch) or imports a framework (torch, jax, mlx): mark such a
# test `runs` (or `slow`) instead.
FAST = os.environ.get("MITHRIL_FAST") == "1"
PROGRAMS = {"train.py", "generate.py", "launch.sh", "launch.sbatch", "torchrun", "mlx.launch", "sbatch", "srun",
            "torch.distributed.run", "program_zygote.py", "gpu_bench.py"}
FRAMEWORKS = ("torch", "jax", "mlx", "transformers")


LAUNCHERS = {"torchrun", "sbatch", "srun", "mlx.launch"}


def _program_in(args) -> str | None:
    """The generated program (or launcher) that a command starts, if it starts one: a launcher, a program's
    script run by Python or a shell (`python train.py`, `bash launch.sh`, `python -m torch.distributed.run`),
    or a calibration program of templates/. (Other commands that name a program's files, such as `ruff format
    train.py`, start none.)"""
    import shlex

    argv = shlex.split(args) if isinstance(args, str) else [os.fspath(a) for a in args]
    argv = [a.decode() if isinstance(a, bytes) else a for a in argv]
    if not argv:
        return None
    exe = os.path.basename(argv[0])
    if exe in LAUNCHERS or exe in PROGRAMS:
        return exe
    if exe.startswith("python") or exe in ("bash", "sh"):
        rest = argv[1:]
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
            rest = rest[1:]
        if rest[:1] == ["-m"] and len(rest) > 1:
            return rest[1] if rest[1] in PROGRAMS or rest[1] in LAUNCHERS else None
        if rest[:1] == ["-c"] and len(rest) > 1 and exe in ("bash", "sh"):
            return _program_in(rest[1])
        if rest and not rest[0].startswith("-"):
            script = rest[0]
            if os.path.basename(script) in PROGRAMS or ("/templates/" in script and script.endswith(".py")):
                return os.path.basename(script)
    return None


class StartsAProgram(Exception):
    pass


def pytest_configure(config):
    if not FAST:
        return
    import subprocess

    popen_init = subprocess.Popen.__init__

    def guarded(self, args, *a, **kw):  # (module fixtures that start programs too: they run before any test)
        if name := _program_in(args):
            raise StartsAProgram(f"the fast tier starts no program, and this test starts {name}: mark it `runs`")
        popen_init(self, args, *a, **kw)

    subprocess.Popen.__init__ = guarded
    import sys

    sys.meta_path.insert(0, _NoFrameworks)


class _NoFrameworks:
    """A meta-path finder whose frameworks fail to load (the fast tier's rule). `importlib.util.find_spec` still
    finds them (the compiler asks whether one is installed without importing it)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        import importlib.machinery

        if name.split(".")[0] in FRAMEWORKS:
            return importlib.machinery.ModuleSpec(name, _NoFrameworks)
        return None

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        raise ImportError(f"the fast tier imports no framework, and this test imports {module.__name__}: "
                          "mark it `runs`")


def _imports_a_framework(path, seen=None) -> bool:
    """Whether the test module at `path` imports a framework when it is collected: at its top level, or through
    a helper module of tests/ that does."""
    import ast
    from pathlib import Path

    path, seen = Path(path), seen if seen is not None else set()
    if path in seen or not path.exists():
        return False
    seen.add(path)
    roots = set()
    for node in ast.parse(path.read_text()).body:  # (module level only: imports inside tests run as they run)
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Assign | ast.Expr) and isinstance(call := node.value, ast.Call) \
                and isinstance(call.func, ast.Attribute) and call.func.attr == "importorskip" and call.args \
                and isinstance(call.args[0], ast.Constant):  # x = pytest.importorskip("transformers")
            roots.add(str(call.args[0].value).split(".")[0])
    return any(r in FRAMEWORKS or _imports_a_framework(path.parent / f"{r}.py", seen) for r in roots)


def pytest_ignore_collect(collection_path, config):
    """The fast tier leaves out the test modules that import a framework as they load."""
    if FAST and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return True if _imports_a_framework(collection_path) else None
    return None
