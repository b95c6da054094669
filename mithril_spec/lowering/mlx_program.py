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
from ..ops.attention import Attention
from ..ops.elementwise import Dropout
from ..ops.mlp import GELU, SILU_GATE, Mlp
from ..ops.moe import Moe
from ..ops.norm import BatchNorm, RmsNorm
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


def _call_kwargs(layer: dict[str, Any]) -> list[tuple[str, Any]]:
    """The optional keyword arguments (name, value) of the layer's call to its op helper (templates/mlx/ops.py.j2
    `keywords`), in the order of the helper's signature: only those that differ from the helper's defaults
    (attention's dropout, whose value depends on `train`, the template writes itself). `tp=True`: a
    tensor-parallel attention / mlp, before the attention's dropout and the mlp's gate."""
    kind = type(OPS[layer["op"]])
    out = OPS[layer["op"]].helper_keywords(layer["attrs"])
    if layer.get("tp") and kind in (Attention, Mlp):
        out = [*out, ("tp", True)] if kind is Attention else [("tp", True), *out]
    return out


def _op_defs(op_attrs: dict[str, list[dict[str, Any]]], tensor: int, evaluates: bool) -> dict[str, dict[str, Any]]:
    """Per op, what its helper's definition holds (templates/mlx/ops.py.j2 `<op>_def`): the features some
    layer of the program uses, and the helper's optional parameters (name, default) in signature order.
    `evaluates`: the spec has an `eval` section (batch_norm then takes `train`)."""
    by_kind = {type(OPS[op]): attrs for op, attrs in op_attrs.items()}
    op_of = {type(op): op for op in OPS.values()}

    def some(kind: type, test) -> bool:
        return any(test(a) for a in by_kind.get(kind, []))

    def activations(kind: type) -> list[str]:  # each once, in the order of the layers
        return list(dict.fromkeys(a["activation"] for a in by_kind.get(kind, [])))

    tp = tensor > 1  # tensor parallelism: the helpers take `tp` (this process's part of the features)
    # dropout's helper: for a dropout layer above rate 0, or for attention dropout (rendered once); with
    # tensor parallelism attention dropout draws the mask for every head (`heads`)
    dropout_layers = some(Dropout, lambda a: a["rate"])
    attention_dropout = some(Attention, lambda a: a["dropout"])
    dropout_heads = tp and attention_dropout
    # the helper's optional parameter `heads` (None: a dropout layer's whole rows)
    dropout_params = [("heads", None)] if dropout_heads else []
    defs: dict[type, dict[str, Any]] = {
        Dropout: {"helper": dropout_layers, "heads": dropout_heads, "params": dropout_params}
    }
    f = {
        "gqa": some(Attention, lambda a: a["kv_heads"] != a["heads"]),
        "causal": some(Attention, lambda a: a["causal"]),
        "rotary": some(Attention, lambda a: a["rotary"]),
        "scaled": some(Attention, lambda a: a["rope_scaling"]),
        "qknorm": some(Attention, lambda a: a["qk_norm"]),
        "scaled_scores": some(Attention, lambda a: a["scale"]),
        "capped": some(Attention, lambda a: a["softcap"]),
        "qkv_only": some(Attention, lambda a: a["bias"] and not a["o_bias"]),  # biases on q, k, v alone
        "drop": attention_dropout,
        "tp": tp,
        "dropout_helper": attention_dropout and not dropout_layers,  # no dropout layer renders it
        "dropout_heads": dropout_heads,
        "dropout_params": dropout_params,
    }
    # project()'s heads: all of them (n), or with tp this process's (-1: what its columns hold); the k and v
    # projections' heads; when the output projection adds its bias (`bias`, and `o_bias` where some layer has
    # biases on q, k, v alone)
    f["project_heads"] = -1 if tp else "n"
    f["kv_heads"] = "kv_heads" if f["gqa"] else "heads"
    f["out_bias"] = ["bias", "o_bias"] if f["qkv_only"] else ["bias"]
    f["rope_params"] = [("scaling", None)] if f["scaled"] else []
    f["params"] = [*op_of[Attention].helper_params(by_kind.get(Attention, [])), *([("tp", False)] if tp else []),
                   *([("dropout_rate", 0.0), ("key", None)] if f["drop"] else [])]
    defs[Attention] = f
    gelu_gate = some(Mlp, lambda a: a["gate_activation"] != SILU_GATE)
    acts = activations(Mlp)
    defs[Mlp] = {"gelu_gate": gelu_gate, "tp": tp, "activations": acts, "tanh_gelu": GELU in acts,
                 # SwiGLU and/or a plain MLP (act(fc)); both: branched on `activation`
                 "swiglu": "swiglu" in acts, "plain": acts != ["swiglu"], "branch": "swiglu" in acts and len(acts) > 1,
                 "params": [*([("tp", False)] if tp else []), *([("gate_act", SILU_GATE)] if gelu_gate else [])],
                 # the positional `reduce` of the output projection (tp_sum after it with tp)
                 "reduce": ["tp"] if tp else []}
    acts = activations(Moe)
    swiglu, plain = "swiglu" in acts, any(act != "swiglu" for act in acts)
    dropless, capped = some(Moe, lambda a: a["dropless"]), some(Moe, lambda a: not a["dropless"])
    defs[Moe] = {
        "params": op_of[Moe].helper_params(by_kind.get(Moe, [])),
        "normalize": some(Moe, lambda a: a["normalize_gates"]),
        "shared": some(Moe, lambda a: a["shared_hidden"]),
        "shared_gate": some(Moe, lambda a: a["shared_gate"]),
        "z_loss": some(Moe, lambda a: a["z_loss_weight"]),
        # the experts' MLPs: SwiGLU and/or a plain one; both: branched on `activation` (one level deeper)
        "swiglu": swiglu, "plain": plain, "branch": swiglu and plain, "indent": " " * (8 if swiglu and plain else 4),
        # routings: capped (slot_experts) and/or dropless (grouped_experts); both: chosen by `grouped`
        "dropless": dropless, "capped": capped, "both_routings": dropless and capped,
    }
    defs[BatchNorm] = {"params": [("train", True)] if evaluates else []}
    defs[RmsNorm] = {"offset": some(RmsNorm, lambda a: a["weight_offset"])}
    return {op: defs.get(type(OPS[op]), {}) for op in op_attrs}


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
    for layer in [*model["layers"], *(layer for block in model["blocks"] for layer in block["layers"])]:
        if layer["op"] != "repeat":
            layer["kwargs"] = _call_kwargs(layer)
    for block in model["blocks"]:
        # the block function's arguments after (p, pre, x) and what it returns after its output (model.py.j2)
        block["state_args"] = [n for n, has in (("buffers", block["has_buffers"]), ("key", block["has_dropout"])) if has]
        block["train_param"] = [("train", True)] if block["train_arg"] else []
        block["call_args"] = block["state_args"] + (["train"] if block["train_arg"] else [])
        block["returns"] = [n for n, has in (("buffers", block["has_buffers"]), ("aux_loss", block["has_aux"])) if has]
        block["receives"] = [n for n, has in (("buffers", block["has_buffers"]), ("aux", block["has_aux"])) if has]
        # the block's optional pieces (templates/mlx/model_parts.py.j2): with moe layers it returns their losses'
        # sum (after the buffers, where it has them), starts it at 0, and the repeat adds it to forward's
        aux = block["has_aux"]
        block["parts"] = {
            "docstring": [("returns_buffers_aux_doc" if block["has_buffers"] else "returns_aux_doc")] if aux else [],
            "start": ["aux_init"] if aux else [],
            "after_call": ["add_aux"] if aux else [],
        }
    loss = model["loss"]
    # forward's arguments after (p, batch), and its results: the prediction, the targets (unless an input),
    # the buffers, the moe layers' losses; the evaluation passes no dropout key and train=False
    forward_args = [n for n, has in (("buffers", model["has_buffers"]), ("key", model["has_dropout"])) if has]
    outs = [loss["prediction_var"], *([] if loss["targets_is_input"] else [loss["targets_var"]])]
    extra = [n for n, has in (("buffers", model["has_buffers"]), ("aux_loss", model["has_aux"])) if has]
    forward_outs, eval_outs = outs + extra, outs + ["_"] * len(extra)
    eval_args = [n for n, has in (("buffers", model["has_buffers"]), ("None", model["has_dropout"])) if has]
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
            "tp": tensor > 1,  # tensor parallelism: the program splits parameters over the processes
            "op_defs": _op_defs(model["op_attrs"], tensor, ctx["eval"] is not None),
            # remat (training.remat full): around each repeated block, or around the whole forward pass when
            # the model has no repeated block
            "remat_blocks": ctx["training"]["remat"] == "full" and bool(model["blocks"]),
            "remat_forward": ctx["training"]["remat"] == "full" and not model["blocks"],
            "forward_args": forward_args,
            "forward_train": [("train", True)] if model["train_arg"] else [],
            "forward_outs": forward_outs,
            "eval_outs": eval_outs,
            "eval_args": eval_args,
            "eval_train": [("train", False)] if model["train_arg"] else [],
            # generate.py's forward call: no buffers (a language model has no batch_norm), no dropout key
            "generate_args": ["None"] if model["has_dropout"] else [],
            # train_step's arguments after the micro-batches' tag: data.mask's factor on the loss
            "step_args": ["mask_scale"] if ctx["data"]["mask"] else [],
            "data": plan.mesh.data,
            # per-device bytes the build's costing predicts (plan.json); the program reports what it holds
            "planned": {"params": held.params, "optimizer": held.optimizer, "buffers": held.buffers},
        },
    }
