"""Token data and parameter files checked against the spec before step 1 (issue 36): one line, exit 2, saying
how to fix it; `validate` says the same (E013) when the file is there.

- Token files (shared code, in one Python process that imports the MLX program, as in
  test_runtime_errors.py): a `.npy` file given as flat ids, 32- or 64-bit ids read as 16-bit ones, a
  data.json (written by `data prepare`) whose dtype or vocabulary does not match the spec; errors about the
  spec's own path name `data.path (the spec's)`, not a flag that was not given.
- Hugging Face checkpoints: a 3-layer model directory into a 2-layer program is refused naming the extra
  tensors; generate.py takes the model directory that train.py --init-params takes; `import hf` takes the
  model directory, its config.json, or a weights file beside it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import numpy as np
import pytest
from test_cli import run as cli_run
from test_runtime_errors import DRIVER, one_line, run_process

WORK = jr.WORK / "token-checks"
VOCAB, SEQ = 64, 16

GPT = f"""
version: 1
name: gpt-checks
dims: {{vocab: {VOCAB}, seq: {SEQ}, d: 32, heads: 2}}
model:
  inputs:
    tokens: {{shape: [batch, seq], dtype: int32}}
    targets: {{shape: [batch, seq], dtype: int32}}
  layers:
    - {{op: embedding, name: wte, vocab: vocab, dim: d, input: tokens}}
    - {{op: attention, name: attn, heads: heads, causal: true}}
    - {{op: linear, name: lm_head, dimension: vocab}}
  loss: {{op: cross_entropy, logits: lm_head, targets: targets}}
meshes:
  single: {{data: 1}}
training: {{batch_size: 4, steps: 1, optimizer: {{name: adamw, lr: 1.0e-3}}}}
data: {{kind: tokens, path: good/train.bin}}
"""


def ids(n=400):
    return (np.arange(n) * 7 + 1) % VOCAB


def token_dirs() -> Path:
    root = WORK / "data"
    if root.is_dir():
        return root
    cases = {
        "good": (ids().astype("<u2").tobytes(), {"dtype": "uint16", "vocab": VOCAB}),
        "npy": (None, None),
        "u32": (ids().astype("<u4").tobytes(), None),
        "i64": (ids().astype("<i8").tobytes(), None),
        "meta-dtype": (ids().astype("<u4").tobytes(), {"dtype": "uint32", "vocab": VOCAB}),
        "meta-vocab": (ids().astype("<u2").tobytes(), {"dtype": "uint16", "vocab": 1000}),
        "masked": (ids(300).astype("<u2").tobytes(), None),  # with train.mask: data prepare --format's pair
    }
    for name, (raw, meta) in cases.items():
        (root / name).mkdir(parents=True)
        if raw is None:
            with open(root / name / "train.bin", "wb") as f:
                np.save(f, ids().astype("<u2"))
        else:
            (root / name / "train.bin").write_bytes(raw)
        if meta:
            (root / name / "data.json").write_text(json.dumps(meta))
    (root / "masked" / "train.mask").write_bytes(np.resize(np.uint8([0, 1, 1]), 300).tobytes())
    return root


def spec() -> Path:
    root = token_dirs()
    path = root / "gpt-checks.yaml"
    path.write_text(GPT)
    return path


TOKEN_CASES = [
    ("npy", "is a .npy file (it starts with the .npy header), not flat token ids: write them raw"),
    ("u32", "looks like 32-bit ids read as uint16 (data.dtype): every other value is 0"),
    ("i64", "looks like 64-bit ids read as uint16"),
    ("meta-dtype", "holds uint32 ids (" ),
    ("meta-vocab", "comes from a tokenizer of 1000 ids"),
]


@pytest.mark.slow
def test_token_files_are_checked_before_step_one(tmp_path):
    root, path = token_dirs(), spec()
    program = mr.build(path, "single") / "train.py"
    base = ["--steps", "1", "--checkpoint-dir", ""]
    jobs = [(str(program), name, [*base, "--data", str(root / name / "train.bin")]) for name, _ in TOKEN_CASES]
    jobs.append((str(program), "good", base))  # the spec's own path
    p = run_process([jr.PY, "-c", DRIVER, json.dumps(jobs)], tmp_path, jr.env_for())
    assert p.returncode == 0, p.stderr[-3000:]
    results = {r["name"]: r for r in json.loads(p.stdout.splitlines()[-1])}
    assert results["good"]["code"] == 0 and "step 1/" in results["good"]["stdout"], results["good"]["stderr"]
    lines = {}
    for name, says in TOKEN_CASES:
        r = results[name]
        assert r["code"] == 2, f"{name}: exit {r['code']}\n{r['stderr'][-3000:]}"
        lines[name] = one_line(r["stderr"])
        assert lines[name].startswith("error: --data: ") and says in lines[name], lines[name]
    assert "set data.dtype: uint32" in lines["meta-dtype"]
    assert "data prepare --tokenizer MODEL_DIR" in lines["meta-vocab"]
    # the spec's own path: named as such, not as a flag nobody gave
    # (written after the build: `validate` refuses the spec while the file is there)
    bad = path.with_name("gpt-bad.yaml")
    bad.write_text(GPT.replace("good/train.bin", "later/train.bin"))
    program = mr.build(bad, "single") / "train.py"
    (root / "later").mkdir(exist_ok=True)
    (root / "later" / "train.bin").write_bytes((root / "npy" / "train.bin").read_bytes())
    p = run_process([jr.PY, "-c", DRIVER, json.dumps([(str(program), "spec path", base)])], tmp_path, jr.env_for())
    r = json.loads(p.stdout.splitlines()[-1])[0]
    assert r["code"] == 2 and one_line(r["stderr"]).startswith("error: data.path (the spec's): "), r["stderr"]
    # a masked build: --data replaces the ids, not the mask; the refusal says so (not "prepare both", which
    # the user did), and --help says what --data's default is (not a constant's name)
    masked = path.with_name("gpt-masked.yaml")
    masked.write_text(GPT.replace("good/train.bin", "masked/train.bin, mask: masked/train.mask"))
    program = mr.build(masked, "single") / "train.py"
    jobs = [(str(program), "other ids", [*base, "--data", str(root / "good" / "train.bin")]),
            (str(program), "its own", base), (str(program), "help", ["--help"])]
    p = run_process([jr.PY, "-c", DRIVER, json.dumps(jobs)], tmp_path, jr.env_for())
    r = {x["name"]: x for x in json.loads(p.stdout.splitlines()[-1])}
    assert r["its own"]["code"] == 0, r["its own"]["stderr"][-3000:]
    line = one_line(r["other ids"]["stderr"])
    assert r["other ids"]["code"] == 2 and line.startswith("error: data.mask (the spec's): ") and (
        "holds 300 byte(s), not one per id of" in line and "--data replaces data.path, not data.mask" in line), line
    assert "(default: the spec's data.path, data.py's DATA_PATH)" in " ".join(r["help"]["stdout"].split())
    jr.report("token checks", lines=lines)


def test_validate_checks_a_token_file_that_is_there(capsys):
    root, path = token_dirs(), spec()
    assert cli_run(capsys, "validate", path)[0] == 0
    for name, says in (("npy", "is a .npy file"), ("meta-dtype", "holds uint32 ids"),
                       ("meta-vocab", "comes from a tokenizer of 1000 ids")):
        rc, _out, err = cli_run(capsys, "validate", path, "--set", f"data.path={root / name / 'train.bin'}")
        assert rc == 1 and "error[E013]" in err and says in err, (name, err)
    rc, _out, err = cli_run(capsys, "validate", path, "--set", f"data.path={root / 'meta-dtype' / 'train.bin'}",
                            "--set", "+data.dtype=uint32")
    assert rc == 0, err


def tiny_llama(directory: Path, layers: int):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


@pytest.mark.slow
def test_hf_checkpoints_of_another_model_and_every_parameter_source(tmp_path, capsys):
    two, three = tiny_llama(WORK / "llama2", 2), tiny_llama(WORK / "llama3", 3)
    spec = WORK / "llama2.yaml"
    # import hf: the directory, its config.json, or a weights file beside it give the same spec
    for i, given in enumerate((two, two / "config.json", two / "model.safetensors")):
        rc, _out, err = cli_run(capsys, "import", "hf", given, "-o", WORK / f"imported{i}.yaml", "--seq", "16")
        assert rc == 0, (given, err)
    assert len({(WORK / f"imported{i}.yaml").read_text() for i in range(3)}) == 1
    (tmp_path / "weights.bin").write_bytes(b"\x80\x02\xff\xfe not a config")
    rc, _out, err = cli_run(capsys, "import", "hf", tmp_path / "weights.bin", "-o", tmp_path / "x.yaml")
    assert rc == 2 and err.count("\n") == 1 and "without a config.json beside it" in err, err
    (tmp_path / "config.json").write_bytes(b"\x80\x02\xff\xfe")
    rc, _out, err = cli_run(capsys, "import", "hf", tmp_path / "config.json", "-o", tmp_path / "x.yaml")
    assert rc == 2 and err.count("\n") == 1 and "not UTF-8 text" in err, err
    spec.write_text((WORK / "imported0.yaml").read_text())
    program = mr.build(spec, "data=1") / "train.py"
    base = ["--steps", "0", "--checkpoint-dir", ""]
    ckpt, exported = tmp_path / "ckpt", tmp_path / "exported"
    jobs = [(str(program), "two", [*base, "--init-params", str(two), "--export-hf", str(exported)]),
            (str(program), "three", [*base, "--init-params", str(three)]),
            (str(program), "save", ["--steps", "1", "--checkpoint-dir", str(ckpt), "--init-params", str(two)]),
            # a resumed run (as a restart passes the first run's flags again) does not read --init-params
            (str(program), "resume", ["--steps", "2", "--checkpoint-dir", str(ckpt), "--resume", "auto",
                                      "--init-params", str(two)])]
    p = run_process([jr.PY, "-c", DRIVER, json.dumps(jobs)], tmp_path, jr.env_for())
    assert p.returncode == 0, p.stderr[-3000:]
    r = {x["name"]: x for x in json.loads(p.stdout.splitlines()[-1])}
    assert r["two"]["code"] == 0, r["two"]["stderr"]
    assert f"wrote {exported} (config.json, model.safetensors: " in r["two"]["stdout"], r["two"]["stdout"]
    assert r["save"]["code"] == 0 and "parameters: loaded from" in r["save"]["stdout"], r["save"]["stderr"]
    assert r["resume"]["code"] == 0 and "parameters: loaded from" not in r["resume"]["stdout"], r["resume"]
    assert f"note: --init-params {two} not read: the run continues from the checkpoint of --resume {ckpt}" in (
        r["resume"]["stdout"]), r["resume"]["stdout"]
    line = one_line(r["three"]["stderr"])
    assert r["three"]["code"] == 2 and "not this model's checkpoint" in line, line
    assert "model.layers.2.input_layernorm.weight (extra)" in line, line
    # generate.py takes the model directory train.py --init-params takes (PyTorch: MLX has no generate.py)
    import torch_runs as tr

    out = tr.build(spec, "data=1")
    g = subprocess.run([jr.PY, str(out / "generate.py"), "--params", str(two), "--prompt-ids", "1,2,3",
                        "--max-new-tokens", "4", "--temperature", "0", "--json"], capture_output=True, text=True,
                       env=tr.env_for(), timeout=300, check=False)
    assert g.returncode == 0, g.stderr[-3000:]
    assert len(json.loads(g.stdout.splitlines()[-1])["new_ids"]) == 4
    readme = (out / "README.md").read_text()
    assert "`--export-hf DIR`" in readme and "`--logits FILE.npy`" in readme
