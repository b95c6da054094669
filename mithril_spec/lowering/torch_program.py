"""Context the torch templates need beyond the shared context (lowering/common.py).

- Tensor variables never shadow a name the generated forward methods use themselves (`self`, `F`,
  `torch`, the block loop variable, helper functions): such a variable gets a trailing `_`.
- What the program holds, so that it holds only what its spec runs (the templates gate every optional
  feature on these): the helper modules it defines (Attention, MLP, PosEmbedding, RMSNorm, BatchNorm,
  Dropout, MoE: only those the spec uses, and within MLP / MoE only the activations its layers use),
  rotary embeddings, a layer's auxiliary loss, the micro-batch bookkeeping (random masks, batch-norm
  buffers), and how the mesh is used (below): one process or several, DDP / FSDP2, sharding over fsdp,
  autocast or FSDP2 mixed precision, expert parallelism. Operators are asked through the registry
  (mithril_spec/ops), never compared by name.
- How the mesh is used, decided here once for the mesh the program is built for:
  `dp`: "ddp" (DistributedDataParallel over data), "fsdp" (FSDP2 fully_shard over fsdp), "hsdp" (FSDP2
  on the 2-D (data, fsdp) mesh; also data x tensor, as HSDP with an fsdp axis of size 1, so that the
  tensor-parallel DTensor parameters stay DTensors for DCP and export), "zero2" (replicated over data
  without DDP: ZeRO-2 reduce-scatters the gradients itself, templates/torch/optimizer.py.j2 Shards) or
  "none".
- `zero`, `master`, `shards`: ZeRO-1/2 over `data` and float32 master weights, which make the optimizer
  step on Shards (per-parameter slices or float32 copies) instead of the parameters; per table row
  `torch_zero_dim`, the torch dimension a parameter's optimizer state is split on (planner/states.py
  zero_dim on its canonical local shape, moved by the nn.Linear transpose; None: whole).
- The tensor-parallel plan for parallelize_module, flat, by module FQN (`blocks.*.attn.q` for every copy
  of a block): colwise / rowwise, and under sequence parallelism (the plan splits the residual stream's
  sequence axis over `tensor`) the sequence-parallel variants and the boundaries of the repeated blocks.
- Per table row (`top_params`, `repeats[*].params`: one per parameter outside the repeats and per block
  parameter, never per copy): `torch_fsdp_dim`, the torch dimension FSDP2 shards (the plan's fsdp
  dimension, moved by the transpose of nn.Linear weights: torch [out, in] vs canonical [in, out]), and
  `expert`, whether the parameter is split over `expert`. Where parameters are split over `data` (and the
  mesh has no other axis: targets/torch.py shard_axis) FSDP2 shards over `data` instead, and
  `torch_fsdp_dim` is the plan's data dimension (None: whole on every rank).
- `input_layouts`: the inputs `sharding.inputs` lays out otherwise than by rows of the batch (read as laid
  out, redistributed to the rows: templates/torch/data.py.j2 relayout).
"""

from __future__ import annotations

import copy
import math
from typing import Any

from ..graph import Node, RepeatNode
from ..ops import OPS
from ..ops.mlp import SILU_GATE
from ..planner.plan import Plan
from ..planner.sizes import DTYPE_BYTES
from ..planner.states import precision_setup, zero_dim
from .base import vocab_parallel_layers
from .comm import torch_comm
from .common import RESERVED, rename_vars
from .costing import Costing
from .jax_program import model_hash, optimizer_settings, spec_hash
from .torch import data_parallel as torch_data_parallel
from .torch import expert_group, pipeline_flow, relaid_inputs, shard_axis, tied_tables
from .torch import sequence_parallel as torch_sequence_parallel

# Names the generated forward methods use besides tensor variables.
MODEL_NAMES = {"F", "torch", "nn", "np", "math", "self", "block", "rope", "zlib", "checkpoint", "layers",
               "selective_remat", "loss_fn", "moe_aux_loss", "CarryAuxLoss"}

# Classes and names the program defines at module level: a block class must not take one of them.
PROGRAM_NAMES = {"Model", "Attention", "MLP", "LayerNorm", "RMSNorm", "BatchNorm", "Dropout", "PosEmbedding", "Data",
                 "Metrics", "F", "DDP", "MoE", "Weights", "Holder", "RingPass", "CONTEXT", "RING", "ToTensorRanks",
                 "SumTensorRanks", "CarryAuxLoss", "AUX_LOSS"}



def _rename(scope: dict[str, str], taken: set[str]) -> dict[str, str]:
    return rename_vars(scope, MODEL_NAMES | taken)


def attr_path(name: str) -> str:
    """A parameter's canonical name as a Python attribute path from the model: blocks.0.ln.weight ->
    blocks[0].ln.weight (ModuleList items are indexed)."""
    out = ""
    for part in name.split("."):
        out += f"[{part}]" if part.isdigit() else (("." if out else "") + part)
    return out


def _styles(ctx_tp: dict[str, str], prefix: str, nodes, sp: bool) -> dict[str, str]:
    """parallelize_module styles for the layers of one scope (`prefix` is "" or "blocks.*.")."""
    out: dict[str, str] = {}
    for node in nodes:
        if not isinstance(node, Node):
            continue
        mine = {k: v for k, v in ctx_tp.items() if k == node.name or k.startswith(node.name + ".")}
        kind = OPS[node.op].tensor_parallel
        if kind in ("experts", "gather"):
            # not parallelize_module styles: the layer splits its own parameters (split_tensor): a moe layer its
            # experts' hidden features, gathering the sequence first under sequence parallelism ("experts_sp");
            # a batch_norm its channels (targets/torch.py refuses it in a sequence-parallel block)
            if mine:
                out[prefix + node.name] = "experts_sp" if sp and kind == "experts" else kind
            continue
        if mine and node.attrs.get("qk_norm"):
            # the q/k norms see this rank's heads: whole weights on head shards, their gradients summed
            out.update({f"{prefix}{node.name}.{n}": "heads_norm" for n in ("q_norm", "k_norm")})
        if not sp:
            out.update({prefix + k: v for k, v in mine.items()})
            if len(OPS[node.op].input_projections(node.attrs)) > 1 and mine:
                out[prefix + node.name] = "replicate_input"  # q, k, v (gate, up) share one input-gradient all-reduce
            continue
        # Sequence parallel: activations between layers hold seq / tensor positions on each rank.
        if kind == "pair":
            out[prefix + node.name] = "gather_input"  # all-gather the sequence once for q, k, v (fc, gate, up)
            for k, v in mine.items():
                out[prefix + k] = "colwise" if v == "colwise" else "rowwise_sp"  # reduce-scatter the output
        elif kind and mine:  # "linear": column- or row-parallel by its weight's layout
            style = mine[node.name]
            out[prefix + node.name] = "colwise_sp" if style == "colwise" else "rowwise_sp"
        elif node.params:  # norms (and linear layers not split): whole weights on sequence shards
            out[prefix + node.name] = "sequence"
    return out


def sequence_dropout(plan: Plan) -> dict[str, list[str]]:
    """The dropout layers inside sequence-parallel blocks (repeat -> layer names): they see this rank's
    positions and keep that slice of the whole sequence's masks."""
    out = {}
    for node in plan.graph.layers:
        if isinstance(node, RepeatNode) and torch_sequence_parallel(plan, node):
            # (per-position random layers: dropout; attention gathers the sequence and keeps its heads')
            names = [x.name for x in node.layers if OPS[x.op].per_position and OPS[x.op].is_random(x.attrs)]
            if names:
                out[node.name] = names
    return out


def _is_stage_class(name: str) -> bool:
    return name.startswith("Stage") and name[5:].isdigit()  # the pipeline's stage modules


def _pipeline(plan: Plan, layers: list[dict[str, Any]], top_vars: dict[str, str]) -> dict[str, Any] | None:
    """The stages of a pipelined build (more than one stage): per stage its layers (a repeat with the
    copies it runs), the model inputs it reads (first stage), the tensor it receives and the one it sends
    (the loss prediction from the last stage)."""
    pp = plan.pipeline
    if pp is None or len(pp.stages) < 2:
        return None
    flows, _ = pipeline_flow(plan)  # the target check has rejected any problem
    by_name = {layer["name"]: layer for layer in layers}
    stage_of = {node.name: f.index for f in flows for node, _, _ in f.units}
    stages = []
    for f in flows:
        units = []
        for node, a, b in f.units:
            layer = copy.deepcopy(by_name[node.name])
            if layer["op"] == "repeat":
                layer["start"], layer["end"] = a, b
            units.append(layer)
        stages.append({
            "index": f.index,
            "class_name": f"Stage{f.index}",
            "rank": f.index % pp.pipe,
            "layers": units,
            "inputs": [top_vars[i] for i in f.inputs],
            "input_names": list(f.inputs),
            "receives": top_vars[f.receives] if f.receives else None,
            "sends": top_vars[f.sends],
            "describe": ", ".join(pp.stages[f.index].units),
            # the embedding layers of other stages whose table a tied layer of this stage reads: it holds a copy
            "copies": [dict(copy.deepcopy(by_name[name]), table_stage=stage_of[name]) for name in f.copies],
            # it holds a layer with a loss of its own (moe): its gradient starts at the stage's output
            "aux_loss": any(OPS[x.op].has_aux_loss for node, _, _ in f.units
                            for x in (node.layers if node.is_repeat else (node,))),
        })
    return {"pipe": pp.pipe, "virtual": pp.virtual, "n_stages": len(pp.stages), "microbatches": pp.microbatches,
            "schedule": pp.schedule, "stages": stages, "tied": tied_tables(plan),
            "first_inputs": list(flows[0].inputs), "targets": plan.graph.loss.targets}


def target_fields(plan: Plan, ctx: dict[str, Any], costing: Costing) -> dict[str, Any]:
    """`costing`: the build's one costing (lowering/costing.py); the program's planned bytes are its states."""
    mesh = plan.mesh
    D, Fs, T = mesh.data, mesh.fsdp, mesh.tensor

    # ---- variables
    top = {i["name"]: i["var"] for i in ctx["inputs"]}
    top.update({layer["name"]: layer["var"] for layer in ctx["layers"]})
    top_vars = _rename(top, set())
    inputs = copy.deepcopy(ctx["inputs"])
    for i in inputs:
        i["var"] = top_vars[i["name"]]

    ops: set[str] = set()  # operators the model uses; `<op>_rng` for those that draw random numbers
    helpers: set[str] = set()  # the shared definitions their macros call (ops/base.py `helpers`)
    activations: dict[str, set[str]] = {}  # by operator (mlp, moe): the activations its layers use
    forms: set[str] = set()  # the variants of the operators' own code its layers use (ops/base.py `forms`)
    rotary = rope_scaled = qk_norm = rms_offset = gelu_gate = score_scale = softcap = False

    def annotate(layer: dict[str, Any], vars_: dict[str, str]) -> dict[str, Any]:
        nonlocal rotary, rope_scaled, qk_norm, rms_offset, gelu_gate, score_scale, softcap
        layer["var"] = vars_[layer["name"]]
        layer["input_vars"] = [vars_[n] for n in layer["inputs"]]
        if layer["op"] in OPS:  # not a repeat
            attrs = layer["attrs"]
            if attrs.get("tie"):
                layer["tie_attr"] = attr_path(attrs["tie"])
            # its module's optional arguments (name, value), rendered with the `optional` macro (torch/macros.py.j2)
            layer["init_args"] = OPS[layer["op"]].torch_args(attrs)
            ops.add(layer["op"])
            helpers.update(OPS[layer["op"]].helpers(attrs))
            if OPS[layer["op"]].is_random(attrs):
                ops.add(layer["op"] + "_rng")
            if attrs.get("activation"):
                activations.setdefault(layer["op"], set()).add(attrs["activation"])
            forms.update(OPS[layer["op"]].forms(attrs))
            rotary |= bool(attrs.get("rotary"))
            rope_scaled |= bool(attrs.get("rope_scaling"))
            qk_norm |= bool(attrs.get("qk_norm"))
            score_scale |= bool(attrs.get("scale")) and bool(attrs.get("heads"))  # (an attention's)
            softcap |= bool(attrs.get("softcap"))
            rms_offset |= bool(attrs.get("weight_offset"))
            gelu_gate |= attrs.get("gate_activation", SILU_GATE) != SILU_GATE
        return layer

    # block classes: never a name the program uses for something else, nor a builtin (`Exception`)
    classes: dict[str, str] = {}
    for block in ctx["blocks"]:
        name = block["class_name"]
        while name in PROGRAM_NAMES or name in RESERVED or name in classes.values() or _is_stage_class(name):
            name += "Block"
        classes[block["name"]] = name

    layers = [annotate(layer, top_vars) for layer in copy.deepcopy(ctx["layers"])]
    for layer in layers:
        if layer["op"] == "repeat":
            layer["class_name"] = classes[layer["block"]]

    blocks = []
    for block in copy.deepcopy(ctx["blocks"]):
        scope = {"block_input": "block_input"}
        scope.update({layer["name"]: layer["var"] for layer in block["layers"]})
        vars_ = _rename(scope, set())
        block["input_var"] = vars_["block_input"]
        for layer in block["layers"]:
            annotate(layer, vars_)
        block["output_var"] = vars_[block["output"]]
        block["class_name"] = classes[block["name"]]
        blocks.append(block)

    loss = dict(ctx["loss"])
    loss["prediction_var"] = top_vars[loss["prediction"]]
    loss["targets_var"] = top_vars[loss["targets"]]
    # the loss targets are computed by the model (a layer's output, not a model input): the layers return them
    # beside the prediction, and so does predict=True for the evaluation, which compares with them
    computed = loss["targets"] not in {i["name"] for i in ctx["inputs"]}
    loss["outputs"] = [loss["prediction_var"]] + ([loss["targets_var"]] if computed else [])
    loss["predict_targets"] = computed and ctx["eval"] is not None
    loss["predict_outputs"] = [loss["prediction_var"]] + ([loss["targets_var"]] if loss["predict_targets"] else [])

    # ---- data parallelism (the expert axis splits the batch too: DDP over data x expert). Pipeline stages
    # replicate over data with FSDP2 (fsdp = 1), not DDP: DDP's reducer fails under the interleaved schedule.
    P, X, C = mesh.pipe, mesh.expert, mesh.context
    dp = torch_data_parallel(plan)
    group = expert_group(plan) if X > 1 else ()

    # ---- tensor (and sequence) parallelism
    tp_plan: dict[str, str] = {}
    sp_repeats: list[dict[str, Any]] = []
    vocab_tables: set[str] = set()
    if T > 1:
        tp_plan.update(_styles(ctx["tp"], "", plan.graph.layers, False))
        # vocab-parallel: the table's rows split (each rank looks up its rows, the lookups all-reduced), the
        # output layer's logits left split for loss_parallel's cross-entropy
        vocab_tables, heads = vocab_parallel_layers(plan)
        for name in vocab_tables:
            tp_plan[name] = "vocab_rows"
        for name in heads:
            if name in tp_plan:
                tp_plan[name] = "colwise_logits"
        block_tp = {b["name"]: b["tp"] for b in ctx["blocks"]}
        for node in plan.graph.layers:
            if isinstance(node, RepeatNode):
                sp = torch_sequence_parallel(plan, node)
                tp_plan.update(_styles(block_tp.get(node.block, {}), f"{node.name}.*.", node.layers, sp))
                if sp:
                    sp_repeats.append({"name": node.name, "count": node.count})
                    tp_plan[f"{node.name}.0"] = "split_sequence"  # stream in: keep this rank's positions
                    # stream out: every position again (the same module when there is one copy)
                    last = f"{node.name}.{node.count - 1}"
                    tp_plan[last] = "split_and_gather" if node.count == 1 else "gather_sequence"

    # ---- parameters: the torch-side fields of the table rows (one per parameter outside the repeats and per
    # block parameter, lowering/common.py), which the config tables (common/tables.py.j2) render
    # ZeRO (over `data` alone: the torch target refuses it with other axes): the degree each parameter's
    # optimizer state is split over, on the dimension the planner counts (planner/states.py zero_dim)
    tr = plan.spec.training
    zero_degree = D if tr.zero and D > 1 else 1

    def torch_dim(d: int | None, p: dict[str, Any]) -> int | None:
        # nn.Linear weights are [out, in] in torch: a canonical dimension moves with the transpose
        return None if d is None else (1 - d if p["transpose"] else d)

    # FSDP2 shards over `fsdp`, or over `data` where the plan splits parameters over it (targets/torch.py)
    axis = shard_axis(plan)

    def torch_row(p: dict[str, Any]) -> dict[str, Any]:
        zd = zero_dim(tuple(p["local_shape"]), zero_degree)
        expert = X > 1 and any(a and "expert" in a for a in p["layout"])
        # (the experts split over `expert` are the program's own DTensors, left alone by FSDP2)
        sd = None if expert else next((i for i, d in enumerate(p["layout"]) if d and axis in d), None)
        return {**p, "torch_fsdp_dim": torch_dim(sd, p), "torch_zero_dim": torch_dim(zd, p), "expert": expert,
                # the mesh axes of each dimension (experts are not nn.Linear weights: the canonical layout)
                "expert_layout": [[a for a in (d or []) if mesh.size(a) > 1] for d in p["layout"]] if expert else None}

    top_params = [torch_row(p) for p in ctx["top_params"]]
    repeats = [{**r, "params": [torch_row(p) for p in r["params"]]} for r in ctx["repeats"]]
    rows = top_params + [p for r in repeats for p in r["params"]]

    precision = plan.spec.training.precision
    pdtype = precision.params
    fsdp = dp in ("fsdp", "hsdp")
    mixed = precision.compute != precision.params
    random = any(o.endswith("_rng") for o in ops)
    expert_params = any(p["expert"] for p in rows)
    _, master, slots, slot_bytes = precision_setup(plan.spec)  # optimizer state per parameter, as the plan counts
    zero = tr.zero if zero_degree > 1 else 0  # (one data rank: nothing to split)
    devices = plan.mesh.devices
    held = costing.held
    out = {
        "inputs": inputs,
        "layers": layers,
        "blocks": blocks,
        "loss": loss,
        "top_params": top_params,
        "repeats": repeats,
        "spec_hash": spec_hash(plan),
        "model_hash": model_hash(plan),
        "optimizer_settings": optimizer_settings(plan),
        "torch": {
            # what the program holds: only what its spec runs
            "ops": sorted(ops),
            "helpers": sorted(helpers),
            "activations": {op: sorted(a) for op, a in activations.items()},  # mlp / moe activations in use
            "forms": sorted(forms),  # the variants of the operators' code in use (moe: normalize, shared, ...)
            "rotary": rotary,
            "rope_scaled": rope_scaled,  # an attention layer scales its rotary frequencies (rope_scaling)
            "qk_norm": qk_norm,  # an attention layer normalises each head of q and k (HeadNorm)
            "rms_offset": rms_offset,  # an rms_norm adds an offset to its weight (Gemma's 1 + weight)
            "gelu_gate": gelu_gate,  # a swiglu mlp gates with gelu (GeGLU)
            "score_scale": score_scale,  # an attention layer scales its scores other than by 1 / sqrt(head_dim)
            "softcap": softcap,  # an attention layer caps its scores
            "has_buffers": bool(ctx["buffers"]),
            "aux_loss": any(OPS[o].has_aux_loss for o in ops if o in OPS),  # the model adds a layer's loss
            # where the current micro-batch sits (dropout masks, batch-norm bookkeeping read it)
            "micro_state": random or bool(ctx["buffers"]),
            "random": random,  # dropout masks drawn (Dropout)
            # dropout layers on a sequence split over `tensor`: repeat -> layer names
            "sequence_dropout": sequence_dropout(plan) if T > 1 else {},
            "distributed": devices > 1,
            "dp": dp,
            "fsdp": fsdp,  # FSDP2 fully_shard (dp fsdp or hsdp)
            "sharded": mesh.size(axis) > 1,  # FSDP2 shards over an fsdp (or data) axis larger than 1
            "shard_axis": axis,  # the mesh axis FSDP2 shards over
            # sharding.inputs other than rows of the batch: name -> mesh axes per dimension (read as laid out,
            # redistributed to the rows: templates/torch/data.py.j2 relayout)
            "input_layouts": relaid_inputs(plan),
            # embedding tables split on their vocabulary (tensor parallel); the logits then come out split
            # and the loss runs under loss_parallel
            "vocab_tables": sorted(vocab_tables),
            "vocab_tied": any(not n.is_repeat and (n.attrs.get("tie") or "").rsplit(".", 1)[0] in vocab_tables
                              for n in plan.graph.layers),
            "vocab_parallel": bool(vocab_tables) or "colwise_logits" in tp_plan.values(),
            # a linear layer tied to a table that stays whole over `tensor` (TiedHead under FSDP2)
            "plain_tied": any(not n.is_repeat and n.attrs.get("tie")
                              and n.attrs["tie"].rsplit(".", 1)[0] not in vocab_tables for n in plan.graph.layers),
            # batch_norm under data parallelism: statistics over the ranks of these batch axes (SyncBatchNorm)
            "sync_bn": [a for a in plan.batch_axes if plan.mesh.size(a) > 1]
            if any(OPS[o].batch_statistics for o in ops if o in OPS) else [],
            # parameters the plan keeps whole under fsdp (no dimension divides; over `data`: those not split
            # over it): FSDP2 ignores them (its dimension-0 padding would hold other bytes than the plan),
            # reduce_whole_grads averages theirs
            "whole": mesh.size(axis) > 1 and any(p["torch_fsdp_dim"] is None and not p["expert"] for p in rows),
            "mixed": mixed,  # compute dtype differs from the parameters' dtype
            "autocast": mixed and not fsdp,  # torch.autocast (FSDP2 casts with its MixedPrecisionPolicy)
            "tp_plan": tp_plan,
            # moe layers whose experts' hidden features are split over `tensor` (MoE.split_tensor)
            "tp_experts": bool({"experts", "experts_sp"} & set(tp_plan.values())),
            # batch_norm layers whose channels are split over `tensor` (BatchNorm.split_tensor)
            "tp_channels": "gather" in tp_plan.values(),
            "sp_repeats": sp_repeats,
            "transposed": any(p["transpose"] for p in rows),  # some nn.Linear weight (stored [out, in])
            "mesh3": {"data": D, "fsdp": Fs, "tensor": T},
            # every mesh axis the program builds its device mesh with, in canonical order (pipe and
            # expert only when split)
            "mesh_axes": ({"pipe": P} if P > 1 else {}) | {"data": D, "fsdp": Fs} | (
                {"expert": X} if X > 1 else {}) | ({"context": C} if C > 1 else {}) | {"tensor": T},
            # context parallelism: the ranks of the `context` axis (None without it; planner/context_parallel.py)
            "context": C if plan.context_sequence_axis else None,
            "expert": X,
            "ep": X > 1 and expert_params,  # experts split over `expert` (all-to-all)
            # the axes of the experts' dimension 0 (`expert`, or `expert` and `fsdp`): the all-to-all's group
            "expert_group": list(group),
            # their gradients (summed over that group by the all-to-all's backward) are summed over the other
            # batch axes too, and divided by every rank summed over: the mean over the batch
            "expert_sum": [a for a in plan.batch_axes if mesh.size(a) > 1 and a not in group],
            "expert_divisor": math.prod(mesh.size(a) for a in set(group) | set(plan.batch_axes)),
            # FSDP2 beside `expert` (fsdp, tensor, pipe): the program averages the gradients over `expert` too
            "expert_average": X > 1 and fsdp,
            "pipeline": _pipeline(plan, layers, top_vars),
            # a pipeline spec built for one stage runs its micro-batches one after the other
            "chunks": plan.pipeline.microbatches if plan.pipeline and len(plan.pipeline.stages) == 1 else 1,
            "optimizer_slots": slots,
            "slot_bytes": slot_bytes,  # bytes per optimizer-state element (4 with master weights)
            "zero": zero,  # ZeRO stage over `data` (0: the optimizer steps on the parameters themselves)
            "master": master,  # a float32 master copy of the 16-bit parameters
            # the optimizer steps on Shards (ZeRO slices or master copies) rather than on the parameters
            "shards": bool(zero or master),
            "param_bytes": DTYPE_BYTES[pdtype],
            # per-rank bytes the build's costing predicts (plan.json); every rank reports what it holds
            "planned": {"params": held.params, "grads": held.grads, "optimizer": held.optimizer,
                        "buffers": held.buffers},
            "comm": torch_comm(plan),  # communication: DDP hook, FSDP2 reduce dtype and prefetch, NCCL_ALGO
            "job_name": "".join(c if c.isalnum() or c in "_.-" else "-" for c in plan.spec.name),
        },
    }
    t = out["torch"]
    # parallelize() exists: a tensor-parallel plan or FSDP2 (the model is parallelised on the meta device)
    t["parallelized"] = bool(t["tp_plan"]) or fsdp
    # the parameters are stored in another dtype than float32 (store_params casts the meta model)
    t["store_params"] = pdtype != "float32"
    # Attention projects q, k and v separately: tensor parallelism (whole heads per rank), FSDP2 (a joined copy
    # of the gathered weights would live from the forward to the backward pass), float8 (a Float8Linear each)
    t["separate_qkv"] = bool(t["tp_plan"]) or fsdp or precision.float8
    # what a checkpoint holds beside the model, optimizer and scheduler: the names of the training loop's
    # objects passed by keyword (Shards: ZeRO slices or master copies; the loss scaler)
    t["checkpoint_state"] = [name for name, on in (("shards", t["shards"]),
                                                   ("scaler", ctx["training"]["loss_scaling"])) if on]
    # what export_params and export_grads take beside their arguments: a pipeline stage's process group
    t["stage_args"] = ["pipe_group"] if t["pipeline"] else []
    # the context managers around each micro-batch's forward pass (main.py): autocast, activation offload
    t["step_contexts"] = [name for name, on in (("autocast", t["autocast"]),
                                                ("offload", ctx["predicted"]["offload"])) if on]
    # how FSDP2 runs (parallelize's docstring): "hsdp" (sharded over fsdp, replicated over data), "data"
    # (sharded over data), "fsdp" (sharded over fsdp), "pipe" / "replicate" (fsdp = 1: replication over data,
    # in a pipeline / beside tensor parallelism), "none"
    sharded = t["sharded"]
    t["fsdp_kind"] = ("none" if not fsdp else "hsdp" if sharded and dp == "hsdp" else "data" if sharded and axis == "data"
                      else "fsdp" if sharded else "pipe" if t["pipeline"] and not t["tp_plan"] else "replicate")
    # reduce_expert_grads runs after the backward pass: experts split over `expert`, or FSDP2 beside `expert`
    t["reduce_experts"] = t["ep"] or t["expert_average"]
    # a vocab-parallel table outside FSDP2: keep_table_rows after the backward pass
    t["keep_table_rows"] = bool(vocab_tables) and not fsdp
    # gradients synchronised on the last micro-step only (DDP no_sync, FSDP2 set_requires_gradient_sync)
    t["sync_last_micro"] = dp == "ddp" or fsdp
    # a pipeline spec built for one stage with dropout: each micro-step draws its masks as pipeline
    # micro-batch k % chunks of the spec's micro-batch (as a pipelined build draws them)
    t["chunk_masks"] = t["micro_state"] and t["chunks"] > 1 and random
    if t["pipeline"]:
        # the class each pipeline stage runs as (identifiers, pipeline_main.py.j2): PipelineStage, or MaskedStage
        # (micro-batch ids for dropout / batch_norm), under AuxStage where moe layers add load-balancing losses
        base = "MaskedStage" if t["micro_state"] else "PipelineStage"
        t["pipeline"].update(stage_base=base, stage_class="AuxStage" if t["aux_loss"] else base)
    # batch statistics over several batch axes: their flattened mesh's group (else the one axis's)
    t["sync_bn_flat"] = len(t["sync_bn"]) > 1
    # the all-to-all's group spans several mesh axes (expert and fsdp): a group per column of the mesh
    t["expert_flat"] = len(group) > 1
    # the experts' DTensors are laid out by expert_parallel (several axes, or `tensor` too)
    t["expert_layouts"] = len(group) > 1 or t["tp_experts"]
    # Dropout.forward takes the attention probabilities' heads (attention dropout, without context parallelism,
    # whose context_keep draws them instead): (this rank's first head, the layer's heads)
    t["dropout_heads"] = "attention_rng" in ops and not t["context"]
    t["dropout_params"] = [("heads", None)] if t["dropout_heads"] else []
    # DDP's process group: the ranks of these batch axes (data, expert), flattened when there are two
    t["ddp_axes"] = (["data", "expert"] if D > 1 else ["expert"]) if X > 1 else ["data"]
    t["ddp_flat"] = len(t["ddp_axes"]) > 1
    # MESH lists every axis the program builds its device mesh with (mesh_axes: pipe, expert, context too),
    # else the (data, fsdp, tensor) mesh (mesh3)
    t["mesh_every_axis"] = bool(t["pipeline"]) or X > 1 or bool(t["context"])
    # ZeRO in a pipeline (dp zero1): the program all-reduces the gradients itself, no DDP
    t["zero_all_reduce"] = bool(zero) and dp == "zero1"
    # ZeRO slices without master copies: views into the parameters (strided on a later dimension)
    t["zero_views"] = bool(zero) and not master
    # lr_at's formula (templates/torch/optimizer.py.j2): "noam", "cosine" (both with their warmup), "warmup"
    # (linear, then constant) or "constant"
    sched = plan.spec.training.schedule
    t["lr_schedule"] = sched.name if sched.name in ("noam", "cosine") else (
        "warmup" if sched.warmup_steps else "constant")
    # the mesh axes FSDP2 runs on: (data, fsdp) for HSDP, else the axis it shards over
    t["fsdp_mesh"] = ["data", "fsdp"] if dp == "hsdp" else [axis]
    # the helper modules' optional parameters with their defaults, (name, default) pairs in signature order: only
    # those some layer of the spec sets (templates/torch/ops.py.j2 renders them with the `optional` macro)
    t["rope_params"] = [("scaling", None)] if rope_scaled else []
    t["attention_params"] = [("rotary_base", None)] + [(k, None) for k, on in (
        ("rope_scaling", rope_scaled), ("qk_norm", qk_norm), ("scale", score_scale), ("softcap", softcap)) if on] + [
        ("bias", False), ("o_bias", None)] + ([("dropout", 0.0)] if "attention_rng" in ops else [])
    t["mlp_params"] = [("gate_act", SILU_GATE)] if gelu_gate else []
    t["moe_params"] = [(k, v) for k, v, form in (
        ("normalize", False, "normalize"), ("dropless", False, "dropless"), ("shared_hidden", 0, "shared"),
        ("shared_gate", False, "shared_gate"), ("z_loss_weight", 0.0, "z_loss")) if form in forms]
    # the next steps' batches drawn by a thread while this one runs (torch/data.py.j2 `prefetched`): not in a
    # pipeline, and not where a bounded input's ids are checked on the host as they are read
    t["prefetch"] = not t["pipeline"] and (ctx["data"]["kind"] == "synthetic"
                                           or not any(i["bounded"] for i in ctx["inputs"]))
    # templates/torch/ops.py.j2 TiedHead: a sharded FSDP2 program's tied output layer (plain tensors: no
    # tensor parallelism, no pipeline stages, no autocast)
    t["tied_head"] = bool(t["plain_tied"] and t["sharded"] and t["fsdp"] and not t["tp_plan"]
                          and not t["pipeline"] and not t["autocast"])
    return out
