"""Context for generate.py, the sampling program of a language model (Plan.language_model; docs/program.md
"Sampling"): built on top of a target's context (lowering/jax_program.py, lowering/torch_program.py), so it reads
the same layers, blocks and tensor-parallel styles the training program was rendered from.

- The decode functions run one position at a time, with their own variables: a tensor variable never
  shadows what the decode code uses itself (the cache, the position, the block decode functions), nor
  anything the program defines or imports (context.var).
- Per layer that caches keys and values (Op.kv_cache: attention), at top level or per repeat (stacked
  over the copies in JAX): its key/value heads and head size, and (JAX) the mesh axes its heads are split
  over, as the k projection's output features are.
- What the shared decode code handles (Op.decode_features over the layers: `features`), and (JAX) the
  functions named after operators that it imports from train.py (Op.jax_function).
- torch: per layer, whether its weights stay split over `tensor` while decoding (column / row parallel
  linear layers, attention and mlp split Megatron-style); every other parameter is gathered whole.
"""

from __future__ import annotations

import copy
from typing import Any

from ..ops import OPS
from ..planner.plan import Plan
from .common import RESERVED, rename_vars

# Local names of the decode code (besides the target's model names)
JAX_DECODE_NAMES = {"cache", "ids", "pos", "kv", "rows", "row", "shared", "step", "name", "new"}
TORCH_DECODE_NAMES = {"pos", "pre", "ids", "i", "cache"}


def _decode_scope(layers: list[dict[str, Any]], names: dict[str, str], reserved: set[str]) -> list[dict[str, Any]]:
    """Copies of `layers` whose var / input_vars are the decode scope's variables (`names`: tensor -> the
    variable context.var gives it, every tensor the scope reads or writes)."""
    vars_ = rename_vars(names, reserved)
    out = []
    for layer in copy.deepcopy(layers):
        layer["var"] = vars_[layer["name"]]
        layer["input_vars"] = [vars_[n] for n in layer["inputs"]]
        out.append(layer)
    return out


def sampling_context(plan: Plan, ctx: dict[str, Any], target: str) -> dict[str, Any] | None:
    lm = plan.language_model
    if lm is None:
        return None
    if target == "mlx":  # model.py's forward pass itself at each position: nothing of the decode to lower
        if plan.mesh.tensor > 1:  # (in one process: lowering/mlx.py left_out)
            return None
        return {"tokens": lm.tokens, "vocab": lm.vocab, "seq": lm.seq, "tokenizer": plan.data_files.get("tokenizer"),
                # (no --check refusal: both passes of the mlx generate.py run without dropout)
                "has_dropout": False}
    model_names: set[str]
    if target == "jax":
        from .jax_program import MODEL_NAMES as model_names
        local = JAX_DECODE_NAMES
    else:
        from .torch_program import MODEL_NAMES as model_names
        local = TORCH_DECODE_NAMES
    decode_fns = {}
    for b in ctx["blocks"]:  # module-level functions of generate.py (JAX)
        name = f"{b['name']}_decode"
        while name in RESERVED or name in model_names or f"{name}_stack" in RESERVED:
            name += "_"
        decode_fns[b["name"]] = name
    reserved = set(model_names) | local | set(decode_fns.values()) | {f"{b}_stack" for b in decode_fns.values()}
    top_names = {i["name"]: i["var"] for i in ctx["inputs"]} | {layer["name"]: layer["var"] for layer in ctx["layers"]}
    layers = _decode_scope(ctx["layers"], top_names, reserved)
    token_var = rename_vars(top_names, reserved)[lm.tokens]
    prediction_var = rename_vars(top_names, reserved)[ctx["loss"]["prediction"]]
    tensor = plan.mesh.tensor

    def split(layer: dict[str, Any], styles: dict[str, str]) -> str | None:
        """torch: how a layer's weights stay split over `tensor` while decoding: colwise / rowwise (a linear
        layer), pair (attention, mlp), or None (gathered whole)."""
        kind = OPS[layer["op"]].tensor_parallel if layer["op"] in OPS else None  # matmul (linear) or pair
        if tensor <= 1 or kind not in ("matmul", "pair") or layer["attrs"].get("tie") or (
                layer["name"] == ctx["loss"]["prediction"]):
            # (a vocab-parallel output layer is gathered whole: the decode samples from all logits; so are a moe
            # layer's experts and a batch_norm's channels)
            return None
        mine = {k: v for k, v in styles.items() if k == layer["name"] or k.startswith(layer["name"] + ".")}
        if not mine:
            return None
        return mine.get(layer["name"]) if kind == "matmul" else "pair"

    blocks = []
    caches = []  # per top-level attention layer and per repeat: the key/value caches of its attention layers
    local_modules = []  # torch: the module FQNs (blocks.*.attn.q) whose weights stay split over `tensor`
    for layer in layers:
        if layer["op"] in OPS and OPS[layer["op"]].kv_cache:
            caches.append({"repeat": None, "count": None, "layers": [_cache(plan, layer, "")]})
        layer["split"] = split(layer, ctx["tp"])
        if target == "torch":
            layer["decode_args"] = torch_decode_args(layer)
        if layer["split"]:
            local_modules += [k for k in ctx["tp"] if k == layer["name"] or k.startswith(layer["name"] + ".")]
    for block in ctx["blocks"]:
        names = {"block_input": "block_input"} | {layer["name"]: layer["var"] for layer in block["layers"]}
        vars_ = rename_vars(names, reserved)
        inner = _decode_scope(block["layers"], names, reserved)
        styles = block.get("tp", {})
        for layer in inner:
            layer["split"] = split(layer, styles)
            if target == "torch":
                layer["decode_args"] = torch_decode_args(layer)
        blocks.append({
            **{k: v for k, v in block.items() if k != "layers"},
            "layers": inner,
            "input_var": vars_["block_input"],
            "output_var": vars_[block["output"]],
            "decode_fn": decode_fns[block["name"]],
            "stack_fn": f"{decode_fns[block['name']]}_stack",
        })
    by_block = {b["name"]: b for b in blocks}
    stages = None  # torch, more than one pipeline stage: per stage its layers (a repeat with its copies there)
    if target == "torch" and plan.pipeline is not None and len(plan.pipeline.stages) > 1:
        from .torch import pipeline_flow

        flows, _ = pipeline_flow(plan)
        vars_ = rename_vars(top_names, reserved)
        by_name = {layer["name"]: layer for layer in layers}
        stages = [{
            "index": f.index,
            "layers": [{**by_name[node.name], "start": a, "end": b} for node, a, b in f.units],
            "receives": vars_[f.receives] if f.receives else None,
            "sends": vars_[f.sends],
        } for f in flows]
    for rep in (layer for layer in layers if layer["op"] == "repeat"):
        inner = by_block[rep["block"]]["layers"]
        caches.append({"repeat": rep["name"], "count": rep["count"], "layers": [
            _cache(plan, layer, f"{rep['name']}.0.") for layer in inner if OPS[layer["op"]].kv_cache]})
        local_modules += [f"{rep['name']}.*.{k}" for layer in inner if layer["split"]
                          for k in by_block[rep["block"]].get("tp", {})
                          if k == layer["name"] or k.startswith(layer["name"] + ".")]
    every = layers + [layer for b in blocks for layer in b["layers"]]
    ops = {layer["op"] for layer in every}
    features = set().union(*(OPS[layer["op"]].decode_features(layer["attrs"])
                             for layer in every if layer["op"] in OPS))
    return {
        "tokens": lm.tokens,
        "targets": lm.targets,
        "token_var": token_var,
        "prediction_var": prediction_var,
        "vocab": lm.vocab,
        "seq": lm.seq,
        "has_dropout": lm.dropout,
        # the spec's tokenizer.json (data.tokenizer, resolved against the spec's directory), or None
        "tokenizer": plan.data_files.get("tokenizer"),
        "layers": layers,
        "blocks": blocks,
        "caches": caches,
        "rotary": any(c["rotary"] for entry in caches for c in entry["layers"]),
        "rope_scaled": any(c["rope_scaling"] for entry in caches for c in entry["layers"]),
        "qk_norm": any(c["qk_norm"] for entry in caches for c in entry["layers"]),
        "score_scale": any(c["scale"] for entry in caches for c in entry["layers"]),
        "softcap": any(c["softcap"] for entry in caches for c in entry["layers"]),
        "ops": sorted(ops),  # the operators of its layers (and "repeat")
        # what the shared decode code handles (Op.decode_features: "kv_attention", "dense_mlp", ...)
        "features": sorted(features),
        # JAX: the functions named after operators (Op.jax_function) that the decode imports from train.py, and
        # whether a layer caches keys and values (its cached attention projects them together)
        "jax_functions": sorted(op for op in ops if op in OPS and OPS[op].jax_function),
        "kv_cached": any(OPS[op].kv_cache for op in ops if op in OPS),
        "tensor": tensor,
        "local_modules": tuple(sorted(set(local_modules))),
        "stages": stages,
        **(_jax_rope_table(caches) if target == "jax" else {}),
        **(_jax_attention_params(caches, ctx["jax"]["op_attrs"]) if target == "jax" else {}),
    }


def torch_decode_args(layer: dict[str, Any]) -> list[tuple[str, Any]]:
    """The optional keyword arguments of a layer's decode call in the torch generate.py, (name, value) pairs
    (Op.torch_args; `split` set above); [] for a repeat."""
    if layer["op"] not in OPS:
        return []
    return OPS[layer["op"]].torch_args(layer["attrs"], decode=True, split=bool(layer["split"]))


def _jax_rope_table(caches: list[dict[str, Any]]) -> dict[str, Any]:
    """JAX generate.py's rope_table: its parameter and argument past (base, head_dim), the rope scaling, where
    a layer scales its rotary frequencies."""
    scaled = any(c["rope_scaling"] for entry in caches for c in entry["layers"])
    return {"rope_table_params": [("scaling", None)] * scaled, "rope_table_args": ["rope_scaling"] * scaled}


def _jax_attention_params(caches: list[dict[str, Any]], op_attrs: dict[str, Any]) -> dict[str, Any]:
    """JAX generate.py's cached_attention: its optional parameters past (x, p, pre, kv, pos, heads, head_dim),
    (name, default) pairs, each where a layer of the model needs it: grouped-query key/value heads, the rotary
    base and scaling, the q/k norms, a score scale, a softcap, biases (and o_bias where some layer biases only
    q, k and v)."""
    def given(key: str) -> bool:
        return any(c[key] for entry in caches for c in entry["layers"])

    uses = [a for op, attrs in op_attrs.items() if op in OPS and OPS[op].kv_cache for a in attrs]
    biased = [a for a in uses if a["bias"]]
    return {"attention_params": [
        *[("kv_heads", None)] * any(a["kv_heads"] != a["heads"] for a in uses),
        *[("rotary_base", None)] * given("rotary"),
        *[("rope_scaling", None)] * given("rope_scaling"),
        *[("qk_norm", None)] * given("qk_norm"),
        *[("scale", None)] * given("scale"),
        *[("softcap", None)] * given("softcap"),
        *[("bias", False)] * bool(biased),
        *[("o_bias", True)] * any(not a["o_bias"] for a in biased),
    ]}


def _cache(plan: Plan, layer: dict[str, Any], prefix: str) -> dict[str, Any]:
    """What the key/value cache of one attention layer holds (per copy of its repeat, if any)."""
    a = layer["attrs"]
    out_axes = plan.param(f"{prefix}{layer['name']}.k.weight").spec[1]
    heads_axes = [x for x in out_axes if x not in plan.batch_axes]
    return {
        "layer": layer["name"],
        "kv_heads": a["kv_heads"],
        "head_dim": a["head_dim"],
        "rotary": bool(a["rotary"]),
        "rope_scaling": a["rope_scaling"],
        "qk_norm": a["qk_norm"],
        "scale": a["scale"],
        "softcap": a["softcap"],
        "heads_layout": heads_axes or None,  # mesh axes the heads are split over (JAX)
    }
