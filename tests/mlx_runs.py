"""Building and running generated MLX programs for the tests (test_mlx.py).

Builds are memoised for the pytest session like the JAX ones (tests/jax_runs.py), whose `run` also runs
these programs: one process with `python train.py`, several with the program's own launch.sh (mlx.launch,
ring backend, on this machine).
"""

from __future__ import annotations

import threading
from pathlib import Path

import jax_runs as jr

from mithril_spec.frontend import compile_file
from mithril_spec.render import build as render

_builds: dict = {}
_lock = threading.Lock()


def build(spec: Path, mesh: str | None = None, edits: tuple[tuple[str, str], ...] = ()) -> Path:
    """`mithril-spec build SPEC --target mlx [--mesh MESH]` into a fresh directory (memoised)."""
    key = (str(spec), mesh, edits)
    with _lock:
        if key not in _builds:
            path = jr.spec_variant(spec, edits)
            out = jr.WORK / f"mlx{len(_builds)}-{spec.stem}-{(mesh or 'default').replace(',', '_').replace('=', '')}"
            render.build(compile_file(path, mesh), "mlx", out, str(path))
            _builds[key] = out
        return _builds[key]


def run(program: Path, *args: str, processes: int = 1, **kw) -> jr.Run:
    """`train.py ARGS` in one process, or `launch.sh ARGS` (mlx.launch) for several."""
    launcher = None if processes == 1 else ["bash", str(program / "launch.sh")]
    return jr.run(program, *args, launcher=launcher, env={"PYTHON": jr.PY, **kw.pop("env", {})}, **kw)
