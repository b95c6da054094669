"""`mithril-spec data prepare`: text files -> token files for `kind: tokens`.

Offline and deterministic: the tokenizer is trained (byte-level BPE) with the `tokenizers` library on the
given files (read in sorted order), or with `--tokenizer MODEL_DIR` the model's own `tokenizer.json` is
used as it is (no training). Every document is encoded and followed by the end-of-text token, and the token
stream is split: its last `val_fraction` becomes val.bin, the rest train.bin (flat little-endian uint16, or
uint32 for vocabularies over 65,536 ids: nanoGPT's format). DIR also gets tokenizer.json and data.json: the
metadata the programs and `validate` check the spec against (dtype, vocabulary, the tokenizer's sha256,
token counts).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .atomic import OutputError, write_atomic
from .planner.mesh import UsageError

EOT = "<|endoftext|>"
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".yaml", ".yml", ".toml", ".json", ".j2", ".html", ".csv")
MAX_VOCAB = 1 << 24


@dataclass(frozen=True)
class Prepared:
    vocab: int
    dtype: str
    documents: int
    train_tokens: int
    val_tokens: int
    out: Path


def input_files(paths: list[str]) -> list[Path]:
    """The files to read: each file given, and every text file (by suffix) under each directory, sorted."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES
                           and not any(part.startswith(".") for part in f.relative_to(p).parts))
            if not found:
                raise UsageError(f"{raw}: no text files ({', '.join(TEXT_SUFFIXES)}) in this directory")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise UsageError(f"{raw}: no such file or directory")
    return out


def _documents(files: list[Path]) -> list[str]:
    docs = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{f}: not UTF-8 text") from None
        except OSError as e:
            raise UsageError(f"{f}: cannot read: {e.strerror or e}") from None
        if text.strip():
            docs.append(text)
    if not docs:
        raise UsageError("the input files hold no text")
    return docs


def tokenizer_file(raw: str) -> Path:
    """The tokenizer.json of `--tokenizer`: a model directory holding one, or the file itself."""
    p = Path(raw)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise UsageError(f"--tokenizer {raw}: no {f} (give a model directory with a tokenizer.json, or the file; "
                         "a tokenizer saved by transformers' save_pretrained has one)")
    return f


def _eos(tok, f: Path) -> int | None:
    """The model's end-of-sequence id: tokenizer_config.json's eos_token, config.json's eos_token_id, or a
    usual end-of-text token of the vocabulary; None when there is none."""
    names = []
    for cfg, key in (("tokenizer_config.json", "eos_token"), ("config.json", "eos_token_id")):
        try:
            v = json.loads((f.parent / cfg).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, list) and v:
            v = v[0]
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < tok.get_vocab_size():
            return v
        if isinstance(v, str):
            names.append(v)
    for name in [*names, EOT, "</s>", "<|end_of_text|>", "<|im_end|>", "[SEP]"]:
        i = tok.token_to_id(name)
        if i is not None:
            return i
    return None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare(paths: list[str], vocab: int | None, out: Path, val_fraction: float = 0.1,
            tokenizer: str | None = None) -> Prepared:
    if tokenizer is not None and vocab is not None:
        raise UsageError("--vocab and --tokenizer: give one (--tokenizer encodes with the model's own vocabulary)")
    if tokenizer is None and vocab is None:
        raise UsageError("give --vocab N (train a byte-level BPE tokenizer) or --tokenizer MODEL_DIR (the model's own)")
    if tokenizer is None and not 257 <= vocab <= MAX_VOCAB:
        raise UsageError(f"--vocab {vocab}: a byte-level BPE vocabulary holds 257 to {MAX_VOCAB:,} ids "
                         "(256 bytes and the end-of-text token at least)")
    if not 0 < val_fraction < 1:
        raise UsageError(f"--val-fraction {val_fraction}: between 0 and 1 (exclusive)")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: exists and is not a directory")
    try:
        import numpy as np
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as e:
        raise UsageError(f"`data prepare` needs numpy and tokenizers ({e.name} is missing): "
                         "pip install 'mithril-spec[data]'") from None
    source = tokenizer_file(tokenizer) if tokenizer is not None else None
    docs = _documents(input_files(paths))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if source is None:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(docs, trainer=trainer)
        eot = tok.token_to_id(EOT)
    else:
        tok = load_tokenizer(source)
        eot = _eos(tok, source)
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids += enc.ids
        if eot is not None:
            ids.append(eot)
    real_vocab = tok.get_vocab_size()
    dtype = id_dtype(real_vocab)
    tokens = np.asarray(ids, dtype="<u2" if dtype == "uint16" else "<u4")  # little-endian, as nanoGPT writes
    n_val = max(1, int(len(tokens) * val_fraction))
    if len(tokens) - n_val < 2:
        raise UsageError(f"the input files give {len(tokens)} tokens: too few to hold out {val_fraction:.0%}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{out}: cannot create it: {e.strerror or e}") from None
    _write_bytes(out / "train.bin", tokens[:-n_val].tobytes())
    _write_bytes(out / "val.bin", tokens[-n_val:].tobytes())
    if source is None:
        write_atomic(out / "tokenizer.json", tok.to_str() + "\n")
    elif source.resolve() != (out / "tokenizer.json").resolve():
        _write_bytes(out / "tokenizer.json", source.read_bytes())  # the model's file, byte for byte
    meta = {"vocab": real_vocab, "dtype": dtype, "eot": eot, "documents": len(docs),
            "train_tokens": int(len(tokens) - n_val), "val_tokens": int(n_val),
            "tokenizer": "trained" if source is None else str(source.resolve()),
            "tokenizer_sha256": sha256(out / "tokenizer.json")}
    write_atomic(out / "data.json", json.dumps(meta, indent=2) + "\n")
    return Prepared(real_vocab, dtype, len(docs), meta["train_tokens"], n_val, out)


def id_dtype(vocab: int) -> str:
    """The token files' integer type for a vocabulary of `vocab` ids."""
    return "uint16" if vocab <= 1 << 16 else "uint32"


def load_tokenizer(f: Path):
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # noqa: BLE001 - the library raises its own exception types
        raise UsageError(f"--tokenizer {f}: not a tokenizers tokenizer.json ({' '.join(str(e).split())[:200]})") from None


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write: {e.strerror or e}") from None
