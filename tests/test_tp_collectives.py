"""Megatron's communication for tensor parallelism: per transformer layer without sequence parallelism,
exactly 2 all-reduces over `tensor` in the forward pass and 2 in the backward pass, in the plan, in the
compiled JAX step and in the PyTorch program (counted by CommDebugMode): q, k and v (swiglu's gate and up)
are one matmul, or one DTensor input, so their input gradients are reduced once."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap

import jax_runs as jr
import pytest
import torch_runs as tr

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


JAX_COUNT = """
import os, re, sys
os.environ["JAX_NUM_CPU_DEVICES"] = "2"
sys.argv = ["train.py"]
import importlib.util
spec = importlib.util.spec_from_file_location("train", "train.py")
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
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


@pytest.mark.slow
@pytest.mark.parametrize("edits", [(), SWIGLU], ids=["gelu", "swiglu"])
def test_compiled_jax_step_all_reduces_as_planned(edits):
    """One layer (no scan loop to unroll when counting): the activation all-reduces of the compiled step."""
    one = edits + (("layers: 4}", "layers: 1}"),)
    program = jr.build(GPT, "tensor=2", one)
    p = subprocess.run([jr.PY, "-c", JAX_COUNT], cwd=program, capture_output=True, text=True, timeout=600,
                       env=jr.env_for())
    assert p.returncode == 0, p.stderr[-3000:]
    # activations [B, T, d] (micro-batch 16, seq 64, d 128): each all-reduce operand of that shape counts once
    operands = re.findall(r"f32\[16,64,128\][^ ,)]*[ ,)]", "\n".join(
        line.split(" all-reduce(")[0] for line in p.stdout.splitlines() if re.search(r" all-reduce(-start)?\(", line)))
    assert len(operands) == planned(jr.spec_variant(GPT, one), "tensor=2") == 4


TORCH_COUNT = textwrap.dedent("""
    import importlib.util, json, os, sys
    os.environ.pop("WORLD_SIZE", None)
    spec = importlib.util.spec_from_file_location("train", "train.py")
    t = importlib.util.module_from_spec(spec)
    sys.argv = ["train.py"]
    spec.loader.exec_module(t)
    import torch
    from torch.distributed.tensor.debug import CommDebugMode
    device, mesh, _ = t.setup(True)  # a fake process group: collectives are counted, not run
    with torch.device("meta"):
        model = t.Model()
    t.parallelize(model, mesh)
    model.to_empty(device=device)
    t.fill_model(model, t.initial_params(0), 0)
    batch = t.to_tensors(t.Data(None, seed=1).batch(0, t.MICRO_BATCH), device)
    with CommDebugMode() as comm:
        model(*batch).backward()
    print(json.dumps({str(k): v for k, v in comm.get_comm_counts().items()}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("mesh, edits", [("tensor=2", ()), ("fsdp=2,tensor=2", SWIGLU)], ids=["gelu", "swiglu"])
def test_torch_all_reduces_as_planned(mesh, edits):
    program = tr.build(GPT, mesh, edits)
    p = subprocess.run([tr.PY, "-c", TORCH_COUNT], cwd=program, capture_output=True, text=True, timeout=600,
                       env=tr.env_for())
    assert p.returncode == 0, p.stderr[-3000:]
    counts = json.loads(p.stdout.strip().splitlines()[-1])
    assert counts.get("c10d_functional.all_reduce", 0) == planned(jr.spec_variant(GPT, edits), mesh) == 16
