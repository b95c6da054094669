"""The parts of jax's ops, model and train_step templates (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    return {}
