"""generate.py of pipelined and context-parallel builds (docs/program.md "Sampling (generate.py)"; issue 40,
items 1 and 5).

Pipelines: specs/gpt-pipe.yaml trains 3 steps on one device (JAX, --export-params); generate.py of the
one-device JAX build draws 29 tokens (temperature 0.8, top-k 20, seed 3) from those parameters, and the
pipelined builds draw the same tokens, sampling through their stages: JAX 1f1b and interleaved on pipe=2 and
on pipe=2 x data=2 x tensor=2 (the copies' rows and caches on their pipe rank, the activation passed with
ppermute), PyTorch 1f1b and interleaved on 2 ranks and pipe=2 x tensor=2 on 4 (each rank builds, loads and
runs its stages, the activation sent point to point). A pipelined build's own checkpoint (--resume) samples
as its exported parameters do in the one-device build, in both targets. Greedy with --check, every
pipelined build's cached decode agrees at every position with its training forward pass through the
pipeline (JAX: the circular pipeline's loop; PyTorch: the stages' forward passes, point to point). A JAX
pipeline whose stages are padded gets no generate.py.

Context parallelism: tests/specs/gpt-context.yaml (learned positions and rotary grouped-query attention)
trains 2 steps on one device; generate.py on context=2 and context=2 x tensor=2 (JAX and PyTorch) draws the
one-device build's tokens, and its --check (the training forward pass over the whole sequence, held in
the balanced order, against the cached decode) agrees at every position.
"""

from __future__ import annotations

import concurrent.futures

import jax_runs as jr
import pytest
import torch_runs as tr
from test_generate import _generate

from mithril_spec.cli import main as cli
from mithril_spec.frontend import compile_file
from mithril_spec.render.build import render_files

GPT_PIPE = jr.SPECS / "gpt-pipe.yaml"
GPT_CONTEXT = jr.ROOT / "tests" / "specs" / "gpt-context.yaml"
INTERLEAVED = (("schedule: 1f1b}", "schedule: interleaved, virtual_stages: 2}"),)
# `device:` placement, uneven: 1 copy on stage 0, 3 on stage 1 (the jax build pads stage 0 to 3 rows)
UNEVEN = (("    - {repeat: layers, block: decoder, name: blocks}",
           "    - {repeat: 1, block: decoder, name: blocks, device: 0}\n"
           "    - {repeat: 3, block: decoder, name: more, device: 1}"),)
DRAW = ("--prompt-ids", "1,2,3", "--temperature", "0.8", "--top-k", "20", "--seed", "3", "--json")
GREEDY = ("--prompt-ids", "1,2,3", "--temperature", "0", "--check", "--json")


def test_pipelined_and_context_parallel_builds_get_generate_py(tmp_path, capsys):
    for mesh in ("pipe=2", "pipe=2,tensor=2"):
        assert compile_file(GPT_PIPE, mesh).plan.language_model is not None
        for target in ("jax", "torch"):
            assert "generate.py" in render_files(compile_file(GPT_PIPE, mesh), target, GPT_PIPE.name)
    for mesh in ("context", "context_tensor"):
        for target in ("jax", "torch"):
            assert "generate.py" in render_files(compile_file(GPT_CONTEXT, mesh), target, GPT_CONTEXT.name)
    # a jax pipeline of padded stages has none (torch pipelines any placement)
    uneven = compile_file(jr.spec_variant(GPT_PIPE, UNEVEN), "pipe=2")
    assert "generate.py" not in render_files(uneven, "jax", GPT_PIPE.name)
    assert "generate.py" in render_files(uneven, "torch", GPT_PIPE.name)
    # ... and `build` says so, with what to do instead (nothing left out in silence)
    for target in ("jax", "torch"):
        rc = cli(["build", str(jr.spec_variant(GPT_PIPE, UNEVEN)), "--target", target, "--mesh", "pipe=2",
                  "-o", str(tmp_path / target)])
        err = capsys.readouterr().err
        assert rc == 0 and ("note: no generate.py: the jax program samples a pipeline" in err) == (target == "jax"), err
    cli(["build", str(GPT_PIPE), "--target", "jax", "--mesh", "pipe=2", "-o", str(tmp_path / "even")])
    assert "note: no generate.py" not in capsys.readouterr().err


@pytest.fixture(scope="module")
def pipe_runs():
    """The one-device training run, the pipelined trainings with checkpoints, then every generate.py run, two at
    a time."""
    single = jr.build(GPT_PIPE, "single")
    trained = jr.run(single, "--steps", "3")
    params = str(trained.cwd / "params.npz")
    ck = {t: jr.WORK / f"gen-pipe-ckpt-{t}" for t in ("jax", "torch")}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        piped_jax = pool.submit(jr.run, jr.build(GPT_PIPE, "pipe=2"), "--steps", "2", "--checkpoint-dir", str(ck["jax"]))
        piped_torch = pool.submit(tr.run, tr.build(GPT_PIPE, "pipe=2"), "--steps", "2", "--checkpoint-dir",
                                  str(ck["torch"]))
        piped = {"jax": piped_jax.result(), "torch": piped_torch.result()}
    with_params = ("--params", params)
    jobs = {
        "jax 1 device": ("jax", single, with_params + DRAW),
        "jax 1f1b pipe=2": ("jax", jr.build(GPT_PIPE, "pipe=2"), with_params + DRAW),
        "jax interleaved pipe=2": ("jax", jr.build(GPT_PIPE, "pipe=2", INTERLEAVED), with_params + DRAW),
        "jax pipe=2 x data=2 x tensor=2": ("jax", jr.build(GPT_PIPE), with_params + DRAW),
        "torch 1f1b pipe=2": ("torch", tr.build(GPT_PIPE, "pipe=2"), with_params + DRAW, 2),
        "torch interleaved pipe=2": ("torch", tr.build(GPT_PIPE, "pipe=2", INTERLEAVED), with_params + DRAW, 2),
        "torch pipe=2 x tensor=2": ("torch", tr.build(GPT_PIPE, "pipe=2,tensor=2"), with_params + DRAW, 4),
        # a pipelined build's checkpoint, against its exported parameters in the one-device build
        "jax pipe=2 --resume": ("jax", jr.build(GPT_PIPE, "pipe=2"), ("--resume", str(ck["jax"])) + DRAW),
        "jax 1 device, the pipelined run's parameters": (
            "jax", single, ("--params", str(piped["jax"].cwd / "params.npz")) + DRAW),
        "torch pipe=2 --resume": ("torch", tr.build(GPT_PIPE, "pipe=2"), ("--resume", str(ck["torch"])) + DRAW, 2),
        "jax 1 device, the torch pipelined run's parameters": (
            "jax", single, ("--params", str(piped["torch"].cwd / "params.npz")) + DRAW),
    }
    for name in PIPELINED:  # greedy, with --check
        kind, program, _, *ranks = jobs[name]
        jobs[f"{name} --check"] = (kind, program, with_params + GREEDY, *ranks)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_generate, *job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


PIPELINED = ("jax 1f1b pipe=2", "jax interleaved pipe=2", "jax pipe=2 x data=2 x tensor=2", "torch 1f1b pipe=2",
             "torch interleaved pipe=2", "torch pipe=2 x tensor=2")


def _ok(runs, name) -> dict:
    r = runs[name]
    assert r["rc"] == 0, f"{name}: exit {r['rc']}\n{r['stderr'][-3000:]}"
    return r["json"]


@pytest.mark.slow
def test_pipelined_builds_sample_the_one_device_tokens(pipe_runs):
    want = _ok(pipe_runs, "jax 1 device")
    assert want["prompt_ids"] == [1, 2, 3] and len(want["new_ids"]) == 29 and len(set(want["new_ids"])) > 5
    for name in PIPELINED:
        assert _ok(pipe_runs, name)["new_ids"] == want["new_ids"], name
    for target in ("jax", "torch"):
        resumed = _ok(pipe_runs, f"{target} pipe=2 --resume")["new_ids"]
        exported = _ok(pipe_runs, "jax 1 device, the pipelined run's parameters" if target == "jax" else
                       "jax 1 device, the torch pipelined run's parameters")["new_ids"]
        assert resumed == exported and resumed != want["new_ids"], target  # (trained 2 steps, not 3)
    jr.report("generate pipelined", tokens=len(want["new_ids"]),
              seconds={name: round(r["seconds"], 1) for name, r in pipe_runs.items()})


@pytest.mark.slow
def test_cached_decode_equals_the_forward_pass_through_the_pipeline(pipe_runs):
    figures = {}
    for name in PIPELINED:
        got = _ok(pipe_runs, f"{name} --check")
        check = got["check"]
        assert check["positions"] == 31 and check["argmax_differs"] == [], (name, check)
        assert check["max_abs_diff"] < 1e-4, (name, check)
        figures[name] = check["max_abs_diff"]
    jr.report("generate pipelined --check", **figures)


@pytest.mark.slow
def test_context_parallel_builds_sample_the_one_device_tokens_and_check():
    single = jr.build(GPT_CONTEXT, "data=1")
    params = str(jr.run(single, "--steps", "2").cwd / "params.npz")
    jobs = {"jax 1 device": ("jax", single), "jax context=2": ("jax", jr.build(GPT_CONTEXT, "context")),
            "jax context=2 x tensor=2": ("jax", jr.build(GPT_CONTEXT, "context_tensor")),
            "torch context=2": ("torch", tr.build(GPT_CONTEXT, "context"), 2),
            "torch context=2 x tensor=2": ("torch", tr.build(GPT_CONTEXT, "context_tensor"), 4)}
    runs = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {(name, kind): pool.submit(_generate, job[0], job[1], ("--params", params) + args, *job[2:])
                   for name, job in jobs.items() for kind, args in (("draw", DRAW), ("greedy", GREEDY))}
        runs = {key: f.result() for key, f in futures.items()}
    want = {kind: _ok(runs, ("jax 1 device", kind))["new_ids"] for kind in ("draw", "greedy")}
    assert len(set(want["draw"])) > 3
    figures = {}
    for name in jobs:
        for kind in ("draw", "greedy"):
            got = _ok(runs, (name, kind))
            assert got["new_ids"] == want[kind], (name, kind)
        check = runs[name, "greedy"]["json"]["check"]
        assert check["positions"] == 15 and check["argmax_differs"] == [], (name, check)
        assert check["max_abs_diff"] < 1e-4, (name, check)
        figures[name] = check["max_abs_diff"]
    jr.report("generate context-parallel --check", **figures)
