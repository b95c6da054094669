"""generate.py, sampling from a language model (docs/program.md "Sampling (generate.py)").

Which builds get it (Plan.language_model, the targets' conditional files), then the programs themselves:
gpt-tiny trains 2 steps once (JAX, one device: --export-params and a checkpoint), and generate.py of the
JAX build on one device and on data=2 x tensor=2, of the PyTorch build in one process and on tensor=2
(2 ranks), and of the MLX build (one process, no cache), continue one prompt greedily from that file: the
tokens are the same everywhere, and the decode's most probable token equals that of the training forward
pass over the whole sequence at every position (--check). A temperature / top-k draw gives the same tokens
for a seed (JAX from the checkpoint, PyTorch and MLX from the file);
a tokenizer.json encodes the prompt; bad input stops with exit code 2 and one line. The runs go two at a
time; each test prints its figures (pytest -s).
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import tempfile
import time
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import pytest
import torch_runs as tr
from program_zygote import zygote

from mithril_spec.frontend import compile_file
from mithril_spec.render.build import build_files, render_files
from mithril_spec.targets import TARGETS

GPT = jr.SPECS / "gpt-tiny.yaml"
PROMPT = "Hello"
GREEDY = ("--prompt", PROMPT, "--temperature", "0", "--check", "--json")
DRAW = ("--prompt-ids", "1,2,3", "--temperature", "0.8", "--top-k", "20", "--max-new-tokens", "30", "--json")


# ---------------------------------------------------------------- which builds get generate.py (no runs)

def test_language_models_get_generate_py_and_others_do_not():
    lm = compile_file(GPT).plan.language_model
    assert (lm.tokens, lm.targets, lm.vocab, lm.seq, lm.dropout) == ("tokens", "targets", 256, 64, False)
    for target in ("jax", "torch"):
        assert "generate.py" in render_files(compile_file(GPT, "data=1"), target, GPT.name)
        assert "generate.py" not in render_files(compile_file(jr.SPECS / "mlp-dp.yaml"), target, "mlp-dp.yaml")
    # mlx: in one process, so not over `tensor` (the build says why)
    from mithril_spec.lowering import LOWERINGS

    assert "generate.py" in render_files(compile_file(GPT, "data=2"), "mlx", GPT.name)
    over_tensor = compile_file(GPT, "tensor=2").plan
    assert "generate.py" in [name for _, name in TARGETS["mlx"].files_for(over_tensor)]
    assert "generate.py" not in [name for _, name in LOWERINGS["mlx"].files_for(over_tensor)]
    why = LOWERINGS["mlx"].left_out(over_tensor)["generate.py"]
    assert "`tensor`" in why and "--params" in why
    assert "generate.py" in build_files()
    # a pipeline of several stages is one (tests/test_generate_parallel.py samples through its stages)
    assert compile_file(jr.SPECS / "gpt-pipe.yaml").plan.language_model is not None
    # not a language model: a moe layer with capped routing (its slots fill over the whole sample), attention
    # that is not causal
    assert compile_file(jr.SPECS / "moe-dp.yaml").plan.language_model is None
    bidirectional = jr.spec_variant(GPT, (("causal: true", "causal: false"),))
    assert compile_file(bidirectional).plan.language_model is None


# ---------------------------------------------------------------- the programs

def _generate(target: str, program: Path, args: tuple, ranks: int = 1) -> dict:
    """Runs `generate.py ARGS` of `program` on `ranks` ranks, forked by the session's zygote
    (tests/program_zygote.py: as `python generate.py` starts, with the environment torchrun sets for several
    ranks) -> rc, stdout, stderr, seconds and, with --json and exit code 0, the JSON object it printed."""
    runs = tr if target == "torch" else jr
    env = runs.env_for()
    out_file = Path(tempfile.mkstemp(prefix="generate-", suffix=".out", dir=jr.WORK)[1])
    err_file = out_file.with_suffix(".err")
    t0 = time.perf_counter()
    if target == "mlx":  # (no zygote: `python generate.py`)
        with open(out_file, "w") as out, open(err_file, "w") as err:
            rc = subprocess.run([jr.PY, str(program / "generate.py"), *args], cwd=program, env=env, stdout=out,
                                stderr=err, timeout=600, check=False).returncode
    else:
        rc = zygote(target, env).run(str(program / "generate.py"), list(args), cwd=str(program), env=env,
                                     log=str(out_file), err=str(err_file), ranks=ranks, rank_env=ranks > 1)
    out = {"rc": rc, "stdout": out_file.read_text(), "stderr": err_file.read_text(),
           "seconds": time.perf_counter() - t0}
    if rc == 0 and "--json" in args:
        out["json"] = json.loads(out["stdout"].strip().splitlines()[-1])
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of the module, two at a time: the parameters first, then the generate.py runs."""
    work = tmp_path_factory.mktemp("generate")
    jax1, jax4 = jr.build(GPT, "data=1"), jr.build(GPT, "data=2,tensor=2")
    torch1, torch2 = tr.build(GPT, "data=1"), tr.build(GPT, "tensor=2")
    mlx1 = mr.build(GPT, "data=1")
    params, ckpt = work / "params.safetensors", work / "ckpt"
    t0 = time.perf_counter()
    trained = jr.run(jax1, "--steps", "2", "--export-params", str(params), "--checkpoint-dir", str(ckpt),
                     export=False, metrics=False)
    train_s = time.perf_counter() - t0
    assert params.is_file() and ckpt.is_dir(), trained.output[-2000:]
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["hello world, hello there"] * 20, trainers.BpeTrainer(
        vocab_size=256, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(work / "tokenizer.json"))
    with_params = ("--params", str(params))
    long_prompt = ",".join(["1"] * 65)
    jobs = {
        "jax": ("jax", jax1, with_params + GREEDY),
        "jax sharded": ("jax", jax4, with_params + GREEDY),
        "torch": ("torch", torch1, with_params + GREEDY),
        "torch 2 ranks": ("torch", torch2, with_params + GREEDY, 2),
        "jax draw (checkpoint)": ("jax", jax1, ("--resume", str(ckpt), "--seed", "3") + DRAW),
        "torch draw": ("torch", torch1, with_params + ("--seed", "3") + DRAW),
        "mlx": ("mlx", mlx1, with_params + GREEDY),
        "mlx draw": ("mlx", mlx1, with_params + ("--seed", "3") + DRAW),
        "tokenizer": ("torch", torch1, with_params + ("--tokenizer", str(work / "tokenizer.json"), "--prompt",
                                                      "hello world", "--max-new-tokens", "5", "--json")),
        "missing file": ("jax", jax1, ("--params", str(work / "nope.safetensors"))),
        "prompt longer than seq": ("jax", jax1, with_params + ("--prompt-ids", long_prompt)),
        "id outside the vocab": ("torch", torch1, with_params + ("--prompt-ids", "1,256")),
        "tokenizer missing": ("torch", torch1, with_params + ("--tokenizer", str(work / "nope.json"), "--prompt", "hi")),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_generate, *job) for name, job in jobs.items()}
        got = {name: f.result() for name, f in futures.items()}
    got["train_s"] = train_s
    got["tokenizer.json"] = tok
    return got


GREEDY_RUNS = ["jax", "jax sharded", "torch", "torch 2 ranks", "mlx"]


@pytest.mark.slow
def test_greedy_tokens_are_the_same_in_every_target_and_mesh(runs):
    for name in GREEDY_RUNS:
        assert runs[name]["rc"] == 0, f"{name}: exit {runs[name]['rc']}\n{runs[name]['stderr'][-3000:]}"
    first = runs["jax"]["json"]
    assert first["prompt_ids"] == list(PROMPT.encode())
    # the default --max-new-tokens runs to the context: seq tokens in all, the generation says it stopped
    assert first["stopped_at_context"] and len(first["prompt_ids"]) + len(first["new_ids"]) == 64
    assert "stopped after 59 new token(s)" in runs["jax"]["stderr"]
    for name in GREEDY_RUNS[1:]:
        assert runs[name]["json"]["new_ids"] == first["new_ids"], name
    jr.report("generate greedy", tokens=len(first["new_ids"]), train_s=round(runs["train_s"], 1),
              **{f"{name} s": round(runs[name]["seconds"], 1) for name in GREEDY_RUNS},
              **{f"{name} decode s": round(runs[name]["json"]["seconds"], 2) for name in GREEDY_RUNS})


@pytest.mark.slow
def test_cached_decode_equals_the_full_forward_pass_at_every_position(runs):
    for name in GREEDY_RUNS:
        check = runs[name]["json"]["check"]
        assert check["positions"] == 63 and check["argmax_differs"] == [], (name, check)
        assert check["max_abs_diff"] < 1e-4, (name, check)
    jr.report("generate --check", **{name: runs[name]["json"]["check"]["max_abs_diff"] for name in GREEDY_RUNS})


@pytest.mark.slow
def test_temperature_and_top_k_draws_depend_only_on_the_seed(runs):
    same = [runs[name] for name in ("jax draw (checkpoint)", "torch draw", "mlx draw")]
    for r in same:
        assert r["rc"] == 0, r["stderr"][-3000:]
    a, *others = (r["json"] for r in same)
    assert a["prompt_ids"] == [1, 2, 3] and len(a["new_ids"]) == 30 and not a["stopped_at_context"]
    for b in others:
        assert a["new_ids"] == b["new_ids"], "the same seed and parameters (checkpoint or file, any target) differ"
    assert len(set(a["new_ids"])) > 5  # a draw, not the greedy repetition


@pytest.mark.slow
def test_tokenizer_encodes_the_prompt_and_decodes_the_output(runs):
    r = runs["tokenizer"]
    assert r["rc"] == 0, r["stderr"][-3000:]
    tok, got = runs["tokenizer.json"], r["json"]
    assert got["prompt_ids"] == tok.encode("hello world").ids
    assert got["text"] == tok.decode(got["prompt_ids"] + got["new_ids"])


BAD = {
    "missing file": "--params",
    "prompt longer than seq": "more than the model's context of 64",
    "id outside the vocab": "outside the vocabulary 0..255",
    "tokenizer missing": "--tokenizer",
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exits_2_with_one_line(runs, case):
    r = runs[case]
    assert r["rc"] == 2, f"{case}: exit {r['rc']}\n{r['stderr'][-3000:]}"
    lines = r["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and BAD[case] in lines[0], lines
    assert not r["stdout"].strip()


# ---------------------------------------------------------------- moe layers (dropless routing)

MOE = jr.SPECS / "moe-shared.yaml"


def test_dropless_moe_models_get_generate_py_but_not_over_pipe_or_context():
    """Dropless routing keeps every choice, so a moe layer decodes one position at a time (Moe.decodes):
    moe-shared is a language model, with generate.py in jax and torch; over `context` (and `pipe`) the build
    leaves it out, saying why (Lowering.left_out)."""
    from mithril_spec.lowering import LOWERINGS

    assert compile_file(MOE).plan.language_model is not None
    for target in ("jax", "torch"):
        assert "generate.py" in render_files(compile_file(MOE, "single"), target, MOE.name)
        plan = compile_file(MOE, "context=2").plan
        why = LOWERINGS[target].left_out(plan)["generate.py"]
        assert "moe layers" in why and "`context`" in why
        assert "generate.py" not in [name for _, name in LOWERINGS[target].files_for(plan)]


@pytest.fixture(scope="module")
def moe_runs(tmp_path_factory):
    """moe-shared trained 2 steps (JAX, one device, --export-params), then generate.py greedy with --check on one
    device and on data=2 x expert=2 (JAX: 4 devices; torch: 4 ranks, the experts' weights gathered whole)."""
    params = tmp_path_factory.mktemp("generate-moe") / "params.safetensors"
    jr.run(jr.build(MOE, "single"), "--steps", "2", "--export-params", str(params), export=False, metrics=False)
    args = ("--params", str(params)) + GREEDY
    jobs = {"jax": ("jax", jr.build(MOE, "single"), args), "jax data=2 x expert=2": ("jax", jr.build(MOE, "four"), args),
            "torch": ("torch", tr.build(MOE, "single"), args),
            "torch data=2 x expert=2": ("torch", tr.build(MOE, "four"), args, 4)}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_generate, *job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.slow
def test_moe_greedy_tokens_equal_the_training_forward_everywhere(moe_runs):
    """The cached decode's moe layers (jax: train.py's moe at one position; torch: the decoder's) give the most
    probable token of the training program's forward pass at every position (--check), and the same tokens in
    both targets and on both meshes."""
    for name, r in moe_runs.items():
        assert r["rc"] == 0, f"{name}: exit {r['rc']}\n{r['stderr'][-3000:]}"
        check = r["json"]["check"]
        assert check["positions"] == 15 and check["argmax_differs"] == [] and check["max_abs_diff"] < 1e-4, (name, check)
    first = moe_runs["jax"]["json"]
    assert first["stopped_at_context"] and len(first["prompt_ids"]) + len(first["new_ids"]) == 16
    for name, r in moe_runs.items():
        assert r["json"]["new_ids"] == first["new_ids"], name
    jr.report("generate moe-shared", **{name: r["json"]["check"]["max_abs_diff"] for name, r in moe_runs.items()})
