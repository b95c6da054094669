"""generate.py's part that does not depend on the spec (docs/program.md "Sampling"): the command line, the
prompt (a tokenizers tokenizer.json, or UTF-8 bytes), the choice of each next token on the host (numpy,
float64: the same draws in every target), the loop over positions and the output. generate.py passes in
what its spec decided (the vocabulary, the context of SEQ positions, the tokenizer) and gives `step(token,
pos)`, the logits of the next position from its cached decode, and `full(ids)`, the logits of the
training program's forward pass over a whole sequence (--check)."""

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from .errors import require


def sampling_parser(about, seq, tokenizer, hf):
    """generate.py's command line (`about`: its description): the options every target shares; `seq`: the
    model's context, `tokenizer`: the spec's tokenizer.json (or ""), `hf`: whether --params also takes a
    transformers checkpoint (a spec imported from Hugging Face)."""
    # argparse %-formats a description that mentions %(prog): then a `%` in the file name is only text
    ap = argparse.ArgumentParser(
        description=about.replace("%", "%%") if "%(prog)" in about else about
    )
    ap.error = lambda message: require(False, f"{message} (generate.py --help lists the options)")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--resume",
        metavar="CKPT_DIR",
        help="the parameters of the newest usable checkpoint in this "
        "directory (train.py --checkpoint-dir), or of this checkpoint",
    )
    transformers = (
        ", or a transformers checkpoint (a model directory or a .safetensors file), as train.py "
        "--init-params takes it"
    )
    source.add_argument(
        "--params",
        "--init-params",
        dest="params",
        metavar="FILE",
        help="parameters by canonical name (.safetensors or .npz, as train.py --export-params writes "
        f"them){transformers if hf else ''}",
    )
    prompt = ap.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="the text to continue (default: the token id 0)")
    prompt.add_argument(
        "--prompt-ids", metavar="IDS", help="the token ids to continue, comma-separated: 1,2,3"
    )
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        default=seq,
        help="tokens to add (generation stops earlier when "
        "the sequence reaches the model's context of %(default)s tokens)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="divides the logits; 0: greedy, the most probable token (default: %(default)s)",
    )
    ap.add_argument(
        "--top-k",
        type=int,
        default=0,
        help="draw among the k most probable tokens only (0: all)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the draws (default: %(default)s)")
    spec = "the spec's, %(default)s; '' for " if tokenizer else ""
    ap.add_argument(
        "--tokenizer",
        default=tokenizer,
        metavar="tokenizer.json",
        help="a tokenizers tokenizer.json for the text of the prompt and the output (default: "
        f"{spec}one token per UTF-8 byte)",
    )
    ap.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (ids, text, timing) instead of the text",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="also run the training program's forward pass over the whole sequence and compare its "
        "most probable token at every position with the cached decode's",
    )
    return ap


def check_sampling(args, hf):
    """The command line's numbers and paths, checked before any work (`hf`: as for sampling_parser)."""
    require(args.max_new_tokens >= 0, "--max-new-tokens must be >= 0")
    require(
        math.isfinite(args.temperature) and args.temperature >= 0,
        "--temperature must be >= 0 (0: greedy)",
    )
    require(args.top_k >= 0, "--top-k must be >= 0 (0: every token)")
    if hf:
        require(
            not args.params or os.path.exists(args.params),
            f"--params {args.params}: no such file or directory",
        )
    else:
        why = "not a file" if os.path.exists(args.params or "") else "no such file"
        require(not args.params or os.path.isfile(args.params), f"--params {args.params}: {why}")
    require(
        not args.resume or os.path.exists(args.resume), f"--resume {args.resume}: no such directory"
    )
    return args


def load_tokenizer(path):
    """A tokenizers Tokenizer from tokenizer.json, or None (no path: one token per UTF-8 byte)."""
    if not path:
        return None
    require(os.path.isfile(path), f"--tokenizer {path}: no such file")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        require(
            False,
            f"--tokenizer {path}: reading it needs the `tokenizers` package (pip install tokenizers)",
        )
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # not a tokenizer.json
        require(
            False,
            f"--tokenizer {path}: cannot read it as a tokenizer.json ({' '.join(str(e).split())})",
        )


def encode_prompt(args, tokenizer, vocab, seq):
    """The prompt's token ids, checked against the vocabulary (ids below `vocab`) and the context of `seq`
    positions."""
    if args.prompt_ids is not None:
        try:
            ids = [int(t) for t in args.prompt_ids.split(",")]
        except ValueError:
            require(False, f"--prompt-ids {args.prompt_ids!r}: not comma-separated integers")
    elif args.prompt is not None:
        ids = tokenizer.encode(args.prompt).ids if tokenizer else list(args.prompt.encode())
    else:
        ids = [0]
    require(ids, "the prompt is empty: give at least one token")
    bad = [i for i in ids if not 0 <= i < vocab]
    require(not bad, f"the prompt's token ids {bad[:5]} lie outside the vocabulary 0..{vocab - 1}")
    require(
        len(ids) <= seq,
        f"the prompt holds {len(ids)} tokens, more than the model's context of {seq}",
    )
    return ids


def tokens_to_text(ids, tokenizer):
    """Token ids -> text: the tokenizer's decoding, or the UTF-8 bytes (a byte that does not decode, and an
    id of 256 or more, shows as U+FFFD)."""
    if tokenizer:
        return tokenizer.decode(ids)
    return b"".join(bytes([i]) if i < 256 else b"\xef\xbf\xbd" for i in ids).decode(
        "utf-8", errors="replace"
    )


def pick_token(logits, temperature, top_k, rng):
    """The next token from the logits of a position (float64 on the host, the same in every target):
    temperature 0 takes the most probable (the lowest id among equals); otherwise one uniform draw from
    `rng` picks from softmax(logits / temperature) over the top_k most probable (ties with the k-th kept;
    0: all): the first id whose cumulative probability exceeds it."""
    z = np.asarray(logits, np.float64)
    if temperature == 0:
        return int(np.argmax(z))
    z = z / temperature
    if 0 < top_k < len(z):
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    probs = np.exp(z - z.max())
    cumulative = np.cumsum(probs / probs.sum())
    return int(min(np.searchsorted(cumulative, rng.random(), side="right"), len(z) - 1))


def sample_tokens(step, ids, args, seq):
    """Runs the model on the prompt and on each new token, one position at a time, and picks the tokens
    after the prompt, up to the context of `seq` positions. Returns every id, the decode's logits of each
    position run, and the seconds spent."""
    rng = np.random.default_rng(args.seed)
    out = list(ids)
    total = len(ids) + min(args.max_new_tokens, seq - len(ids))
    seen = []
    t0 = time.perf_counter()
    for pos in range(total - 1):  # the last token is never run: nothing comes after it
        logits = step(out[pos], pos)
        seen.append(logits)
        if pos + 1 >= len(ids):
            out.append(pick_token(logits, args.temperature, args.top_k, rng))
    return out, seen, time.perf_counter() - t0


def print_result(args, ids, out, seen, seconds, tokenizer, full, first, seq):
    """Prints the text (or --json), says when the context (`seq` positions) stopped the generation, and
    with --check compares the decode with the full forward pass (exit 1 when a position's most probable
    token differs). `first`: whether this process prints."""
    new = len(out) - len(ids)
    stopped = new < args.max_new_tokens
    check = None
    if args.check and seen:
        whole = np.asarray(full(out[:-1]), np.float64)  # every position that was run
        cached = np.asarray(seen, np.float64)
        differ = [
            i for i in range(len(seen)) if int(np.argmax(whole[i])) != int(np.argmax(cached[i]))
        ]
        check = {
            "positions": len(seen),
            "argmax_differs": differ,
            "max_abs_diff": float(np.abs(whole - cached).max()),
        }
    if first:
        if stopped:
            print(
                f"stopped after {new} new token(s): the sequence holds {len(out)} tokens, the model's "
                f"context (the spec's seq) is {seq}",
                file=sys.stderr,
                flush=True,
            )
        rate = len(seen) / seconds if seconds > 0 else 0.0
        print(
            f"{len(seen)} position(s) decoded in {seconds:.2f} s ({rate:.1f}/s, compilation included)",
            file=sys.stderr,
            flush=True,
        )
        if args.json:
            row = {
                "prompt_ids": ids,
                "new_ids": out[len(ids) :],
                "text": tokens_to_text(out, tokenizer),
                "stopped_at_context": stopped,
                "positions": len(seen),
                "seconds": seconds,
            }
            if check is not None:
                row["check"] = check
            print(json.dumps(row), flush=True)
        else:
            print(tokens_to_text(out, tokenizer), flush=True)
        if check is not None:
            print(
                f"check: {len(seen)} position(s), the most probable token differs at "
                f"{check['argmax_differs']}; largest logit difference {check['max_abs_diff']:.3g}",
                file=sys.stderr,
                flush=True,
            )
    if check is not None and check["argmax_differs"]:
        if first:
            print(
                "error: --check: the cached decode and the full forward pass disagree",
                file=sys.stderr,
                flush=True,
            )
        sys.stdout.flush()
        os._exit(1)
