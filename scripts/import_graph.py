#!/usr/bin/env python3
"""Prints the import graph of mithril_spec by layer (tests/test_architecture.py's LAYERS, lowest first): each
layer's modules and, for each, the layers it imports from. Every import counts (module-level, type-only,
function-local). `--dot` prints a Graphviz digraph of the layers instead.

    .venv/bin/python scripts/import_graph.py
    .venv/bin/python scripts/import_graph.py --dot | dot -Tsvg > layers.svg
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_architecture import LAYERS, import_graph, layer_of  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dot", action="store_true", help="a Graphviz digraph of the layers")
    args = ap.parse_args(argv)
    graph = import_graph()
    names = [name for name, _ in LAYERS]
    if args.dot:
        edges = {(layer_of(a), layer_of(b)) for a, bs in graph.items() for b in bs if layer_of(a) != layer_of(b)}
        print("digraph layers {\n  rankdir=BT;")
        for a, b in sorted(edges):
            print(f'  "{names[a]}" -> "{names[b]}";')
        print("}")
        return 0
    by_layer: dict[int, list[str]] = defaultdict(list)
    for mod in sorted(graph):
        by_layer[layer_of(mod)].append(mod)
    for i, name in enumerate(names):
        print(f"{i} {name}")
        for mod in by_layer[i]:
            below = sorted({layer_of(m) for m in graph[mod]})
            print(f"    {mod}" + (f"  <- {', '.join(names[j] for j in below)}" if below else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
