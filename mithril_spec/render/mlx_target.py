"""Context the mlx templates need beyond the shared context (render/context.py).

The mlx program's model is functions over a flat dict of parameters, as the JAX program's: the same
variable renaming (never shadowing a name the model code uses itself) and the same list of op helpers
come from `jax_target.model_context`. Besides: the micro-batches a step accumulates over, and the bytes
the planner predicts per device (the program prints what it holds next to them).
"""

from __future__ import annotations

from typing import Any

from ..planner.plan import Plan
from .jax_target import model_context

# Names the generated model code uses inside the functions that hold tensor variables.
MODEL_NAMES = {
    "mx", "nn", "optim", "np", "zlib", "math", "linear", "layer_norm", "rms_norm", "batch_norm", "embedding",
    "attention", "rope", "mlp", "conv1d", "conv2d", "max_pool2d", "avg_pool2d", "dropout", "layer_key",
    "cross_entropy", "mse", "forward", "loss_fn", "pre", "p", "batch", "buffers", "key", "x", "i", "block",
    "COMPUTE_DTYPE", "REMAT", "pool2d",
}  # fmt: skip


def extra_context(plan: Plan, ctx: dict[str, Any]) -> dict[str, Any]:
    model = model_context(plan, ctx, MODEL_NAMES)
    return {
        **{k: model[k] for k in ("inputs", "layers", "blocks", "loss")},
        "mlx": {
            **{k: model[k] for k in ("ops", "op_attrs", "has_dropout", "has_buffers")},
            # per-device bytes the planner predicts (`mithril-spec plan`); the program reports what it holds
            "planned": {"params": plan.memory.params, "optimizer": plan.memory.optimizer,
                        "buffers": plan.memory.buffers},
        },
    }
