"""Losses (the spec's `model.loss`): cross_entropy over class logits, mse over predictions.

Like operators, each loss is one class that owns everything about it: its spec arguments (`Args`), which
argument names the prediction, its shape and dtype rule, and its costs; `LOSSES[kind]` gives it."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal, Optional

from .. import codes
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


class Loss:
    kind: ClassVar[str]
    Args: ClassVar[type[Strict]]
    prediction_field: ClassVar[str]  # the argument that names the prediction tensor
    class_targets: ClassVar[bool] = False  # targets are class ids below the prediction's last dimension

    def check(self, pred: TensorType, target: TensorType) -> None:
        """Raises OpError when the prediction and target do not fit the loss."""
        raise NotImplementedError

    def costs(self, c: Any) -> None:
        """Saved tensors, temporaries and collectives through the cost model's `LossCosts`."""
        raise NotImplementedError


class CrossEntropyLoss(Loss):
    kind = "cross_entropy"
    Args = CrossEntropy
    prediction_field = "logits"
    class_targets = True

    def check(self, pred, target):
        if not target.is_int:
            raise OpError(codes.E029, f"cross_entropy targets must be integer class ids, got {target.dtype}", "targets")
        if pred.is_int:
            raise OpError(codes.E029, f"cross_entropy logits must be floating point, got {pred.dtype}", "logits")
        if pred.shape[:-1] != target.shape:
            raise OpError(
                codes.E028,
                f"cross_entropy logits {pred.show()} do not fit targets {target.show()} "
                f"(targets need the logits' shape without the last, class dimension)",
                "targets",
            )

    def costs(self, c):
        pred = c.pred
        elems = math.ceil(c.b * pred.numel / c.walk.deg(c.axes))
        c.save("softmax", elems * 4, self.kind)  # fp32 log-softmax
        c.set_temporaries(elems * (4 + c.compute_bytes))  # and the logits' gradient
        cls = c.walk.act_axes(pred, (len(pred.shape) - 1,))
        if cls:  # vocab parallel: max, target logit and sum are reduced over the class shards
            tokens = math.ceil(c.b * (pred.numel // pred.shape[-1]) / c.walk.deg(c.axes - cls))
            c.u.add_coll("all-reduce", c.walk.sorted_axes(cls), "forward",
                         "vocab-parallel cross-entropy (max, target logit, sum)", tokens * 4, True, 3)


class MseLoss(Loss):
    kind = "mse"
    Args = Mse
    prediction_field = "predictions"

    def check(self, pred, target):
        if pred.shape != target.shape:
            raise OpError(codes.E028, f"mse predictions {pred.show()} and targets {target.show()} differ in shape",
                          "targets")
        if target.is_int:
            raise OpError(codes.E029, f"mse targets must be floating point, got {target.dtype}", "targets")

    def costs(self, c):
        nb = c.walk.nbytes(c.pred, c.axes)
        c.save("diff", nb, self.kind)
        c.set_temporaries(2 * nb)


LOSSES: dict[str, Loss] = {cls.kind: cls() for cls in (CrossEntropyLoss, MseLoss)}
