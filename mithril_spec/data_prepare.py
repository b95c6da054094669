"""`mithril-spec data prepare`: text files -> a byte-level BPE tokenizer and token files for `kind: tokens`.

Offline and deterministic: the tokenizer is trained with the `tokenizers` library on the given files (read
in sorted order), every document is encoded and followed by the end-of-text token, and the token stream is
split: its last `val_fraction` becomes val.bin, the rest train.bin (flat little-endian uint16, or uint32
for vocabularies over 65,536 ids: nanoGPT's format). DIR also gets tokenizer.json and data.json (counts).
"""

from __future__ import annotations

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


def prepare(paths: list[str], vocab: int, out: Path, val_fraction: float = 0.1) -> Prepared:
    if not 257 <= vocab <= MAX_VOCAB:
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
    docs = _documents(input_files(paths))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    eot = tok.token_to_id(EOT)
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids += enc.ids
        ids.append(eot)
    real_vocab = tok.get_vocab_size()
    dtype = "uint16" if real_vocab <= 1 << 16 else "uint32"
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
    write_atomic(out / "tokenizer.json", tok.to_str() + "\n")
    meta = {"vocab": real_vocab, "dtype": dtype, "eot": eot, "documents": len(docs),
            "train_tokens": int(len(tokens) - n_val), "val_tokens": int(n_val)}
    write_atomic(out / "data.json", json.dumps(meta, indent=2) + "\n")
    return Prepared(real_vocab, dtype, len(docs), meta["train_tokens"], n_val, out)


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write: {e.strerror or e}") from None
