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
import re
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
    empty_files: int = 0  # input files left out: they hold no text


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


def _read_text(f: Path) -> str:
    """The file's text (UTF-8; a byte-order mark at its start, as Windows editors write it, is not text)."""
    try:
        return f.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"{f}: not UTF-8 text") from None
    except OSError as e:
        raise UsageError(f"{f}: cannot read: {e.strerror or e}") from None


def _documents(files: list[Path]) -> tuple[list[str], int]:
    """The files' texts, and how many files were left out for holding no text (only whitespace)."""
    docs = [text for text in map(_read_text, files) if text.strip()]
    if not docs:
        raise UsageError("the input files hold no text")
    return docs, len(files) - len(docs)


def tokenizer_file(raw: str) -> Path:
    """The tokenizer.json of `--tokenizer`: a model directory holding one, or the file itself."""
    p = Path(raw)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise UsageError(f"--tokenizer {raw}: no {f} (give a model directory with a tokenizer.json, or the file; "
                         "a tokenizer saved by transformers' save_pretrained has one)")
    return f


def _eos(tok, f: Path) -> int | None:
    """The model's end-of-sequence id: tokenizer_config.json's eos_token, else config.json's eos_token_id
    (the first of a list), else a usual end-of-text token of the vocabulary; None when there is none. A
    configured one that the tokenizer lacks is refused (the files beside tokenizer.json are of another
    tokenizer): encoding with another token would teach the model a stop it never emits."""
    vocab = tok.get_vocab_size()
    for cfg, key in (("tokenizer_config.json", "eos_token"), ("config.json", "eos_token_id")):
        try:
            v = json.loads((f.parent / cfg).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, list) and v:
            v = v[0]
        if isinstance(v, int) and not isinstance(v, bool):
            if not 0 <= v < vocab:
                raise UsageError(f"{f.parent / cfg}: {key} {v} is not an id of {f} ({vocab:,} ids): the files "
                                 "beside it are of another tokenizer; give the model's own tokenizer.json")
            return v
        if isinstance(v, str) and v:
            i = tok.token_to_id(v)
            if i is None:
                raise UsageError(f"{f.parent / cfg}: {key} {v!r} is not a token of {f}: add it to the tokenizer "
                                 "(tokenizer.add_special_tokens) or give the model's own tokenizer.json")
            return i
    for name in (EOT, "</s>", "<|end_of_text|>", "<|im_end|>", "[SEP]"):
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
    docs, empty = _documents(input_files(paths))
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
    return _write_split(out, tok, source, ids, None, eot, len(docs), val_fraction, "the input files give",
                        empty_files=empty)


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
    return Prepared(vocab, dtype, documents, meta["train_tokens"], n_val, out, extra.get("empty_files", 0))


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


SHAPES = {"chat": '{"messages": [{"role": ..., "content": ...}, ...]}',
          "prompt-response": '{"prompt": ..., "response": ...} (or "completion")'}
RESPONSE_KEYS = ("response", "completion")  # prompt-response: the answer's key (TRL's prompt-completion names it so)


def _kind(value) -> str:
    """A JSON value's type, as a message names it."""
    if value is None:
        return "null"
    for t, name in ((bool, "a boolean"), (str, "a string"), (int, "a number"), (float, "a number"),
                    (list, "a list"), (dict, "an object")):
        if isinstance(value, t):
            return name
    return type(value).__name__


def _not_shape(where: str, fmt: str, what: str, row) -> UsageError:
    """One line: the line's problem, what the format reads, and (for an object of other keys) its keys and the
    format that reads them."""
    keys = f" (its keys: {', '.join(map(str, row))})" if isinstance(row, dict) and row else ""
    other = next((f for f, ks in (("chat", {"messages"}), ("prompt-response", {"prompt", *RESPONSE_KEYS}))
                  if f != fmt and isinstance(row, dict) and ks & set(row)), None)
    hint = f"; --format {other} reads {SHAPES[other]}" if other else ""
    return UsageError(f"{where}: {what}{keys}: --format {fmt} reads {SHAPES[fmt]} per line{hint}")


def _string(row: dict, key: str, where: str, fmt: str, context: str = "") -> str:
    value = row.get(key)
    if isinstance(value, str):
        return value
    if key not in row:
        raise _not_shape(where, fmt, f'{context}no "{key}"', row)
    parts = " (content parts are not read: join their text into one string)" if isinstance(value, list) else ""
    raise UsageError(f'{where}: {context}"{key}" is {_kind(value)}, not a string{parts}')


def _messages(row, where: str, fmt: str) -> list[dict]:
    """One line's conversation: its messages (chat), or the prompt and the response as a user message and the
    assistant's (prompt-response)."""
    if not isinstance(row, dict):
        raise _not_shape(where, fmt, f"{_kind(row)}, not a JSON object", row)
    if fmt == "prompt-response":
        answers = [k for k in RESPONSE_KEYS if k in row]
        if len(answers) > 1:
            raise UsageError(f'{where}: both "response" and "completion": give the answer once')
        prompt = _string(row, "prompt", where, fmt)
        response = _string(row, answers[0] if answers else "response", where, fmt)
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    msgs = row.get("messages")
    if "messages" not in row:
        raise _not_shape(where, fmt, 'no "messages"', row)
    if not isinstance(msgs, list) or not msgs:
        raise UsageError(f'{where}: "messages" is {_kind(msgs) if msgs != [] else "empty"}: --format chat reads '
                         f"{SHAPES['chat']}")
    for i, m in enumerate(msgs, 1):
        if not isinstance(m, dict):
            raise UsageError(f'{where}: message {i} is {_kind(m)}, not {{"role": ..., "content": ...}}')
        for key in ("role", "content"):
            _string(m, key, where, fmt, f"message {i}: ")
    if not any(m["role"] == "assistant" for m in msgs):
        roles = ", ".join(dict.fromkeys(m["role"] for m in msgs))
        raise UsageError(f'{where}: no "assistant" message (roles: {roles}): nothing for the loss to count')
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def _examples(path: str, fmt: str) -> list[tuple[str, list[dict]]]:
    """The JSONL file's examples, each as (`path:line`, its chat messages): `{"messages": [{"role", "content"}, ...]}` per line (chat),
    or `{"prompt", "response"}` (prompt-response: a user message, then the assistant's). Lines are split at
    `\n` alone (JSON strings may hold U+2028 and other characters str.splitlines() would break at); blank lines
    are no examples."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{path}: a directory: --format {fmt} reads one JSONL file (one JSON object per line)")
    if not p.is_file():
        raise UsageError(f"{path}: no such file (--format {fmt} reads one JSON object per line)")
    out = []
    for n, line in enumerate(_read_text(p).split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            array = " (the file is one JSON array: write one object per line)" if n == 1 and line.lstrip()[:1] == "[" else ""
            raise UsageError(f"{path}:{n}: not a JSON object ({e.msg}){array}") from None
        out.append((f"{path}:{n}", _messages(row, f"{path}:{n}", fmt)))
    if not out:
        raise UsageError(f"{path}: no examples (the file is empty or blank)")
    return out


def _chat_template(f: Path):
    """tokenizer_config.json's chat_template (a Jinja template, rendered as transformers renders it) and the
    special tokens that file names (bos/eos/unk/pad, additional_special_tokens, added_tokens_decoder's
    special ones); None when there is none."""
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
    try:
        template = env.from_string(tpl)
    except TemplateError as e:
        raise UsageError(f"{f.parent / 'tokenizer_config.json'}: chat_template is not a Jinja template "
                         f"({' '.join(str(e).split())[:200]})") from None

    def content(v):
        v = v.get("content", "") if isinstance(v, dict) else v
        return v if isinstance(v, str) else ""

    special = {k: content(cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    extra = cfg.get("additional_special_tokens")
    added = cfg.get("added_tokens_decoder")
    named = [*special.values(), *map(content, extra if isinstance(extra, list) else []),
             *(content(v) for v in (added.values() if isinstance(added, dict) else []) if isinstance(v, dict)
               and v.get("special"))]

    def render(messages, gen):
        return template.render(messages=messages, add_generation_prompt=gen, **special)

    return render, tuple(dict.fromkeys(t for t in named if t))


MARKUP = re.compile(r"<\|[^\s|<>]{1,64}\|>")  # <|im_start|>, <|eot_id|>, ...: special tokens by their look


def _unheld_markup(tok, text: str, messages: list[dict], specials: tuple[str, ...], checked: set[str]) -> str | None:
    """The first special token the rendered example writes (a string of tokenizer_config.json's special tokens,
    or one that looks like `<|...|>`) outside its messages' contents that the tokenizer does not encode as one
    token; None when it holds them all. `checked`: the strings already found held (updated)."""
    contents = [m["content"] for m in messages]
    for m in sorted({*MARKUP.findall(text), *(t for t in specials if t in text)} - checked):
        if text.count(m) <= sum(c.count(m) for c in contents):
            continue  # only inside the contents: the user's text, not the template's markup
        i = tok.token_to_id(m)
        if i is None or tok.encode(m, add_special_tokens=False).ids != [i]:
            return m
        checked.add(m)
    return None


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
    render, specials = _chat_template(source) or (_plain, ())
    ids: list[int] = []
    mask: list[int] = []
    held: set[str] = set()
    for where, messages in examples:
        try:
            i, m = encode_example(tok, render, messages)
            text = render(messages, False)
        except Exception as e:  # noqa: BLE001 - the chat template's own errors
            raise UsageError(f"{where}: the chat template fails ({' '.join(str(e).split())[:200]})") from None
        if (lost := _unheld_markup(tok, text, messages, specials, held)) is not None:
            raise UsageError(f"--tokenizer {tokenizer}: the chat template writes {lost!r}, which {source} does not "
                             "hold as one token (it would be trained as ordinary text): add it to the tokenizer "
                             "(tokenizer.add_special_tokens) or give the model's own tokenizer.json")
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
