"""Context the mlx templates need beyond the shared context (lowering/common.py).

The mlx program's model is functions over a flat dict of parameters, as the JAX program's: the same
variable renaming (never shadowing a name the model code uses itself) and the same list of op helpers
come from `jax_target.model_context`. Besides: the micro-batches a step accumulates over, and the bytes
the planner predicts per device (the program prints what it holds next to them).
"""

from __future__ import annotations

from typing import Any

from ..graph import RepeatNode
from ..ops import OPS
from ..planner.plan import Plan
from .base import linear_style, tensor_dims
from .costing import Costing
from .jax_program import model_context, model_hash, optimizer_settings, spec_hash

# Names the generated model code uses inside the functions that hold tensor variables.
MODEL_NAMES = {
    "mx", "nn", "optim", "np", "zlib", "math", "linear", "layer_norm", "rms_norm", "batch_norm", "embedding",
    "attention", "rope", "mlp", "conv1d", "conv2d", "max_pool2d", "avg_pool2d", "dropout", "layer_key",
    "cross_entropy", "mse", "train", "forward", "loss_fn", "pre", "p", "batch", "buffers", "key", "x", "i", "block",
    "COMPUTE_DTYPE", "REMAT", "pool2d", "tp_copy", "tp_sum", "moe", "aux", "aux_loss",
}  # fmt: skip


def _tp_style(plan: Plan, full: str, layer: dict[str, Any]) -> str | None:
    """How a layer runs under tensor parallelism (targets/mlx.py refuses the rest): colwise / rowwise
    (linear), pair (attention, mlp: input projections split on their outputs, the output one on its inputs),
    or None (whole on every process)."""
    kind = OPS[layer["op"]].tensor_parallel
    if kind == "matmul" and not layer["attrs"].get("tie"):
        style = linear_style(plan, f"{full}.weight")
        return style if style in ("colwise", "rowwise") else None
    if kind == "pair" and any(tensor_dims(plan, f"{full}.{p}") for p in layer["params"]):
        return "pair"
    return None


def target_fields(plan: Plan, ctx: dict[str, Any], costing: Costing) -> dict[str, Any]:
    """`costing`: the build's one costing (lowering/costing.py); the program's planned bytes are its states."""
    # (generate.py runs model.py's forward pass without dropout: lowering/mlx.py says when it is left out)
    samples = plan.language_model is not None and plan.mesh.tensor <= 1
    model = model_context(plan, ctx, MODEL_NAMES, samples=samples)
    for layer in model["layers"]:
        layer["tp"] = None if layer["op"] == "repeat" else _tp_style(plan, layer["name"], layer)
    for block in model["blocks"]:
        rep = next(n for n in plan.graph.layers if isinstance(n, RepeatNode) and n.block == block["name"])
        for layer in block["layers"]:
            layer["tp"] = _tp_style(plan, f"{rep.name}.0.{layer['name']}", layer)
    tensor = plan.mesh.tensor
    held = costing.held
    return {
        **{k: model[k] for k in ("inputs", "layers", "blocks", "loss")},
        "spec_hash": spec_hash(plan),
        "model_hash": model_hash(plan),
        "optimizer_settings": optimizer_settings(plan),
        "mlx": {
            **{k: model[k] for k in ("ops", "op_attrs", "helpers", "has_dropout", "has_buffers", "has_aux",
                                          "train_arg")},
            # tensor parallelism (a mesh of `tensor` alone): the processes split these dimensions
            "tensor": tensor,
            "data": plan.mesh.data,
            # per-device bytes the build's costing predicts (plan.json); the program reports what it holds
            "planned": {"params": held.params, "optimizer": held.optimizer, "buffers": held.buffers},
        },
    }
