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
        import numpy  # noqa: F401 - (here for the message below; _write_split uses it)
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
    return _write_split(out, tok, source, ids, None, eot, len(docs), val_fraction, "the input files give")


def _write_split(out: Path, tok, source: Path | None, ids: list[int], mask: list[int] | None, eot: int | None,
                 documents: int, val_fraction: float, what: str, **extra) -> Prepared:
    """train.bin / val.bin (the last `val_fraction` held out; with `mask`, train.mask / val.mask beside them),
    tokenizer.json (trained: written; the model's: copied byte for byte) and data.json, the metadata the
    programs and `validate` check the files against (dtype, vocabulary, tokenizer hash, counts)."""
    import numpy as np

    vocab = tok.get_vocab_size()
    dtype = id_dtype(vocab)
    tokens = np.asarray(ids, dtype="<u2" if dtype == "uint16" else "<u4")  # little-endian, as nanoGPT writes
    n_val = max(1, int(len(tokens) * val_fraction))
    if len(tokens) - n_val < 2:
        raise UsageError(f"{what} {len(tokens)} tokens: too few to hold out {val_fraction:.0%}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{out}: cannot create it: {e.strerror or e}") from None
    _write_bytes(out / "train.bin", tokens[:-n_val].tobytes())
    _write_bytes(out / "val.bin", tokens[-n_val:].tobytes())
    if mask is not None:
        weights = np.asarray(mask, dtype=np.uint8)
        _write_bytes(out / "train.mask", weights[:-n_val].tobytes())
        _write_bytes(out / "val.mask", weights[-n_val:].tobytes())
        extra.update(train_counted=int(weights[:-n_val].sum()), val_counted=int(weights[-n_val:].sum()))
    if source is None:
        write_atomic(out / "tokenizer.json", tok.to_str() + "\n")
    elif source.resolve() != (out / "tokenizer.json").resolve():
        _write_bytes(out / "tokenizer.json", source.read_bytes())  # the model's file, byte for byte
    meta = {"vocab": vocab, "dtype": dtype, "eot": eot, "documents": documents,
            "train_tokens": int(len(tokens) - n_val), "val_tokens": int(n_val),
            "tokenizer": "trained" if source is None else str(source.resolve()),
            "tokenizer_sha256": sha256(out / "tokenizer.json"), **extra}
    write_atomic(out / "data.json", json.dumps(meta, indent=2) + "\n")
    return Prepared(vocab, dtype, documents, meta["train_tokens"], n_val, out)


def id_dtype(vocab: int) -> str:
    """The token files' integer type for a vocabulary of `vocab` ids."""
    return "uint16" if vocab <= 1 << 16 else "uint32"


def load_tokenizer(f: Path):
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # noqa: BLE001 - the library raises its own exception types
        raise UsageError(f"--tokenizer {f}: not a tokenizers tokenizer.json ({' '.join(str(e).split())[:200]})") from None


FORMATS = ("text", "chat", "prompt-response")


def _examples(path: str, fmt: str) -> list[list[dict]]:
    """The JSONL file's examples as chat messages: `{"messages": [{"role", "content"}, ...]}` per line (chat),
    or `{"prompt", "response"}` (prompt-response: a user message, then the assistant's)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such file (--format {fmt} reads one JSON object per line)")
    out = []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise UsageError(f"{path}:{n}: not a JSON object ({e.msg})") from None
        if fmt == "chat":
            msgs = row.get("messages") if isinstance(row, dict) else None
            ok = isinstance(msgs, list) and msgs and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs)
            if not ok:
                raise UsageError(f'{path}:{n}: --format chat needs {{"messages": [{{"role": ..., "content": ...}}, ...]}}')
        else:
            ok = isinstance(row, dict) and isinstance(row.get("prompt"), str) and isinstance(row.get("response"), str)
            if not ok:
                raise UsageError(f'{path}:{n}: --format prompt-response needs {{"prompt": "...", "response": "..."}}')
            msgs = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["response"]}]
        if not any(m["role"] == "assistant" for m in msgs):
            raise UsageError(f"{path}:{n}: no assistant message: nothing for the loss to count")
        out.append(msgs)
    if not out:
        raise UsageError(f"{path}: no examples")
    return out


def _chat_template(f: Path):
    """tokenizer_config.json's chat_template (a Jinja template, rendered as transformers renders it), its
    special tokens; None when there is none."""
    try:
        cfg = json.loads((f.parent / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    tpl = cfg.get("chat_template") if isinstance(cfg, dict) else None
    if isinstance(tpl, list):  # named templates: the default one
        tpl = next((t.get("template") for t in tpl if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(tpl, str):
        return None
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(tpl)

    def token(key):
        v = cfg.get(key)
        return v.get("content", "") if isinstance(v, dict) else (v or "")

    special = {k: token(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    return lambda messages, gen: template.render(messages=messages, add_generation_prompt=gen, **special)


def _plain(messages: list[dict], gen: bool) -> str:
    """The format without a chat template: `role: content` lines; with `gen`, the assistant's `assistant: `."""
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + ("assistant: " if gen else "")


def encode_example(tok, render, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(ids, mask) of one conversation: its text rendered whole, encoded without the tokenizer's own special
    tokens (the template writes them); an id counts (mask 1) when its text overlaps an assistant message's
    span: from the end of the text before it (with the generation prompt) to the end of the text with it (a
    token that straddles the span's start, ` hello` after `assistant:`, counts)."""
    text = render(messages, False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            start, end = len(render(messages[:i], True)), len(render(messages[: i + 1], False))
            spans.append((start, end))
    enc = tok.encode(text, add_special_tokens=False)
    mask = [int(any(s < b and e > a for a, b in spans)) for s, e in enc.offsets]
    return list(enc.ids), mask


def prepare_instructions(path: str, fmt: str, tokenizer: str, out: Path, val_fraction: float = 0.1) -> Prepared:
    """`data prepare --format chat|prompt-response FILE.jsonl --tokenizer MODEL_DIR`: every example encoded
    (the model's chat template, or `role: content` lines), followed by the end-of-sequence token (unless the
    template already ended it with that token: one, not two), packed one after the other; beside train.bin / val.bin, train.mask / val.mask: one uint8 per id, 1 where the loss
    counts predicting it (the assistant's tokens and the end-of-sequence token after them)."""
    if not 0 < val_fraction < 1:
        raise UsageError(f"--val-fraction {val_fraction}: between 0 and 1 (exclusive)")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: exists and is not a directory")
    try:
        import numpy  # noqa: F401 - (here for the message below; _write_split uses it)
    except ImportError as e:
        raise UsageError(f"`data prepare` needs numpy and tokenizers ({e.name} is missing)") from None
    source = tokenizer_file(tokenizer)
    examples = _examples(path, fmt)
    tok = load_tokenizer(source)
    eot = _eos(tok, source)
    if eot is None:
        raise UsageError(f"--tokenizer {tokenizer}: no end-of-sequence token to separate the examples (set "
                         "eos_token in tokenizer_config.json)")
    render = _chat_template(source) or _plain
    ids: list[int] = []
    mask: list[int] = []
    for n, messages in enumerate(examples, 1):
        try:
            i, m = encode_example(tok, render, messages)
        except Exception as e:  # noqa: BLE001 - the chat template's own errors
            raise UsageError(f"{path}: example {n}: the chat template fails ({' '.join(str(e).split())[:200]})") from None
        if not i or i[-1] != eot:  # a template that ends each turn with it (Llama 3's <|eot_id|>) wrote it
            i, m = [*i, eot], [*m, 1]
        ids += i
        mask += m
    return _write_split(out, tok, source, ids, mask, eot, len(examples), val_fraction, f"{path}:",
                        format=fmt, chat_template=render is not _plain)


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write: {e.strerror or e}") from None
