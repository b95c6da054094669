"""The generated JAX program compiles its train step once per run (docs/program.md "Speed (JAX)"): every
call gets the same shapes, dtypes (no weak types) and layouts, whether the state comes from the
initialisation, from the previous step or from a checkpoint. Counted from jax's own log
(JAX_LOG_COMPILES=1 logs each lowering, also when the persistent cache then skips XLA's compilation)."""

from __future__ import annotations

import pytest
from jax_runs import SPECS, WORK, build, run

LOG = {"JAX_LOG_COMPILES": "1"}
CKPT = WORK / "ckpt-compiles-once"


def compilations(output: str, name: str = "train_step") -> int:
    """The lowerings of jit(`name`) that the log of a run counts (its lines may carry a logger prefix)."""
    return sum(f"Compiling jit({name}) " in line for line in output.splitlines())


@pytest.mark.runs
def test_train_step_compiles_once_fresh_and_resumed():
    program = build(SPECS / "gpt-tiny.yaml", "data=1")
    # a checkpoint after step 2: the steps after it start from the state the save read
    fresh = run(program, "--steps", "4", "--checkpoint-dir", str(CKPT), "--checkpoint-every", "2", env=LOG,
                export=False)
    assert [r["step"] for r in fresh.metrics] == [1, 2, 3, 4]
    assert compilations(fresh.output) == 1, fresh.output[-3000:]
    resumed = run(program, "--steps", "6", "--resume", str(CKPT), env=LOG, export=False)
    assert [r["step"] for r in resumed.metrics] == [5, 6]
    assert compilations(resumed.output) == 1, resumed.output[-3000:]
