"""Token data (`data: {kind: tokens}`) and evaluation (`eval`) in every target (docs/program.md "Data" and
"Evaluation").

- One small GPT on a token file the test writes (uint16, a path relative to the spec), `eval: {split: 0.1,
  every: 2, batches: 2}`: JAX on one device and on fsdp=2 x tensor=2, PyTorch on one rank and on four
  (FSDP2 + tensor parallelism), MLX in one process give the same training losses and the same val_loss /
  val_accuracy after steps 2, 4 and 5 (the last); `--eval-only --resume` gives the val_loss the run
  logged at the checkpoint's step.
- The shared data code, in one Python process that imports MLX programs (the quickest to import) and
  calls their `Data` and `main` directly: each epoch reads every training window once in the documented
  order and never a held-out one; the held-out samples of tokens, text and arrays; ids of `vocab` or
  more, a truncated file and files too short stop the program with one line (exit 2); evaluation on
  arrays from `eval.path` and on synthetic samples (seed + 2) computes the loss training computes on the
  same samples.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import numpy as np
import pytest
import torch_runs as tr

WORK = jr.WORK / "eval"
VOCAB, SEQ, BATCH = 64, 16, 8
WINDOWS = 160  # split 0.1 holds out the last 16: the 2 evaluation batches of 8
STEPS = 5  # evaluations after steps 2, 4 and 5 (the last)

GPT = f"""
version: 1
name: gpt-tokens
targets: [jax, torch, mlx]
dims: {{vocab: {VOCAB}, seq: {SEQ}, d: 32, heads: 2, ff: 64, layers: 2}}
model:
  inputs:
    tokens: {{shape: [batch, seq], dtype: int32}}
    targets: {{shape: [batch, seq], dtype: int32}}
  blocks:
    decoder:
      - {{op: layer_norm, name: ln1}}
      - {{op: attention, name: attn, heads: heads, causal: true}}
      - {{op: add, name: res1, inputs: [block_input, attn]}}
      - {{op: layer_norm, name: ln2}}
      - {{op: mlp, name: mlp, hidden: ff, activation: gelu}}
      - {{op: add, name: res2, inputs: [res1, mlp]}}
  layers:
    - {{op: embedding, name: wte, vocab: vocab, dim: d, input: tokens}}
    - {{op: pos_embedding, name: wpe, max_len: seq}}
    - {{repeat: layers, block: decoder, name: blocks}}
    - {{op: layer_norm, name: ln_f}}
    - {{op: linear, name: lm_head, dimension: vocab, bias: false, tie: wte}}
  loss: {{op: cross_entropy, logits: lm_head, targets: targets}}
meshes:
  default: {{fsdp: 2, tensor: 2}}
  single: {{data: 1}}
sharding:
  rules: {{batch: [data, fsdp], embed: fsdp, heads: tensor, kv_heads: tensor, mlp: tensor}}
training:
  batch_size: {BATCH}
  steps: {STEPS}
  optimizer: {{name: adamw, lr: 1.0e-2, weight_decay: 0.1}}
  clip_grad_norm: 1.0
  seed: 0
data: {{kind: tokens, path: tokens.bin}}
eval: {{split: 0.1, every: 2, batches: 2}}
"""


def token_ids(n: int, seed: int = 0) -> np.ndarray:
    """Ids with something to learn: mostly next = (5 * id + 3) % VOCAB, one in ten random."""
    rng = np.random.default_rng(seed)
    ids = np.zeros(n, np.int64)
    for k in range(1, n):
        ids[k] = (5 * ids[k - 1] + 3) % VOCAB if rng.random() > 0.1 else rng.integers(VOCAB)
    return ids


def write(path: Path, text_or_bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text_or_bytes, bytes) else path.write_text)(text_or_bytes)
    return path


@pytest.fixture(scope="module")
def gpt() -> Path:
    """The GPT spec next to its token file (the spec names it relative to itself)."""
    write(WORK / "tokens.bin", token_ids(WINDOWS * SEQ + 1).astype("<u2").tobytes())
    return write(WORK / "gpt-tokens.yaml", GPT)


def val_rows(run) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["val_loss"], r["val_accuracy"]) for r in run.metrics if "val_loss" in r}


@pytest.mark.slow
def test_tokens_and_evaluation_are_the_same_in_every_target_and_mesh(gpt, tmp_path):
    ckpt = tmp_path / "ckpt"
    steps = ("--steps", str(STEPS))
    runs = {  # the longest first: two at a time
        "torch fsdp=2 x tensor=2 (4 ranks)": lambda: tr.run(tr.build(gpt), *steps, export=False),
        "jax fsdp=2 x tensor=2": lambda: jr.run(jr.build(gpt), *steps, export=False),
        "jax 1 device": lambda: jr.run(jr.build(gpt, "single"), *steps, export=False),
        "torch 1 rank": lambda: tr.run(tr.build(gpt, "single"), *steps, export=False),
        "mlx 1 process": lambda: mr.run(mr.build(gpt, "single"), *steps, "--checkpoint-dir", str(ckpt),
                                        export=False),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = dict(zip(runs, pool.map(lambda f: f(), runs.values())))
        resumed = pool.submit(mr.run, mr.build(gpt, "single"), "--eval-only", "--resume", str(ckpt), export=False)
        resumed = resumed.result()
    ref = done["jax 1 device"]
    assert len(ref.losses) == STEPS and ref.losses[-1] < ref.losses[0]
    want = val_rows(ref)
    assert sorted(want) == [2, 4, STEPS] and want[STEPS][1] > 0.1  # it learns something to predict
    figures = {}
    for name, run in done.items():
        got = val_rows(run)
        assert sorted(got) == sorted(want), (name, run.metrics)
        figures[name] = {
            "loss": jr.max_diff(run.losses, ref.losses),
            "val_loss": max(abs(got[s][0] - want[s][0]) for s in want),
            "val_accuracy": max(abs(got[s][1] - want[s][1]) for s in want),
        }
        assert max(figures[name].values()) < 1e-5, (name, figures[name])
        assert " | val_loss " in run.output and " | val_accuracy " in run.output  # the log lines too
    # --eval-only after --resume: one row, at the checkpoint's step, with the val_loss logged there
    (row,) = resumed.metrics
    assert row["step"] == STEPS and set(row) == {"step", "val_loss", "val_accuracy"}
    mlx_val = val_rows(done["mlx 1 process"])[STEPS]
    assert abs(row["val_loss"] - mlx_val[0]) < 1e-6 and row["val_accuracy"] == mlx_val[1]
    jr.report("eval: tokens, 5 programs", max_differences=figures, val=want,
              eval_only_after_resume=abs(row["val_loss"] - mlx_val[0]))


# ---------------------------------------------------------------- the shared data code, in one process

DRIVER = r"""
import contextlib, importlib.util, io, json, os, sys, traceback
sys.path.insert(0, @TESTS@)
from program_import import load_program
import numpy as np
jobs, results, modules = json.loads(sys.argv[1]), [], {}
for job in jobs:
    program = job["program"]
    if program not in modules:
        modules[program] = load_program(os.path.dirname(program))
    mod, out, err, code, value = modules[program], io.StringIO(), io.StringIO(), 0, None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if "argv" in job:
                mod.cli(job["argv"] + ["--checkpoint-dir", ""])
            else:
                value = eval(job["expr"], {"mod": mod, "np": np})
        except SystemExit as e:
            code = e.code
        except BaseException:
            traceback.print_exc()
            code = "traceback"
    results.append({"code": code, "value": value, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""
DRIVER = DRIVER.replace("@TESTS@", repr(str(Path(__file__).resolve().parent)))  # tests/program_import.py


def drive(jobs: list[dict], cwd: Path) -> list[dict]:
    p = subprocess.run([jr.PY, "-c", DRIVER, json.dumps(jobs)], cwd=cwd, env=jr.env_for(), capture_output=True,
                       text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


def one_line(result: dict) -> str:
    lines = result["stderr"].splitlines()
    assert result["code"] == 2 and len(lines) == 1 and lines[0].startswith("error: "), result
    return lines[0]


def metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_windows_held_out_samples_errors_and_eval_on_arrays_and_synthetic(gpt, tmp_path):
    seq_ids = token_ids(WINDOWS * SEQ + 1)
    # --data files for the token program: ids of vocab or more in every window, a truncated file, files
    # too short for one window and for a held-out one besides
    bad = seq_ids.copy()
    bad[5::SEQ] = VOCAB + 6
    files = {
        "bad-ids": bad.astype("<u2").tobytes(),
        "truncated": seq_ids.astype("<u2").tobytes()[:-1],
        "one-window": seq_ids[: SEQ + 1].astype("<u2").tobytes(),
        "short": seq_ids[:SEQ].astype("<u2").tobytes(),
    }
    paths = {name: str(write(tmp_path / f"{name}.bin", data)) for name, data in files.items()}
    tokens = str(WORK / "tokens.bin")
    # text (vocab 256) with split 0.1, and mlp-dp on arrays: x[r, 0] = r names the row
    text = bytes(np.random.default_rng(1).integers(32, 127, 1000).astype(np.uint8))
    text_spec = write(tmp_path / "gpt-text.yaml", GPT.replace(f"vocab: {VOCAB},", "vocab: 256,").replace(
        "data: {kind: tokens, path: tokens.bin}", "data: {kind: text, path: text.txt}"))
    write(tmp_path / "text.txt", text)
    rows = 64
    arrays = tmp_path / "arrays"
    x = np.random.default_rng(2).standard_normal((rows, 64)).astype(np.float32)
    x[:, 0] = np.arange(rows)
    arrays.mkdir()
    np.save(arrays / "x.npy", x)
    np.save(arrays / "y.npy", np.random.default_rng(3).integers(0, 10, rows).astype(np.int32))
    on_arrays = f"data: {{kind: arrays, path: {arrays}}}"
    mlp = jr.SPECS / "mlp-dp.yaml"
    programs = {
        "tokens": mr.build(gpt, "single") / "train.py",
        "text": mr.build(text_spec, "single") / "train.py",
        "arrays-split": mr.build(mlp, "single", (("data: {kind: synthetic}", on_arrays + "\neval: {split: 0.25}"),))
        / "train.py",
        "arrays-path": mr.build(mlp, "single", (("data: {kind: synthetic}", on_arrays + f"\neval: {{path: {arrays}}}"),))
        / "train.py",
        "synthetic": mr.build(mlp, "single", (("data: {kind: synthetic}", "data: {kind: synthetic}\neval: {}"),))
        / "train.py",
    }
    seed, train_windows = 7, WINDOWS - WINDOWS // 10
    m = {k: tmp_path / f"{k}.jsonl" for k in ("arrays-eval", "arrays-train", "syn-eval", "syn-train")}
    params = tmp_path / "seed0.npz"
    jobs = [
        # the windows of 3 epochs and of the evaluation, by the program's Data
        ("tokens", f"[mod.Data({tokens!r}, seed={seed}).window(i) for i in range({3 * train_windows})]"),
        ("tokens", f"[mod.Data({tokens!r}, held_out=True).window(j) for j in range(40)]"),
        ("tokens", f"[mod.Data({tokens!r}).sample(i)['targets'].tolist() for i in (0, 1)]"),
        ("text", "[mod.Data(held_out=h).sample(i)['tokens'].tolist() for h in (False, True) for i in range(12)]"),
        ("arrays-split", "[float(mod.Data(held_out=h).sample(i)['x'][0]) for h in (False, True) for i in range(60)]"),
        *[("tokens", ["--data", p, "--steps", "1"]) for p in paths.values()],
        ("arrays-path", ["--eval-only", "--metrics", str(m["arrays-eval"])]),
        ("arrays-path", ["--steps", "1", "--metrics", str(m["arrays-train"])]),
        ("synthetic", ["--steps", "0", "--export-params", str(params)]),
        ("synthetic", ["--eval-only", "--metrics", str(m["syn-eval"])]),
        # seed 1 draws training data from seed 2: the evaluation samples of seed 0
        ("synthetic", ["--seed", "1", "--init-params", str(params), "--steps", "1", "--metrics", str(m["syn-train"])]),
    ]
    results = drive([{"program": str(programs[p]), ("argv" if isinstance(j, list) else "expr"): j}
                     for p, j in jobs], tmp_path)
    (windows, held, first_targets, text_samples, array_rows), errors, runs = results[:5], results[5:9], results[9:]
    for r in results[:5] + runs:
        assert r["code"] == 0, r

    # tokens: epoch e reads np.random.default_rng([data_seed, e]).permutation(Wt): every training window
    # once, none of the held-out ones; the evaluation reads the held-out windows in order
    got = windows["value"]
    for e in range(3):
        epoch = got[e * train_windows:(e + 1) * train_windows]
        assert epoch == np.random.default_rng([seed, e]).permutation(train_windows).tolist()
        assert sorted(epoch) == list(range(train_windows))
    assert held["value"] == [train_windows + j % (WINDOWS // 10) for j in range(40)]
    w0 = np.random.default_rng([1, 0]).permutation(train_windows)[:2]  # data seed 0 + 1
    assert first_targets["value"] == [seq_ids[w * SEQ + 1:w * SEQ + SEQ + 1].tolist() for w in w0]
    # text: training reads the first 900 bytes at (i * 7919) % (900 - seq - 1), the evaluation the last 100
    # at (j * seq) % (100 - seq - 1)
    t = np.frombuffer(text, np.uint8)
    cut = len(t) - 100
    want = [t[o:o + SEQ].tolist() for o in ((i * 7919) % (cut - SEQ - 1) for i in range(12))]
    want += [t[cut + o:cut + o + SEQ].tolist() for o in ((j * SEQ) % (100 - SEQ - 1) for j in range(12))]
    assert text_samples["value"] == want
    # arrays: split 0.25 of 64 rows holds out the last 16
    assert array_rows["value"] == [float(i % 48) for i in range(60)] + [float(48 + j % 16) for j in range(60)]

    lines = [one_line(r) for r in errors]
    assert f"holds {VOCAB + 6}, outside [0, {VOCAB})" in lines[0] and paths["bad-ids"] in lines[0]
    assert "step 1/" not in errors[0]["stdout"]  # refused before the step
    assert f"holds {2 * len(seq_ids) - 1} bytes, not a whole number of uint16 token ids" in lines[1]
    assert "none left to train on once eval.split 0.1 holds out the last 1" in lines[2]
    assert f"holds {SEQ} token id(s), fewer than one window" in lines[3]

    # evaluation on eval.path = the training arrays (one batch: the same 64 rows as step 1), and on
    # synthetic samples from seed + 2: the loss training computes on the same samples with the same parameters
    (arrays_eval,), (arrays_train,) = metrics(m["arrays-eval"]), metrics(m["arrays-train"])
    (syn_eval,), (syn_train,) = metrics(m["syn-eval"]), metrics(m["syn-train"])
    assert arrays_eval["step"] == 0 and 0 <= arrays_eval["val_accuracy"] <= 1
    assert abs(arrays_eval["val_loss"] - arrays_train["loss"]) < 1e-6
    assert abs(syn_eval["val_loss"] - syn_train["loss"]) < 1e-6
    assert "val_loss" in arrays_train  # the evaluation after the last step
    jr.report("eval: shared data code", errors=[line[:100] for line in lines],
              arrays_eval=arrays_eval["val_loss"] - arrays_train["loss"],
              synthetic_eval=syn_eval["val_loss"] - syn_train["loss"])
