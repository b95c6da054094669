"""`mithril-spec data prepare`: a byte-level BPE tokenizer trained offline, and the token files that
`data: {kind: tokens}` reads (docs/spec.md "Data")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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
        config = (tmp_path / target / "train.py").read_text()
        assert repr(str(data / "train.bin")).replace("'", '"') in config  # the resolved path, absolute
