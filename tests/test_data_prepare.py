"""`mithril-spec data prepare`: a byte-level BPE tokenizer trained offline, and the token files that
`data: {kind: tokens}` reads (docs/spec.md "Data")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from program_files import program_text
from test_cli import run
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
TEXTS = {
    "a.txt": "The quick brown fox jumps over the lazy dog. " * 40,
    "sub/b.md": "# Notes\n\nSharding splits a tensor over the devices of a mesh axis.\n" * 30,
    "sub/c.py": "def f(x):\n    return x * 2  # doubles\n" * 30,
    "sub/.hidden/skip.txt": "never read",
    "sub/image.png": "not text by suffix",
}


def corpus(tmp_path):
    root = tmp_path / "corpus"
    for name, text in TEXTS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_prepare_writes_token_files_that_decode_to_the_inputs(tmp_path, capsys):
    root = corpus(tmp_path)
    rc, out, err = run(capsys, "data", "prepare", root, "--vocab", "300", "-o", tmp_path / "d")
    assert rc == 0, err
    assert "3 document(s)" in out and "kind: tokens" in out
    meta = json.loads((tmp_path / "d" / "data.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab"] <= 300 and meta["documents"] == 3
    train = np.fromfile(tmp_path / "d" / "train.bin", dtype="<u2")
    val = np.fromfile(tmp_path / "d" / "val.bin", dtype="<u2")
    assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"])
    assert abs(len(val) / (len(train) + len(val)) - 0.1) < 0.01
    assert int(max(train.max(), val.max())) < meta["vocab"]
    tok = Tokenizer.from_file(str(tmp_path / "d" / "tokenizer.json"))
    stream = np.concatenate([train, val]).tolist()
    eot = meta["eot"]
    docs, cur = [], []
    for i in stream:
        if i == eot:
            docs.append(tok.decode(cur))
            cur = []
        else:
            cur.append(i)
    # sorted file order, every document followed by the end-of-text token; hidden and non-text files skipped
    assert docs == [TEXTS["a.txt"], TEXTS["sub/b.md"], TEXTS["sub/c.py"]]
    # BPE merged something: fewer tokens than bytes
    assert len(stream) < 0.8 * sum(len(t) for t in docs)


def test_prepare_is_deterministic(tmp_path, capsys):
    root = corpus(tmp_path)
    for out in ("x", "y"):
        assert run(capsys, "data", "prepare", root, "--vocab", "280", "-o", tmp_path / out)[0] == 0
    for f in ("train.bin", "val.bin", "tokenizer.json", "data.json"):
        assert (tmp_path / "x" / f).read_bytes() == (tmp_path / "y" / f).read_bytes(), f


def test_prepare_refuses_bad_input_in_one_line(tmp_path, capsys):
    root = corpus(tmp_path)
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00 not utf-8")
    (tmp_path / "afile").write_text("x")
    for argv, says in (
        ([tmp_path / "missing.txt", "--vocab", "300"], "no such file or directory"),
        ([root, "--vocab", "100"], "257 to"),
        ([root, "--vocab", "300", "--val-fraction", "1.5"], "between 0 and 1"),
        ([tmp_path / "bin.txt", "--vocab", "300"], "not UTF-8 text"),
        ([root, "--vocab", "300", "-o", tmp_path / "afile"], "is not a directory"),
    ):
        if "-o" not in argv:
            argv = [*argv, "-o", tmp_path / "out"]
        rc, _out, err = run(capsys, "data", "prepare", *argv)
        assert rc == 2 and says in err and err.count("\n") == 1, (argv, err)


def test_the_main_job_spec_builds_on_prepared_data(tmp_path, capsys):
    """examples/gpt-docs (scripts/main.sh): token data from `data prepare`, evaluation, generate.py."""
    spec = ROOT / "examples" / "gpt-docs" / "gpt-docs.yaml"
    data = tmp_path / "data"
    assert run(capsys, "data", "prepare", corpus(tmp_path), "--vocab", "300", "-o", data)[0] == 0
    settings = ["--set", f"data.path={data / 'train.bin'}", "--set", f"data.tokenizer={data / 'tokenizer.json'}",
                "--set", f"eval.path={data / 'val.bin'}"]
    rc, _out, err = run(capsys, "validate", spec, "--strict", *settings)
    assert rc == 0, err
    rc, _out, err = run(capsys, "validate", spec, "--set", f"data.path={tmp_path / 'nothing.bin'}")
    assert rc == 0 and "warning[W011]" in err  # missing data: a warning, not an error
    for target in ("jax", "torch"):
        rc, out, err = run(capsys, "build", spec, "--target", target, "-o", tmp_path / target, *settings)
        assert rc == 0, err
        assert "generate.py" in out
        config = program_text(tmp_path / target)
        assert repr(str(data / "train.bin")).replace("'", '"') in config  # the resolved path, absolute


def model_tokenizer(tmp_path, vocab=300, chat_template=None):
    """A model directory with its own tokenizer.json (a small BPE trained here: nothing is downloaded) and a
    tokenizer_config.json naming the end-of-sequence token, as transformers' save_pretrained writes them."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["Sharding splits a tensor over devices.", "hello world, hello model"] * 20, trainer=trainer)
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    tok.save(str(model / "tokenizer.json"))
    cfg = {"eos_token": "</s>", "bos_token": "<s>"}
    if chat_template:
        cfg["chat_template"] = chat_template
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    return model


def test_prepare_with_the_models_tokenizer_trains_nothing(tmp_path, capsys):
    root = corpus(tmp_path)
    model = model_tokenizer(tmp_path)
    rc, out, err = run(capsys, "data", "prepare", root, "--tokenizer", model, "-o", tmp_path / "d")
    assert rc == 0, err
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    eos = tok.token_to_id("</s>")
    want = []
    for name in ("a.txt", "sub/b.md", "sub/c.py"):
        want += tok.encode(TEXTS[name]).ids + [eos]
    meta = json.loads((tmp_path / "d" / "data.json").read_text())
    got = np.concatenate([np.fromfile(tmp_path / "d" / f, dtype="<u2") for f in ("train.bin", "val.bin")])
    assert got.tolist() == want
    assert meta["dtype"] == "uint16" and meta["vocab"] == tok.get_vocab_size() and meta["eot"] == eos
    assert (tmp_path / "d" / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
    import hashlib
    assert meta["tokenizer_sha256"] == hashlib.sha256((model / "tokenizer.json").read_bytes()).hexdigest()
    # the trained path records the same metadata
    assert run(capsys, "data", "prepare", root, "--vocab", "300", "-o", tmp_path / "e")[0] == 0
    assert {"dtype", "vocab", "tokenizer_sha256", "train_tokens", "val_tokens"} <= set(
        json.loads((tmp_path / "e" / "data.json").read_text()))
    # a file given directly works too; both flags, or neither, is refused in one line
    assert run(capsys, "data", "prepare", root, "--tokenizer", model / "tokenizer.json", "-o", tmp_path / "f")[0] == 0
    for argv, says in ((["--vocab", "300", "--tokenizer", model], "give one"), ([], "give --vocab"),
                       (["--tokenizer", tmp_path], "no ")):
        rc, _out, err = run(capsys, "data", "prepare", root, *argv, "-o", tmp_path / "g")
        assert rc == 2 and says in err and err.count("\n") == 1, (argv, err)


def test_prepare_picks_uint32_for_a_large_vocabulary(tmp_path, capsys):
    from tokenizers import models

    vocab = {f"t{i}": i for i in range(70000)}
    vocab["</s>"] = 70000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    from tokenizers import pre_tokenizers
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    model = tmp_path / "big"
    model.mkdir()
    tok.save(str(model / "tokenizer.json"))
    (tmp_path / "in.txt").write_text(" ".join(f"t{i}" for i in range(0, 70000, 997)) + " t69999")
    rc, _out, err = run(capsys, "data", "prepare", tmp_path / "in.txt", "--tokenizer", model, "-o", tmp_path / "d")
    assert rc == 0, err
    meta = json.loads((tmp_path / "d" / "data.json").read_text())
    assert meta["dtype"] == "uint32" and meta["vocab"] == 70001
    got = np.concatenate([np.fromfile(tmp_path / "d" / f, dtype="<u4") for f in ("train.bin", "val.bin")])
    assert got[-2:].tolist() == [69999, 70000]


def test_prepare_says_which_inputs_it_left_out(tmp_path, capsys):
    """A file of whitespace only is no document: the count of such files is printed and kept in data.json,
    not dropped silently. A byte-order mark (Windows editors write one) is not text: not encoded."""
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.txt").write_text("hello world, hello model\r\n" * 20, newline="")
    (root / "b.txt").write_text("\ufeffhello model", encoding="utf-8")
    (root / "empty.txt").write_text("\n \r\n")
    model = model_tokenizer(tmp_path)
    rc, out, err = run(capsys, "data", "prepare", root, "--tokenizer", model, "-o", tmp_path / "d")
    assert rc == 0, err
    assert out.startswith("2 document(s) (1 empty input file(s) left out):")
    meta = json.loads((tmp_path / "d" / "data.json").read_text())
    assert meta["documents"] == 2 and meta["empty_files"] == 1
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    ids = np.concatenate([np.fromfile(tmp_path / "d" / f, dtype="<u2") for f in ("train.bin", "val.bin")]).tolist()
    assert ids[-len(tok.encode("hello model").ids) - 1:-1] == tok.encode("hello model").ids
