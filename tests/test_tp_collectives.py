"""Megatron's communication for tensor parallelism: per transformer layer without sequence parallelism,
exactly 2 all-reduces over `tensor` in the forward pass and 2 in the backward pass, in the plan, in the
compiled JAX step and in the PyTorch program (counted by CommDebugMode): q, k and v (swiglu's gate and up)
are one matmul, or one DTensor input, so their input gradients are reduced once."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import jax_runs as jr
import pytest
import torch_runs as tr
from program_zygote import zygote

from mithril_spec.frontend import compile_file
from mithril_spec.planner.costs import estimate

GPT = jr.ROOT / "specs" / "gpt-tiny.yaml"
SWIGLU = (("activation: gelu", "activation: swiglu"),)


def planned(spec, mesh: str) -> int:
    """The plan's tensor all-reduces of one micro-batch's forward and backward passes."""
    costs = estimate(compile_file(spec, mesh).plan)
    return sum(c.count for c in costs.collectives
               if c.kind == "all-reduce" and c.axes == ("tensor",) and c.phase in ("forward", "backward"))


@pytest.mark.parametrize("edits", [(), SWIGLU], ids=["gelu", "swiglu"])
def test_plan_counts_four_per_layer(edits):
    assert planned(jr.spec_variant(GPT, edits), "tensor=2") == 4 * 4  # gpt-tiny has 4 layers


def script_output(kind: str, program, code: str) -> str:
    """Runs `code` as a script in `program`'s directory, forked by the session's zygote (the framework
    imported once); its stdout (a failure: its stderr)."""
    runs = jr if kind == "jax" else tr
    script = program / f"count_{kind}.py"
    script.write_text(code)
    out, err = program / f"count_{kind}.out", program / f"count_{kind}.err"
    rc = zygote(kind, runs.env_for()).run(str(script), [], cwd=str(program), env=runs.env_for(), log=str(out),
                                          err=str(err))
    assert rc == 0, err.read_text()[-3000:]
    return out.read_text()


JAX_COUNT = """
import os, re, sys
sys.argv = ["train.py"]
import importlib.util
sys.path.insert(0, @TESTS@)
from program_import import load_program
t = load_program(".")
import jax
args = t.parse_args([])
t.setup_devices(args)
mesh = t.make_mesh()
with jax.set_mesh(mesh):
    opt = t.make_optimizer()
    shardings, batch_shardings, abstract = t.layouts(mesh, opt)
    state = t.init_state(args, opt, shardings, abstract)
    batch = t.global_batch(t.Data(None, seed=1), 0, batch_shardings)
    step = jax.jit(t.make_train_step(opt, 0), in_shardings=(shardings, batch_shardings))
    print(step.lower(state, batch).compile().as_text())
"""
JAX_COUNT = JAX_COUNT.replace("@TESTS@", repr(str(Path(__file__).resolve().parent)))  # tests/program_import.py


@pytest.mark.slow
@pytest.mark.parametrize("edits", [(), SWIGLU], ids=["gelu", "swiglu"])
def test_compiled_jax_step_all_reduces_as_planned(edits):
    """One layer (no scan loop to unroll when counting): the activation all-reduces of the compiled step."""
    one = edits + (("layers: 4}", "layers: 1}"),)
    program = jr.build(GPT, "tensor=2", one)
    text = script_output("jax", program, JAX_COUNT)  # (the device count: the program's setup_devices, from its mesh)
    # activations [B, T, d] (micro-batch 16, seq 64, d 128): each all-reduce operand of that shape counts once
    operands = re.findall(r"f32\[16,64,128\][^ ,)]*[ ,)]", "\n".join(
        line.split(" all-reduce(")[0] for line in text.splitlines() if re.search(r" all-reduce(-start)?\(", line)))
    assert len(operands) == planned(jr.spec_variant(GPT, one), "tensor=2") == 4


TORCH_COUNT = textwrap.dedent("""
    import importlib.util, json, os, sys
    os.environ.pop("WORLD_SIZE", None)
    sys.path.insert(0, @TESTS@)
    from program_import import load_program
    sys.argv = ["train.py"]
    t = load_program(".")
    import torch
    from torch.distributed.tensor.debug import CommDebugMode
    device, mesh, _ = t.setup(True)  # a fake process group: collectives are counted, not run
    with torch.device("meta"):
        model = t.Model()
    t.parallelize(model, mesh)
    model.to_empty(device=device)
    t.fill_model(model, t.initial_params(t.PARAMS, 0), 0)
    batch = t.to_tensors(t.Data(None, seed=1).batch(0, t.MICRO_BATCH), device)
    with CommDebugMode() as comm:
        model(*batch).backward()
    print(json.dumps({str(k): v for k, v in comm.get_comm_counts().items()}))
""")
TORCH_COUNT = TORCH_COUNT.replace("@TESTS@", repr(str(Path(__file__).resolve().parent)))  # tests/program_import.py


@pytest.mark.slow
@pytest.mark.parametrize("mesh, edits", [("tensor=2", ()), ("fsdp=2,tensor=2", SWIGLU)], ids=["gelu", "swiglu"])
def test_torch_all_reduces_as_planned(mesh, edits):
    program = tr.build(GPT, mesh, edits)
    counts = json.loads(script_output("torch", program, TORCH_COUNT).strip().splitlines()[-1])
    assert counts.get("c10d_functional.all_reduce", 0) == planned(jr.spec_variant(GPT, edits), mesh) == 16
