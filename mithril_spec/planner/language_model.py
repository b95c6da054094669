"""Which plans are language models that the programs can sample from (`generate.py`, docs/program.md
"Sampling"): decided here, once, for every target (Plan.language_model; the targets' conditional files and
the render context read it).

A plan qualifies when
- its first integer input holds token ids, [batch, seq], and only embedding layers read it;
- its loss is cross_entropy of logits [batch, seq, vocab] against another integer input of the tokens' shape
  (the next tokens), where vocab is the embedding's vocabulary;
- no layer reads another model input, and every layer can run one position at a time with the earlier
  positions' keys and values cached (Op.decodes: per-position operators, embeddings, the mlp, causal
  attention, moe with dropless routing; not capped moe, batch_norm, convolutions, reshapes).

Pipelined builds sample through their stages and context-parallel ones decode one position at a time
(the targets' generate.py templates); the jax target renders it for pipelines of one repeat's evenly split
copies only (targets/jax.py samples_through_pipeline).
"""

from __future__ import annotations

import dataclasses

from ..graph import Graph, Node
from ..ops import OPS
from ..ops.loss import LOSSES


@dataclasses.dataclass(frozen=True)
class LanguageModel:
    tokens: str  # the input of token ids, [batch, seq]
    targets: str  # the loss targets (next tokens), an input of the same shape
    vocab: int
    seq: int  # the context: the longest sequence a program samples
    dropout: bool  # a dropout layer with a rate above 0 (the identity when sampling)


def language_model(graph: Graph) -> LanguageModel | None:
    """The language model of a plan of `graph` (Plan.language_model; see the module's docstring: pipelines and
    context parallelism sample too), or None when it is not one."""
    loss = graph.loss
    if not LOSSES[loss.op].class_targets:  # cross_entropy: the logits of the next token's classes
        return None
    ints = [i for i in graph.inputs if i.type.is_int]
    if not ints or len(ints[0].type.shape) != 1:
        return None
    tokens = ints[0]
    targets = next((i for i in graph.inputs if i.name == loss.targets), None)
    if targets is None or targets is tokens or not targets.type.is_int or targets.type.shape != tokens.type.shape:
        return None
    inputs = {i.name for i in graph.inputs}
    nodes: list[Node] = []
    for n in graph.layers:
        if n.is_repeat:
            if set(n.inputs) & inputs:
                return None
            nodes += n.layers
        else:
            nodes.append(n)
    vocabs = set()
    for n in nodes:
        if not OPS[n.op].decodes(n.attrs):
            return None
        read = set(n.inputs) & inputs
        if read:
            bound = OPS[n.op].index_bound(n.attrs)
            if read != {tokens.name} or bound is None:
                return None
            vocabs.add(bound)
    out = {n.name: n.out for n in graph.layers}.get(loss.prediction)
    seq = tokens.type.shape[0]
    if len(vocabs) != 1 or out is None or tuple(out.shape) != (seq, *vocabs):
        return None
    dropout = any(OPS[n.op].is_random(n.attrs) for n in nodes)
    return LanguageModel(tokens.name, targets.name, vocabs.pop(), seq, dropout)
