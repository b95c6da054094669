"""`mithril_spec` never imports jax, torch or mlx (or optax): the CLI must answer in a fraction of a second
on a machine without them, and CI must not pay for them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("jax", "jaxlib", "torch", "optax", "orbax", "flax", "numpy", "mlx")

SCRIPT = textwrap.dedent(
    """
    import contextlib, io, sys
    heavy = {heavy!r}

    def loaded():
        return sorted(m for m in sys.modules if m.split(".")[0] in heavy)

    import mithril_spec.cli
    assert not loaded(), ("import", loaded())

    from mithril_spec import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["validate", "specs/"])
        assert rc == 0, err.getvalue()
        for spec in ("specs/gpt-tiny.yaml", "specs/mlp-dp.toml"):
            assert cli.main(["plan", spec]) == 0
            assert cli.main(["plan", spec, "--format", "json"]) == 0
        assert cli.main(["validate", "tests/specs/broken/"]) == 1
        assert cli.main(["explain"]) == 0
        assert cli.main(["schema", "-o", "-"]) == 0
    assert not loaded(), ("commands", loaded())
    print("clean")
    """
)


def test_cli_does_not_import_frameworks():
    script = SCRIPT.format(heavy=HEAVY[:-1])  # numpy: allowed in principle, checked below
    r = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "clean"


def test_cli_does_not_import_numpy_either():
    """Not an invariant of the design, but validating does not need numpy: keep start-up lean."""
    script = SCRIPT.format(heavy=HEAVY)
    r = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_console_script_runs():
    exe = Path(sys.executable).parent / "mithril-spec"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mithril_spec.cli"]
    r = subprocess.run(cmd + ["validate", "specs/"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "spec(s) checked: 0 error(s)" in r.stderr
    r = subprocess.run(
        cmd + ["validate", "tests/specs/broken/unknown_op.yaml"],
        cwd=ROOT,
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "tests/specs/broken/unknown_op.yaml:11:12: error[E024]" in r.stderr
    assert "Traceback" not in r.stderr
