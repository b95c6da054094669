"""The `data` and `eval` sections against the model and the file system.

What a data kind feeds: `text` and `tokens` make next-token pairs, so the model takes exactly two integer
inputs of shape [batch, seq]; byte text needs a vocab of 256 or more. Which files it names: a relative path
is relative to the directory of the file it was written in (a base spec's own directory through `extends`,
the working directory for a `--set`), resolved here once so that every later stage uses the same absolute
path; `validate` warns (W011) about a file that is not there, since it may exist only where training runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import codes
from ..diagnostics import Diagnostic
from ..graph import Graph, Node
from ..ops import OPS
from ..ops.loss import LOSSES
from ..overrides import is_override
from ..source import Document
from ..spec.root import Spec

TOKEN_KINDS = ("text", "tokens")  # data kinds that produce (tokens, next tokens) pairs


def data_files(spec: Spec, doc: Document) -> dict[str, str]:
    """{role: absolute path} of the files the spec names: `data`, `eval`, `tokenizer`."""
    out = {}
    for role, path, value in (
        ("data", ("data", "path"), getattr(spec.data, "path", None)),
        ("tokenizer", ("data", "tokenizer"), getattr(spec.data, "tokenizer", None)),
        ("mask", ("data", "mask"), getattr(spec.data, "mask", None)),
        ("eval", ("eval", "path"), spec.eval.path if spec.eval else None),
    ):
        if value is not None:
            written = doc.pos(path).file
            base = Path.cwd() if is_override(written) else Path(written).resolve().parent
            out[role] = os.path.normpath(base / os.path.expanduser(value))
    return out


def check_data(spec: Spec, graph: Graph, doc: Document, files: dict[str, str], diags: list[Diagnostic],
               warnings: list[Diagnostic]) -> None:
    kind = spec.data.kind
    where = doc.pos(("data", "kind"))
    if kind in TOKEN_KINDS:
        ins = graph.inputs
        ok = len(ins) == 2 and all(i.type.is_int and len(i.type.shape) == 1 for i in ins) and (
            ins[0].type.shape == ins[1].type.shape)
        if not ok:
            diags.append(Diagnostic(
                codes.E013, f"`data: {{kind: {kind}}}` needs exactly two integer inputs of shape [batch, seq] "
                "(tokens, targets)", where,
                help="declare e.g. tokens and targets as {shape: [batch, seq], dtype: int32}"))
        elif kind == "text" and ins[0].high < 256:
            diags.append(Diagnostic(
                codes.E013, f"`data: {{kind: text}}` produces byte tokens 0..255, but `{ins[0].name}` feeds an "
                f"embedding of vocab {ins[0].high}", where, help="use vocab >= 256 for character-level text"))
    ev = spec.eval
    if ev is not None:
        if kind == "synthetic" and (ev.path is not None or ev.split is not None):
            key = "path" if ev.path is not None else "split"
            diags.append(Diagnostic(
                codes.E013, f"`eval.{key}`: synthetic data has no file to evaluate on", doc.pos(("eval", key), key=True),
                help="leave `path` and `split` out: evaluation on synthetic data draws samples of its own"))
        elif kind != "synthetic" and ev.path is None and ev.split is None:
            diags.append(Diagnostic(
                codes.E013, f"`eval` needs held-out data for `data: {{kind: {kind}}}`", doc.pos(("eval",), key=True),
                help="give `path` (a held-out file of the same kind) or `split` (e.g. 0.1: the last 10% of the "
                "training data, held out of training)"))
    if getattr(spec.data, "mask", None) is not None:
        _check_mask(spec, graph, doc, diags)
    for role, path in (("data", ("data", "path")), ("tokenizer", ("data", "tokenizer")), ("mask", ("data", "mask")),
                       ("eval", ("eval", "path"))):
        f = files.get(role)
        if f is None:
            continue
        want_dir = role not in ("tokenizer", "mask") and kind == "arrays"
        exists = os.path.isdir(f) if want_dir else os.path.isfile(f)
        if exists and kind == "tokens" and role in ("data", "eval"):
            _check_token_file(spec, graph, doc, f, path, diags)
        if not exists:
            what = "directory" if want_dir else "file"
            warnings.append(Diagnostic(
                codes.W011, f"`{'.'.join(path)}`: no {what} {f}", doc.pos(path),
                help="a relative path is relative to the spec's directory; the program can also be given "
                "another one (`--data`); ignore this where the data exists only on the training machine"))


def _check_token_file(spec: Spec, graph: Graph, doc: Document, f: str, path: tuple[str, ...],
                      diags: list[Diagnostic]) -> None:
    """A token file that is there, against the spec, as the program checks it before step 1: not a .npy file,
    and the dtype and vocabulary that `data prepare`'s data.json beside it records (E013)."""
    key = ".".join(path)
    try:
        with open(f, "rb") as fh:
            head = fh.read(6)
    except OSError:
        return
    if head == b"\x93NUMPY":
        diags.append(Diagnostic(
            codes.E013, f"`{key}`: {f} is a .npy file (it starts with the .npy header), not flat token ids", doc.pos(path),
            help=f"write the ids raw (np.asarray(ids, np.{spec.data.dtype}).tofile(path)) or with "
            "`mithril-spec data prepare`"))
        return
    meta_file = os.path.join(os.path.dirname(f), "data.json")
    try:
        with open(meta_file, encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        return
    if not isinstance(meta, dict) or meta.get("dtype") not in ("uint16", "uint32"):
        return
    if meta["dtype"] != spec.data.dtype:
        diags.append(Diagnostic(
            codes.E013, f"`{key}`: {f} holds {meta['dtype']} ids ({meta_file}) but `data.dtype` is {spec.data.dtype}",
            doc.pos(path), help=f"set data.dtype: {meta['dtype']}"))
    # the inputs whose ids index something (embedding rows, the loss's classes): every id must be below `high`
    indexed = {r for n in graph.layers if isinstance(n, Node) and OPS[n.op].index_bound(n.attrs) is not None
               for r in n.inputs}
    if LOSSES[graph.loss.op].class_targets:
        indexed.add(graph.loss.targets)
    bounded = [i for i in graph.inputs if i.type.is_int and i.name in indexed]
    vocab = meta.get("vocab")
    low = min(bounded, key=lambda i: i.high) if bounded else None
    if isinstance(vocab, int) and low is not None and vocab > low.high:
        diags.append(Diagnostic(
            codes.E013, f"`{key}`: {f} comes from a tokenizer of {vocab} ids ({meta_file}) but `{low.name}` indexes "
            f"{low.high} (the model's vocab)", doc.pos(path),
            help=f"set the spec's vocab to {vocab} or more, or prepare the data with the model's tokenizer "
            "(mithril-spec data prepare --tokenizer MODEL_DIR)"))


def _check_mask(spec: Spec, graph: Graph, doc: Document, diags: list[Diagnostic]) -> None:
    """`data.mask`: the loss leaves out the masked targets, so it must be the cross-entropy of the second
    input (the targets); what no target masks yet is refused (E013)."""
    where = doc.pos(("data", "mask"), key=True)
    loss, ins = graph.loss, graph.inputs
    if not LOSSES[loss.op].class_targets or len(ins) != 2 or loss.targets != ins[1].name:
        diags.append(Diagnostic(
            codes.E013, "`data.mask` masks the class targets of a cross-entropy loss, but the loss is "
            f"`{loss.op}` of `{loss.targets}`", where,
            help="use `loss: {op: cross_entropy, targets: <the second input>}`, or leave `mask` out"))
    if spec.eval is not None:
        diags.append(Diagnostic(
            codes.E013, "`data.mask` with `eval`: no target evaluates a masked loss yet", where,
            help="leave `eval` out (or `mask`)"))
