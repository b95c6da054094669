"""Losses (the spec's `model.loss`): cross_entropy over class logits, mse over predictions."""

from __future__ import annotations

from typing import Literal, Optional

from ..spec.common import Ident, Strict
from .base import OpError, TensorType


class CrossEntropy(Strict):
    op: Literal["cross_entropy"]
    logits: Optional[Ident] = None  # default: the model's last layer
    targets: Ident


class Mse(Strict):
    op: Literal["mse"]
    predictions: Optional[Ident] = None  # default: the model's last layer
    targets: Ident


def check_loss(loss, pred: TensorType, target: TensorType) -> None:
    """Raises OpError when the prediction and target do not fit the loss."""
    if loss.op == "cross_entropy":
        if not target.is_int:
            raise OpError("E029", f"cross_entropy targets must be integer class ids, got {target.dtype}", "targets")
        if pred.is_int:
            raise OpError("E029", f"cross_entropy logits must be floating point, got {pred.dtype}", "logits")
        if pred.shape[:-1] != target.shape:
            raise OpError(
                "E028",
                f"cross_entropy logits {pred.show()} do not fit targets {target.show()} "
                f"(targets need the logits' shape without the last, class dimension)",
                "targets",
            )
    else:
        if pred.shape != target.shape:
            raise OpError("E028", f"mse predictions {pred.show()} and targets {target.show()} differ in shape",
                          "targets")
        if target.is_int:
            raise OpError("E029", f"mse targets must be floating point, got {target.dtype}", "targets")
