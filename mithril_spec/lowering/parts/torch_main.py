"""The parts of torch's main, train, model and params templates (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    t = ctx["torch"]
    return {
        # after optimizer.step(): the parameters rewritten from what the optimizer stepped (ZeRO slices or
        # float32 master copies), when it stepped Shards of them
        "after_step": ["write_back_slices" if t.zero else "write_back_copies"] if t.shards else [],
    }
