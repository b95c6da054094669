"""The `data` and `eval` sections against the model and the file system.

What a data kind feeds: `text` and `tokens` make next-token pairs, so the model takes exactly two integer
inputs of shape [batch, seq]; byte text needs a vocab of 256 or more. Which files it names: a relative path
is relative to the directory of the file it was written in (a base spec's own directory through `extends`,
the working directory for a `--set`), resolved here once so that every later stage uses the same absolute
path; `validate` warns (W011) about a file that is not there, since it may exist only where training runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..diagnostics import Diagnostic
from ..graph import Graph
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
                "E013", f"`data: {{kind: {kind}}}` needs exactly two integer inputs of shape [batch, seq] "
                "(tokens, targets)", where,
                help="declare e.g. tokens and targets as {shape: [batch, seq], dtype: int32}"))
        elif kind == "text" and ins[0].high < 256:
            diags.append(Diagnostic(
                "E013", f"`data: {{kind: text}}` produces byte tokens 0..255, but `{ins[0].name}` feeds an "
                f"embedding of vocab {ins[0].high}", where, help="use vocab >= 256 for character-level text"))
    ev = spec.eval
    if ev is not None:
        if kind == "synthetic" and (ev.path is not None or ev.split is not None):
            key = "path" if ev.path is not None else "split"
            diags.append(Diagnostic(
                "E013", f"`eval.{key}`: synthetic data has no file to evaluate on", doc.pos(("eval", key), key=True),
                help="leave `path` and `split` out: evaluation on synthetic data draws samples of its own"))
        elif kind != "synthetic" and ev.path is None and ev.split is None:
            diags.append(Diagnostic(
                "E013", f"`eval` needs held-out data for `data: {{kind: {kind}}}`", doc.pos(("eval",), key=True),
                help="give `path` (a held-out file of the same kind) or `split` (e.g. 0.1: the last 10% of the "
                "training data, held out of training)"))
    for role, path in (("data", ("data", "path")), ("tokenizer", ("data", "tokenizer")), ("eval", ("eval", "path"))):
        f = files.get(role)
        if f is None:
            continue
        want_dir = role != "tokenizer" and kind == "arrays"
        exists = os.path.isdir(f) if want_dir else os.path.isfile(f)
        if not exists:
            what = "directory" if want_dir else "file"
            warnings.append(Diagnostic(
                "W011", f"`{'.'.join(path)}`: no {what} {f}", doc.pos(path),
                help="a relative path is relative to the spec's directory; the program can also be given "
                "another one (`--data`); ignore this where the data exists only on the training machine"))
