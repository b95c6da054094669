"""Context parallelism: the `context` mesh axis splits the sequence of every activation (docs/program.md
"Context parallelism"). The sequence is the logical axis that the ring layers (attention: Op.context_parallel
"ring") attend over, the first dimension of their input; the plan lays the activations' dimensions of that
axis out over `context` (Plan.activation_layout) and the model inputs' likewise. Parameters stay whole over
`context`, and their gradients are reduced over it as over a batch axis.
"""

from __future__ import annotations

from typing import Optional

from ..axes import CONTEXT
from ..graph import Graph, RepeatNode
from ..ops import OPS

AXIS = CONTEXT  # the mesh axis (axes.py)


def layers(graph: Graph):
    """Every layer of the graph, a repeated block's layers once."""
    for n in graph.layers:
        if isinstance(n, RepeatNode):
            yield from n.layers
        else:
            yield n


def attended_axis(graph: Graph) -> Optional[str]:
    """The logical axis of the sequence the ring layers attend over (None: the model has none, or its
    sequence dimension has no logical axis)."""
    for n in layers(graph):
        if OPS[n.op].context_parallel == "ring":
            return n.in_types[0].axes[0]
    return None


def degree(mesh) -> int:
    return mesh.size(AXIS)
