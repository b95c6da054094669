"""Scale in the JAX target: a repeated block stays one block, and every device initialises only its shard.

- The rendered program lists each block parameter once (no per-copy row), so its length does not depend on
  the number of copies (train.py and README.md have as many lines at 2 copies as at 8).
- The train step runs the block under one lax.scan over the stacked parameters: its jaxpr holds a scan of
  the block's length and as many matrix products at 8 copies as at 2.
- Dropout inside the scanned block (each copy its own key) and remat inside the scan: the same losses on
  one device as on data=2 x fsdp=2 x tensor=2.
- Initialisation is sharded: two processes of four CPU devices each (gpt-tiny on fsdp=8), where every
  process asks the lazy initial tensors for exactly the slices its own devices hold, each once (never a
  whole parameter that the mesh splits), and --resume restores a checkpoint without asking for any.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
from jax_runs import PY, SPECS, WORK, build, env_for, max_diff, report, run, run_many, spec_variant
from program_files import program_text
from program_import import load_program

from mithril_spec.frontend import compile_file
from mithril_spec.render.build import render_files

GPT = SPECS / "gpt-tiny.yaml"
GPT_PIPE = SPECS / "gpt-pipe.yaml"
ALL_OPS = Path(__file__).resolve().parent / "specs" / "all-ops.yaml"


def depth(spec: Path, n: int) -> Path:
    """`spec` with its repeated block copied n times."""
    if spec == ALL_OPS:
        return spec_variant(spec, (("{repeat: 2, block: mixer", f"{{repeat: {n}, block: mixer"),))
    return spec_variant(spec, (("layers: 4}", f"layers: {n}}}"),))


def rendered(spec: Path, mesh: str | None = None) -> dict[str, str]:
    return render_files(compile_file(spec, mesh), "jax", spec.name)


@pytest.mark.parametrize("spec, mesh", [(GPT, None), (GPT, "data=1"), (GPT_PIPE, None), (ALL_OPS, "two")],
                         ids=["gpt-tiny", "gpt-tiny-1", "gpt-pipe", "all-ops"])
def test_program_length_does_not_grow_with_depth(spec, mesh):
    shallow, deep = rendered(depth(spec, 2), mesh), rendered(depth(spec, 8), mesh)
    for name in ("train.py", "README.md"):
        assert len(shallow[name].splitlines()) == len(deep[name].splitlines()), name
    text = program_text(deep)
    assert "blocks.1." not in text and "blocks.7." not in text  # no per-copy row
    assert "REPEATS = {\"blocks\": 8}" in text
    report(f"program lines at 2 and 8 copies ({spec.name}, {mesh or 'default mesh'})",
           lines=len(text.splitlines()))


def load(program: Path, name: str):
    return load_program(program)


def step_primitives(n: int) -> tuple[dict, list[int]]:
    """The primitives in the jaxpr of gpt-tiny's train step at n copies (one device): name -> count, over
    every nested jaxpr, and the lengths of its scans."""
    import jax

    m = load(build(depth(GPT, n), "data=1"), f"gpt_scale_{n}")
    mesh = m.make_mesh()
    with jax.set_mesh(mesh):
        optimizer = m.make_optimizer()
        _, _, abstract = m.layouts(mesh, optimizer)
        batch = {name: jax.ShapeDtypeStruct((m.GRAD_ACCUM, m.MICRO_BATCH, *shape), dtype)
                 for name, (shape, dtype, _) in m.INPUTS.items()}
        jaxpr = jax.make_jaxpr(m.make_train_step(optimizer, 0))(abstract, batch)
    counts: dict[str, int] = {}
    scans: list[int] = []

    def walk(j):
        for eqn in j.eqns:
            counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
            if eqn.primitive.name == "scan":
                scans.append(eqn.params["length"])
            for v in eqn.params.values():
                for sub in v if isinstance(v, (list, tuple)) else [v]:
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jaxpr.jaxpr)
    return counts, scans


@pytest.mark.runs
def test_the_step_scans_the_blocks():
    (c2, s2), (c8, s8) = step_primitives(2), step_primitives(8)
    report("train step jaxpr at 2 and 8 copies", dot_general_2=c2["dot_general"], dot_general_8=c8["dot_general"],
           scans_2=s2, scans_8=s8)
    assert 2 in s2 and 8 in s8  # the forward scan over the copies (and its transpose)
    assert c2["dot_general"] == c8["dot_general"]
    assert sum(c2.values()) == sum(c8.values())


BLOCK_DROPOUT = (
    ("      - {op: add, name: res2, inputs: [res1, mlp]}",
     "      - {op: dropout, name: drop, rate: 0.2}\n      - {op: add, name: res2, inputs: [res1, drop]}"),
    ("precision: {params: float32, compute: float32}", "precision: {params: float32, compute: float32}\n  remat: full"),
)


@pytest.mark.slow
def test_dropout_and_remat_inside_the_scan_are_mesh_independent():
    one, eight = run_many([(build(GPT, "data=1", BLOCK_DROPOUT), "--steps", "4"),
                           (build(GPT, None, BLOCK_DROPOUT), "--steps", "4")])
    plain = run(build(GPT, "data=1"), "--steps", "4")
    dl = max_diff(one.losses, eight.losses)
    report("dropout 0.2 in the scanned block + remat full: 1 device == data=2,fsdp=2,tensor=2", max_dloss=dl)
    assert dl < 1e-5
    assert max_diff(one.losses, plain.losses) > 1e-3  # dropout did drop


PROBE = r'''
"""Runs the init of a generated program in one process of several, recording every slice that the lazy
initial tensors are asked for, then saves a checkpoint and resumes from it."""
import importlib.util
import json
import os
import sys

import jax
import numpy as np

program, out, ckpt = sys.argv[1:4]
sys.path.insert(0, @TESTS@)
from program_import import load_program
m = load_program(program)
args = m.parse_args(["--checkpoint-dir", ckpt])
m.setup_devices(args)
asked = []
get = m.InitTensor.__getitem__


def record(self, index):
    asked.append((self.name, [list(s.indices(n)[:2]) for s, n in zip(index, self.shape)]))
    return get(self, index)


m.InitTensor.__getitem__ = record
mesh = m.make_mesh()
with jax.set_mesh(mesh):
    optimizer = m.make_optimizer()
    shardings, _, abstract = m.layouts(mesh, optimizer)
    state = m.init_state(args, optimizer, shardings, abstract)
    own = {}  # canonical name -> the slices this process's devices hold
    for name, a in abstract["params"].items():
        for index in shardings["params"][name].addressable_devices_indices_map(a.shape).values():
            box = [list(s.indices(n)[:2]) for s, n in zip(index, a.shape)]
            repeat, local = m.stack_of(name)
            held = [(name, box)] if repeat is None else [
                (f"{repeat}.{i}.{local}", box[1:]) for q, i in enumerate(m.copies(repeat)) if box[0][0] <= q < box[0][1]]
            for canonical, part in held:
                if part not in own.setdefault(canonical, []):
                    own[canonical].append(part)
    initial = {k: np.asarray(v.addressable_shards[0].data) for k, v in state["params"].items()}
    manager = m.CHECKPOINTS.manager(ckpt)
    m.CHECKPOINTS.save(manager, 0, state)
    manager.close()
    first = list(asked)
    asked.clear()
    args.resume = ckpt
    resumed = m.init_state(args, optimizer, shardings, abstract)
    same = all(np.array_equal(np.asarray(v.addressable_shards[0].data), initial[k])
               for k, v in resumed["params"].items())
    with open(out, "w") as f:
        json.dump({"asked": first, "own": own, "asked_on_resume": len(asked), "resumed_equal": same,
                   "shapes": {k: list(v[0]) for k, v in m.PARAMS.items()}}, f)
jax.distributed.shutdown()
'''
PROBE = PROBE.replace("@TESTS@", repr(str(Path(__file__).resolve().parent)))  # tests/program_import.py


@pytest.mark.slow
def test_each_process_computes_only_its_slices():
    program = build(GPT, "fsdp=8")
    probe = WORK / "init_probe.py"
    probe.write_text(PROBE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ckpt = WORK / "ckpt-probe"
    procs, outs = [], []
    for pid in range(2):
        out = WORK / f"probe-{pid}.json"
        env = env_for({"MITHRIL_COORDINATOR": f"127.0.0.1:{port}", "MITHRIL_NUM_PROCESSES": "2",
                       "MITHRIL_PROCESS_ID": str(pid)})
        procs.append(subprocess.Popen([PY, str(probe), str(program), str(out), str(ckpt)], env=env, cwd=WORK,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs.append(out)
    for p in procs:
        output, _ = p.communicate(timeout=600)
        assert p.returncode == 0, output[-4000:]
    got = [json.loads(o.read_text()) for o in outs]
    shapes = got[0]["shapes"]
    for g in got:
        asked = {}
        for name, box in g["asked"]:
            asked.setdefault(name, []).append(box)
        assert sorted(asked) == sorted(shapes)  # every parameter,
        for name, boxes in asked.items():
            assert sorted(boxes) == sorted(g["own"][name]), name  # exactly the slices of its own devices, once
            whole = [[0, n] for n in shapes[name]]
            assert whole not in boxes or len(g["own"][name]) == 1, name
        assert g["asked_on_resume"] == 0 and g["resumed_equal"]
    # fsdp=8 over 2 processes: each computes its half of a weight matrix split over fsdp, 4 slices of 16 rows
    rows = [sorted(tuple(box[0]) for box in g["own"]["blocks.3.attn.q.weight"]) for g in got]
    assert all(len(r) == 4 and all(b - a == 16 for a, b in r) for r in rows)
    assert sorted(rows[0] + rows[1]) == [(a, a + 16) for a in range(0, 128, 16)]
    report("sharded init, 2 processes x 4 devices (gpt-tiny fsdp=8)", slices_asked=[len(g["asked"]) for g in got],
           parameters=len(shapes))
