"""Context the jax templates need beyond the shared context (lowering/common.py).

- Tensor variables never shadow a name the JAX model code uses itself (its op helpers, `P`, the block
  functions): such a variable gets a trailing `_`, like context.var does for the shared reserved names.
- Activation layouts: for each layer output, the mesh axes of each dimension (batch first). The batch
  dimension takes the plan's batch axes; a feature dimension takes the mesh axes its logical axis is
  ruled to, less the batch axes (a feature dimension is never split over a data axis), when they divide
  it. The program pins such a layout with `with_sharding_constraint` where it is more than batch
  splitting (tensor-parallel features), on every block output (the residual stream) and after
  embedding lookups.
- Which op helpers the program needs (with the attrs of every layer of each op, so a helper holds only
  the code some layer runs), and whether it carries buffers (batch_norm), dropout keys or a
  load-balancing loss (moe). Operators are asked through the registry (`OPS[kind]`), not by name.
- The flags that keep out of the program what its spec never runs: master weights, ZeRO, the number of
  micro-batches a step accumulates over (one: no loop).
- moe layers: their per-sample capacity, and the two layouts of the dispatched tokens [B, E, C, d] the
  program pins (like the tokens: batch split; like the experts: experts split over the experts' mesh axes).
- The train state stacks each parameter (and buffer) of a repeated block over the block's copies:
  `<repeat>.*.<param>` = [copies, ...], laid out as one copy with the copy dimension first (`stack_axis`:
  whole, or split over `pipe` for the pipelined block), and the forward runs the block under lax.scan.
  Every stacked parameter has one row in the program's tables, so the program does not grow with depth.
- The pipeline (`jax.pipeline`, only with more than one stage): the repeated block it splits, the layers
  before and after it, and the order of the copies in its stacked arrays (each pipe rank's stages'
  copies in a row).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from ..graph import RepeatNode
from ..ops import OPS, TensorType
from ..planner.plan import Plan
from .comm import jax_comm
from .common import RESERVED, rename_vars
from .costing import Costing
from .parts import jax_model

# Names the generated model code uses inside the functions that hold tensor variables.
MODEL_NAMES = {
    "P", "jax", "jnp", "np", "optax", "zlib", "math", "linear", "layer_norm", "rms_norm", "batch_norm",
    "embedding", "attention", "rope", "mlp", "conv2d", "max_pool2d", "avg_pool2d", "dropout", "layer_key",
    "cross_entropy", "mse", "train", "remat", "forward", "loss_fn", "pre", "p", "batch", "buffers", "key", "x", "i",
    "block", "REMAT", "COMPUTE_DTYPE", "moe", "aux", "aux_loss", "pre_forward", "post_loss",
    "positions", "ring_attention", "CONTEXT",  # context parallelism (jax/context.py.j2)
}  # fmt: skip


def _activation_layout(t: TensorType, plan: Plan) -> list:
    """Mesh axes per dimension of [batch, *t.shape] (the plan's activation layout): None where whole."""
    return [list(plan.batch_axes) or None] + [list(d) or None for d in plan.activation_layout(t)]


def _moe(layer: dict[str, Any], plan: Plan, prefix: str) -> None:
    """The two layouts of the dispatched tokens [B, E, C, d] (the capacity C per sample is the plan's:
    `attrs["capacity"]`, decided by ops/moe.py)."""
    batch = list(plan.batch_axes)
    form = "gate" if layer["attrs"]["activation"] == "swiglu" else "fc"
    experts = list(plan.param(f"{prefix}{layer['name']}.experts.{form}.weight").spec[0])
    layer["moe_tokens_layout"] = [batch or None, None, None, None]
    layer["moe_experts_layout"] = [[x for x in batch if x not in experts] or None, experts or None, None, None]
    # dropless routing keeps every choice: without the experts split over a mesh axis they run as grouped
    # matmuls over the chosen rows (jax.lax.ragged_dot), not over every expert's slot for every token
    layer["moe_grouped"] = bool(layer["attrs"]["dropless"] and not experts)


def _pipeline(plan: Plan, layers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pipeline of a build with more than one stage (targets/jax.py rejects what this cannot run: it
    pipelines the copies of one repeated block, from one repeat or from consecutive repeats of the block,
    as the planner's even split or `stage:` / `device:` placement gives them to the stages).

    The train state stacks every pipelined copy in one array per block parameter, "<first repeat>.*.<param>",
    whose row q holds copy order[q] of the pipelined copies (numbered along the repeats: `copies` names
    them) or, -1, a padding row: SPMD needs every stage of the same shape, so each stage has per_stage rows,
    the largest stage's copies, and a stage with fewer copies skips its padding rows (zeros: never used,
    zero gradients, never updated)."""
    pp = plan.pipeline
    if pp is None or pp.pipe <= 1:
        return None
    from .jax import pipelined_repeats

    reps = [r.name for r in pipelined_repeats(plan)]
    name = reps[0]
    at = next(i for i, layer in enumerate(layers) if layer["name"] == name)
    count = {r: layers[at + k]["count"] for k, r in enumerate(reps)}
    # the pipelined copies, numbered along the repeats: canonical name prefix of each
    names = [f"{r}.{i}" for r in reps for i in range(count[r])]
    number = {c: n for n, c in enumerate(names)}
    stage_rows = [[number[f"{r}.{i}"] for r, i in s] for s in pp.stage_copies]
    per = max(map(len, stage_rows))
    block = {r: layers[at + k]["block"] for k, r in enumerate(reps)}
    kinds = list(dict.fromkeys(block.values()))
    groups = None
    if len(kinds) > 1:
        groups = _groups(pp, reps, block, kinds, number)
    # stacked row q holds copy order[q]: pipe rank r's rows are those of its stages r, r + pipe, ..., each
    # stage's copies then its padding (-1)
    order = [c for r in range(pp.pipe) for v in range(pp.virtual)
             for c in stage_rows[v * pp.pipe + r] + [-1] * (per - len(stage_rows[v * pp.pipe + r]))]
    # the planner's even split of one repeat: the program computes the order from PIPE, VIRTUAL_STAGES and
    # PER_STAGE (stage s holds copies s * PER_STAGE ...); any other split is written out
    even = [(v * pp.pipe + r) * per + c for r in range(pp.pipe) for v in range(pp.virtual) for c in range(per)]
    last = at + len(reps) - 1
    pre, post = layers[:at], layers[last + 1:]
    return {
        "repeat": layers[at],  # the first pipelined repeat: it names the stacked arrays
        "last": layers[last],  # the last one: the layers after the pipeline read its output
        "repeats": tuple(reps),
        # canonical name prefix of each pipelined copy, when they come from several repeats
        "copies": tuple(names) if len(reps) > 1 else None,
        "pre": pre,
        "post": post,
        # model inputs that the layers before / after the block read
        "pre_reads": sorted({n for layer in pre + [layers[at]] for n in layer["inputs"]}),
        "post_reads": sorted({n for layer in post for n in layer["inputs"]}),
        # moe layers before / after the block: their load-balancing losses join the micro-batch's loss
        "pre_aux": any(OPS[layer["op"]].has_aux_loss for layer in pre if layer["op"] in OPS),
        "post_aux": any(OPS[layer["op"]].has_aux_loss for layer in post if layer["op"] in OPS),
        "pipe": pp.pipe,
        "virtual_stages": pp.virtual,
        "microbatches": pp.microbatches,
        "schedule": pp.schedule,
        "per_stage": per,
        "order": tuple(order),
        "even": order == even and not groups,  # STACK_ORDER follows from PIPE, VIRTUAL_STAGES and PER_STAGE
        # some stage skips padding rows (several blocks: some stack has padding rows)
        "padded": any(-1 in o for o in groups["orders"].values()) if groups else -1 in order,
        # rank 0 shares the finished micro-batches: each pipe rank runs the head on its own share when
        # the pipe ranks divide them, else every rank on all of them
        "share_outputs": pp.microbatches % pp.pipe == 0,
        # several blocks (heterogeneous stages): one stack per block, and each stage's runs of copies
        "groups": groups,
        "blocks": tuple(kinds),
    }


def _groups(pp, reps: list[str], block: dict[str, str], kinds: list[str], number: dict[str, int]) -> dict[str, Any]:
    """Heterogeneous stages: the pipelined repeats repeat several blocks. The train state stacks the copies
    of each block in one array per block parameter, named after the block's first pipelined repeat (the
    group's head), whose rows are, per pipe rank, per_stage[block] rows for each of its stages: that stage's
    copies of the block, then padding (-1). Each stage runs its copies in order, as runs of consecutive
    copies of one block: (head, first row within the stage's rows, end row, copy numbers)."""
    head = {k: next(r for r in reps if block[r] == k) for k in kinds}
    stage_of_kind = [[[number[f"{r}.{i}"] for r, i in s if block[r] == k] for s in pp.stage_copies] for k in kinds]
    per = {head[k]: max(1, max(map(len, stage_of_kind[n]))) for n, k in enumerate(kinds)}
    orders = {}
    for n, k in enumerate(kinds):
        rows = stage_of_kind[n]
        orders[head[k]] = tuple(c for r in range(pp.pipe) for v in range(pp.virtual)
                                for c in rows[v * pp.pipe + r] + [-1] * (per[head[k]] - len(rows[v * pp.pipe + r])))
    runs = []
    for s in pp.stage_copies:
        out: list[list] = []
        seen = {h: 0 for h in per}
        for r, i in s:
            h = head[block[r]]
            if out and out[-1][0] == h:
                out[-1][2] += 1
                out[-1][3].append(number[f"{r}.{i}"])
            else:
                out.append([h, seen[h], seen[h] + 1, [number[f"{r}.{i}"]]])
            seen[h] += 1
        runs.append(tuple((h, a, b, tuple(c)) for h, a, b, c in out))
    return {"heads": tuple(head[k] for k in kinds), "stacked": tuple(f"{head[k]}.*." for k in kinds), "block_of": {head[k]: k for k in kinds}, "per_stage": per,
            "orders": orders, "runs": tuple(runs)}


def _pipeline_roles(pp: dict[str, Any], blocks: list[dict[str, Any]], inputs: list[dict[str, Any]], dropout: bool,
                    scaled: bool, circular: bool, predicts: bool) -> None:
    """What the pipeline's functions (templates/jax/pipeline.py.j2) take and return beyond their fixed
    arguments, decided from the layers before the pipelined block (`pre`), its blocks and the layers after it
    (`post`): batch_norm's buffers, dropout keys, `train` (a layer that runs differently in the evaluation),
    moe's load-balancing losses, the loss scale. Each list holds extra parameters in order: a name, or (name,
    default) for a keyword parameter (templates/jax/macros.py.j2 `more`). `circular`: the circular pipeline is
    rendered (its schedule, or the 1f1b build's evaluation / generate.py --check forward pass); `predicts`: also
    generate.py --check's (pipeline_predict). Layouts (PartitionSpecs of shard_map) are lists of mesh axes per
    dimension (templates/jax/macros.py.j2 `pspec`)."""
    piped = [b for b in blocks if b["name"] in pp["blocks"]]
    pre_buffers = any(layer["buffers"] for layer in pp["pre"])
    block_buffers = any(b["has_buffers"] for b in piped)
    post_buffers = any(layer["buffers"] for layer in pp["post"])
    block_dropout = any(b["has_dropout"] for b in piped)
    block_train = any(b["train_arg"] for b in piped)
    block_aux = any(b["has_aux"] for b in piped)
    pre_train = any(layer["train_arg"] for layer in pp["pre"])
    post_train = any(layer["train_arg"] for layer in pp["post"])
    pp.update({
        # batch_norm's running statistics before (pre), in (block) and after (post) the pipelined block
        "pre_buffers": pre_buffers, "block_buffers": block_buffers, "post_buffers": post_buffers,
        "buffers": pre_buffers or block_buffers or post_buffers,
        "moves_stats": block_buffers or post_buffers,  # the 1f1b loop carries moved running statistics
        # `train` False in the evaluation: a layer before / in / after the block runs differently then
        "pre_train": pre_train, "block_train": block_train, "post_train": post_train,
        "eval_modes": pre_train or block_train or post_train,
        "block_dropout": block_dropout,  # the pipelined blocks draw from the micro-batch's dropout key
        "block_aux": block_aux,  # the stages return their moe layers' load-balancing losses
        "aux": block_aux or pp["pre_aux"],  # load-balancing losses join the pipeline's loss
        "masks_idle": block_aux or block_buffers,  # the circular loop tells real ticks from idle ones
        "circular": circular,
        # the copies of several repeats of one block, in one stack
        "one_block_copies": bool(pp["copies"] and not pp["groups"]),
        # STACK_ORDER's copies are looked up per stage (stage_copies): padding rows or several repeats, one block
        "stage_copies": bool((pp["padded"] or pp["copies"]) and not pp["groups"]),
        # extra parameters: pre_forward, post_loss / post_eval, pipeline_stage, a stage of several blocks (and
        # lax.switch's operands), circular_pipeline, pipeline_1f1b, pipeline_value_and_grad
        "pre_params": ["buffers"] * pre_buffers + ["key"] * dropout + [("train", True)] * pre_train,
        # the load-balancing losses that pre_forward's caller (pre_in_order) and a stage (pipeline_stage) return
        "pre_aux_out": ["aux"] * pp["pre_aux"],
        "block_aux_out": ["aux"] * block_aux,
        "pre_returns": ["buffers"] * pre_buffers + ["aux_loss"] * pp["pre_aux"],
        "post_params": ["buffers"] * post_buffers + ["key"] * dropout,
        "stage_params": ["sb"] * block_buffers + ["key"] * block_dropout + [("train", True)] * block_train,
        "stage_keys": ["key"] * block_dropout,
        # what circular_pipeline returns past the outputs: the moved stacked buffers, the load-balancing losses
        "circular_returns": ["sb"] * block_buffers + ["aux"] * block_aux,
        "circular_params": ["sb"] * block_buffers + ["xs"] + ["keys"] * block_dropout + [("train", True)] * block_train,
        "f1b_params": ["key"] * dropout + ["scale"] * scaled + ["sb"] * block_buffers + ["head_buffers"] * post_buffers,
        "step_params": ["scale"] * scaled,
    })
    pipe, whole = [["pipe"]], []  # a PartitionSpec split over `pipe` (first dimension), and a whole one
    pre_aux, share = pp["pre_aux"], pp["share_outputs"]
    ys = pipe if share else whole  # the finished micro-batches: each rank's share, or all on every rank
    pp.update({
        "predicts": predicts,  # pipeline_predict (generate.py --check)
        # the model inputs that the layers before / after the block read (in the model's order)
        "pre_inputs": [i for i in inputs if i["name"] in pp["pre_reads"]],
        "post_inputs": [i for i in inputs if i["name"] in pp["post_reads"]],
        # the dropout keys passed on: every micro-batch's (`key`), one micro-batch's (`k`)
        "key_args": ["key"] * dropout,
        "mb_keys": ["k"] * dropout,
        "pre_aux_vars": ["pre_aux"] * pre_aux,  # the load-balancing losses of the layers before the block
        # a stage's call: the stacked buffers it takes, what it returns past its output, the keyword `train`
        "block_sb": ["sb"] * block_buffers,
        "stage_outs": ["new_sb"] * block_buffers + ["stage_aux"] * block_aux,
        "stage_aux_out": ["stage_aux"] * block_aux,
        "stage_call_args": ["buffer_rows"] * block_buffers + ["key"] * block_dropout,
        "stage_train": ["train"] * block_train,
        # circular_pipeline: its loop's carry past (cur, laps, outs), its arguments, shard_map's specs
        "circular_carry": ["aux"] * block_aux + ["sb"] * block_buffers,
        "circular_args": ["sp"] + ["sb"] * block_buffers + ["xs"] + ["keys"] * block_dropout,
        "circular_in_specs": [pipe] + [pipe] * block_buffers + [whole] + [whole] * block_dropout,
        "circular_out_specs": [ys] + [pipe] * block_buffers + [whole] * block_aux,
        "ys_layout": ys,
        # the evaluation: the circular loop with `train` False where the block runs differently then; what
        # pre_forward and post_eval take past (p, batch)
        "eval_run": "loop" if block_train else "circular_pipeline",
        "eval_pre_args": ["buffers"] * pre_buffers + ["k"] * dropout + [("train", False)] * pre_train,
        "eval_pre_dropped": int(pre_buffers) + int(pre_aux),  # pre_forward's outputs past xs, dropped
        "eval_post_args": ["buffers"] * post_buffers + ["k"] * dropout,
        # the circular schedule's loss: the buffers (`b`) it moves, returned as the loss's aux
        "loss_b": ["b"] * (pre_buffers or block_buffers or post_buffers),
        "loss_buffers": ["buffers"] * (pre_buffers or block_buffers or post_buffers),
        "loss_vjp": [("has_aux", True)] * (pre_buffers or block_buffers or post_buffers),
        # 1f1b: the head's buffers (batch_norm after the block), the moved buffers, shard_map's specs
        "head_b": ["b"] * post_buffers,
        "head_vjp": [("has_aux", True)] * post_buffers,
        "new_head_buffers": ["new_head_buffers"] * post_buffers,
        "head_buffers_out": ["head_buffers"] * post_buffers,
        "moved_buffers": ["sb"] * block_buffers + ["head_buffers"] * post_buffers,
        "f1b_in_specs": [pipe, whole, whole, whole] + [whole] * dropout + [whole] * scaled + [pipe] * block_buffers
        + [whole] * post_buffers,
        "f1b_out_specs": [whole, pipe, whole, whole] + [pipe] * block_buffers + [whole] * post_buffers,
    })
    groups = pp["groups"]
    if groups:
        block = {b["name"]: b for b in blocks}
        of = {h: block[groups["block_of"][h]] for h in groups["heads"]}
        groups.update({
            # per stack (its head repeat): what a run of its copies takes and returns past x
            "run_keys": {h: ["key"] * b["has_dropout"] for h, b in of.items()},
            "run_train": {h: ["train"] * b["train_arg"] for h, b in of.items()},
            "run_outs": {h: ["aux"] * b["has_aux"] for h, b in of.items()},
            "stage_fns": [f"stage_{n}" for n in range(len(groups["runs"]))],  # lax.switch's branches
        })


def free(name: str, taken: set[str]) -> str:
    """`name`, with trailing `_` while a builtin, a name the program defines or imports, or `taken`."""
    while name in RESERVED or name in taken:
        name += "_"
    return name


def model_context(plan: Plan, ctx: dict[str, Any], model_names: set[str], samples: bool = False) -> dict[str, Any]:
    """The model's inputs, layers, blocks and loss with variables that never shadow `model_names` (what
    the target's model code uses itself) nor the block functions, each layer's activation layout, and
    which op helpers the program needs. Shared by the targets whose model is functions over a flat dict
    of parameters (jax, mlx). `samples`: a generate.py runs the forward pass outside training too (its
    layers that behave differently then take `train`, as with an evaluation)."""
    block_fns = {b["name"]: free(f"{b['name']}_block", model_names) for b in ctx["blocks"]}
    taken = set(block_fns.values()) | model_names
    nodes = {n.name: n for n in plan.graph.layers}

    # top level: inputs and layers share one scope (the forward function)
    top = {i["name"]: i["var"] for i in ctx["inputs"]}
    top.update({layer["name"]: layer["var"] for layer in ctx["layers"]})
    top_vars = rename_vars(top, taken)

    read = {n for layer in ctx["layers"] for n in layer["inputs"]}
    inputs = copy.deepcopy(ctx["inputs"])
    for i in inputs:
        i["var"] = top_vars[i["name"]]
        i["read"] = i["name"] in read  # read by a layer (not only by the loss)

    evaluates = plan.spec.eval is not None or samples

    def annotate(layer: dict[str, Any], node, vars_: dict[str, str]) -> dict[str, Any]:
        layer["var"] = vars_[layer["name"]]
        # the layer behaves differently in an evaluation (no dropout, batch_norm's running statistics): its
        # function takes `train` (False in the evaluation)
        layer["train_arg"] = evaluates and not isinstance(node, RepeatNode) and (
            OPS[node.op].is_random(layer["attrs"]) or bool(layer["buffers"]))
        layer["input_vars"] = [vars_[n] for n in layer["inputs"]]
        layer["act_layout"] = _activation_layout(node.out, plan)
        # pin it where the layout is more than the batch split
        layer["pin"] = any(d for d in layer["act_layout"][1:])
        # (constrained to its layout in any case: ops/base.py `constrain_output`)
        layer["constrain"] = layer["pin"] or (not isinstance(node, RepeatNode) and OPS[node.op].constrain_output)
        return layer

    layers = []
    op_attrs: dict[str, list[dict[str, Any]]] = {}  # op -> the attrs of each of its layers
    has_dropout = has_buffers = False
    for layer in copy.deepcopy(ctx["layers"]):
        node = nodes[layer["name"]]
        annotate(layer, node, top_vars)
        if isinstance(node, RepeatNode):
            layer["block_fn"] = block_fns[node.block]
        else:
            if OPS[node.op].expert_dims:
                _moe(layer, plan, "")
            op_attrs.setdefault(node.op, []).append(layer["attrs"])
            has_dropout |= OPS[node.op].is_random(layer["attrs"])
            has_buffers |= bool(layer["buffers"])
        layers.append(layer)

    blocks = []
    for block in copy.deepcopy(ctx["blocks"]):
        rep = next(n for n in plan.graph.layers if isinstance(n, RepeatNode) and n.block == block["name"])
        inner = {n.name: n for n in rep.layers}
        scope = {"block_input": "block_input"}
        scope.update({layer["name"]: layer["var"] for layer in block["layers"]})
        vars_ = rename_vars(scope, taken)
        block["input_var"] = vars_["block_input"]
        block["fn"] = block_fns[block["name"]]
        for layer in block["layers"]:
            annotate(layer, inner[layer["name"]], vars_)
            if OPS[layer["op"]].expert_dims:
                _moe(layer, plan, f"{rep.name}.0.")
            op_attrs.setdefault(layer["op"], []).append(layer["attrs"])
        block["output_var"] = vars_[block["output"]]
        block["has_buffers"] = any(layer["buffers"] for layer in block["layers"])
        block["has_dropout"] = any(OPS[layer["op"]].is_random(layer["attrs"]) for layer in block["layers"])
        block["out_layout"] = _activation_layout(rep.out, plan)
        block["has_aux"] = any(OPS[layer["op"]].has_aux_loss for layer in block["layers"])
        block["train_arg"] = any(layer["train_arg"] for layer in block["layers"])
        has_dropout |= block["has_dropout"]
        has_buffers |= block["has_buffers"]
        blocks.append(block)

    loss = dict(ctx["loss"])
    loss["prediction_var"] = top_vars[loss["prediction"]]
    loss["targets_var"] = top_vars[loss["targets"]]
    loss["targets_is_input"] = any(i["name"] == loss["targets"] for i in inputs)
    return {
        "inputs": inputs,
        "layers": layers,
        "blocks": blocks,
        "loss": loss,
        "ops": sorted(op_attrs),
        "op_attrs": {op: op_attrs[op] for op in sorted(op_attrs)},
        # the shared definitions the layers' macros call (ops/base.py `helpers`)
        "helpers": sorted({h for op, attrs in op_attrs.items() for a in attrs for h in OPS[op].helpers(a)}),
        "has_dropout": has_dropout,
        "has_buffers": has_buffers,
        # a load-balancing loss joins the model loss
        "has_aux": any(OPS[op].has_aux_loss for op in op_attrs),
        # the forward pass takes `train` (False in an evaluation): some layer runs differently then
        "train_arg": any(layer["train_arg"] for layer in layers) or any(b["train_arg"] for b in blocks),
    }


# What a spec hash leaves out: where and how a spec runs, not what its train state holds or how it trains
# (docs/program.md "Checkpoints"). A checkpoint resumes on any mesh, pipeline layout, data path and evaluation.
HASH_OMITS = {"extends", "description", "targets", "mesh", "meshes", "devices", "sharding", "pipeline", "data",
              "eval", "hardware"}
HASH_OMITS_TRAINING = {"steps", "checkpoint", "remat", "zero", "grad_accum"}
# layer field -> its default (attention's dropout and rope_scaling, placement)
ADDED_LAYER_FIELDS = dict(dropout=0.0, device=None, rope_scaling=None, qk_norm=False, qk_norm_eps=1e-6,
                          gate_activation="silu", weight_offset=0.0, scale=None, softcap=None, cap=None,
                          padding_idx=None)


# The optimizer's settings that a resumed run may change (docs/program.md "Checkpoints"): its train state
# holds nothing of them, the program's own apply from the step it resumes at.
OPTIMIZER_SETTINGS = ("lr", "weight_decay")
TRAINING_SETTINGS = ("schedule", "clip_grad_norm")


def optimizer_settings(plan: Plan) -> dict[str, Any]:
    """The settings a resumed run may change, by name (`lr`, `weight_decay`, `schedule.warmup_steps`, ...),
    which the checkpoints record (OPTIMIZER_SETTINGS in the program)."""
    training = plan.spec.model_dump(mode="json")["training"]
    out = {k: v for k, v in training["optimizer"].items() if k in OPTIMIZER_SETTINGS}
    out.update({f"schedule.{k}": v for k, v in training["schedule"].items()})
    out["clip_grad_norm"] = training.get("clip_grad_norm")
    return out


def model_hash(plan: Plan) -> str:
    """The hash of what a checkpoint must agree with (MODEL_HASH): the spec hash's content less the optimizer
    settings a resumed run may change (optimizer_settings)."""
    return spec_hash(plan, settings=False)


def spec_hash(plan: Plan, settings: bool = True) -> str:
    """The spec's hash that every target's checkpoints record (SPEC_HASH): the first 16 hex digits of the
    sha256 of the merged spec's canonical JSON, less HASH_OMITS. The same for every mesh and target.
    `settings=False`: less the optimizer settings a resumed run may change too (model_hash)."""
    spec = plan.spec.model_dump(mode="json")
    kept = {k: v for k, v in spec.items() if k not in HASH_OMITS}
    kept["training"] = {k: v for k, v in spec["training"].items() if k not in HASH_OMITS_TRAINING}
    if not settings:
        kept["training"] = {k: v for k, v in kept["training"].items() if k not in TRAINING_SETTINGS}
        kept["training"]["optimizer"] = {k: v for k, v in kept["training"]["optimizer"].items()
                                         if k not in OPTIMIZER_SETTINGS}
    # precision settings left out (None: loss_scale, scaler) hash as before they existed: a spec that does not
    # use them keeps its hash, and its checkpoints stay resumable; tf32 says how a GPU runs float32 matmuls,
    # not what is trained (a checkpoint resumes with it on or off), and float8 how the torch program runs its
    # linear layers' matmuls (the parameters and the optimizer state are the same)
    kept["training"]["precision"] = {k: v for k, v in spec["training"]["precision"].items()
                                     if v is not None and k not in ("tf32", "float8")}
    # layer fields added later, left at their defaults, hash as before they existed (the same reason)
    model = kept["model"]
    for layers in [model["layers"], *model.get("blocks", {}).values()]:
        for i, layer in enumerate(layers):
            layers[i] = {k: v for k, v in layer.items() if ADDED_LAYER_FIELDS.get(k, object()) != v}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def target_fields(plan: Plan, ctx: dict[str, Any], costing: Costing) -> dict[str, Any]:
    """`costing`: the build's one costing (lowering/costing.py); the program's planned bytes are its states."""
    # the function that runs a block's copies under lax.scan: no tensor variable may shadow it
    stack_fns = {b["name"]: free(f"{b['name']}_stack", MODEL_NAMES) for b in ctx["blocks"]}
    model = model_context(plan, ctx, MODEL_NAMES | set(stack_fns.values()))
    for b in model["blocks"]:
        b["stack_fn"] = stack_fns[b["name"]]
        # top-level tables that a tied linear of the block reads (not stacked: every copy reads them)
        b["shared"] = sorted({layer["attrs"]["tie"] for layer in b["layers"] if layer["attrs"].get("tie")})
    layers = model["layers"]
    for layer in layers + [inner for b in model["blocks"] for inner in b["layers"]]:
        if layer["op"] != "repeat":
            # the optional keyword arguments of ops.py.j2's call of its helper (generate.py's decode: less `causal`)
            layer["kwargs"] = OPS[layer["op"]].jax_keywords(layer)
            layer["decode_kwargs"] = [(k, v) for k, v in layer["kwargs"] if k != "causal"]
    pipeline = _pipeline(plan, layers)
    for b in model["blocks"]:
        piped = bool(pipeline) and b["name"] in pipeline["blocks"]
        b["padded"] = piped and pipeline["padded"]  # a pipeline stage's padding rows, skipped
        b["per_copy"] = piped and bool(pipeline["padded"] or pipeline["copies"])  # the stage gives each row's copy
        b["named_keys"] = b["per_copy"] and bool(pipeline["copies"])  # copies of several repeats: their own keys
        b["staged"] = piped and b["has_dropout"] and not b["per_copy"]  # `first`: the copy of the stage's first row
        # what the stack function (templates/jax/model.py.j2) takes beyond (p, name, x), what the forward pass passes
        # it, and what it returns beyond x (templates/jax/macros.py.j2 `more`)
        b["stack_params"] = (["buffers"] * b["has_buffers"] + ["key"] * b["has_dropout"] + [("train", True)] * b[
            "train_arg"] + [("first", 0)] * b["staged"] + [("copies", None)] * b["per_copy"])
        b["stack_args"] = ["buffers"] * b["has_buffers"] + ["key"] * b["has_dropout"] + ["train"] * b["train_arg"]
        b["stack_outs"] = ["buffers"] * b["has_buffers"] + ["aux"] * b["has_aux"]
        b["parts"] = jax_model.block_parts(b)  # the optional pieces of its functions (lowering/parts/jax_model.py)
    if pipeline:
        lm = plan.language_model
        # generate.py --check runs the pipeline's forward pass (pipeline_predict) of a model without dropout
        predicts = lm is not None and not model["has_dropout"]
        _pipeline_roles(pipeline, model["blocks"], model["inputs"], model["has_dropout"],
                        bool(ctx["training"]["loss_scaling"]),
                        pipeline["schedule"] != "1f1b" or ctx["eval"] is not None or predicts, predicts)
    # the repeats whose stacked arrays hold the pipelined copies (split over `pipe`)
    heads = () if not pipeline else pipeline["groups"]["heads"] if pipeline["groups"] else (pipeline["repeat"]["name"],)
    tr = plan.spec.training
    held = costing.held  # a pipelined jax program holds more than the stage split (Plan.memory_for)
    # micro-batch iterations of the train step's loop: pipeline runs, else micro-batches, else a one-stage
    # pipeline's chunks (docs/program.md "Pipeline stages")
    accum = tr.grad_accum * (plan.pipeline.microbatches if plan.pipeline and not pipeline else 1)
    comm = jax_comm(plan)
    return {
        **{k: model[k] for k in ("inputs", "layers", "blocks", "loss")},
        "spec_hash": spec_hash(plan),
        "model_hash": model_hash(plan),
        "optimizer_settings": optimizer_settings(plan),
        "jax": {
            **{k: model[k] for k in ("ops", "op_attrs", "helpers", "has_dropout", "has_buffers", "has_aux",
                                     "train_arg")},
            "pipeline": pipeline,
            # what forward() returns beyond the prediction (the targets where a layer computes them, the moved
            # buffers, the load-balancing losses) and takes beyond (p, batch)
            "forward_outs": [model["loss"]["targets_var"]] * (not model["loss"]["targets_is_input"])
            + ["buffers"] * model["has_buffers"] + ["aux_loss"] * model["has_aux"],
            # op -> the optional parameters of its helper function that some layer passes (Op.jax_params)
            "op_params": {op: OPS[op].jax_params(attrs) for op, attrs in model["op_attrs"].items()},
            "forward_args": ["buffers"] * model["has_buffers"] + ["key"] * model["has_dropout"],
            # what grad_fn takes past (params, buffers, mb, key): the loss scale
            "scale_args": ["scale"] * bool(ctx["training"]["loss_scaling"]),
            # main.py's step_row: it reports the loss scale (runtime/jax/rows.py)
            "row_keywords": [("scaled", True)] * bool(ctx["training"]["loss_scaling"]),
            # the lr schedule's arguments past (SCHEDULE, LR, WARMUP_STEPS, STEPS): cosine's floor
            "schedule_args": ["MIN_LR_RATIO"] * (tr.schedule.name == "cosine"),
            # a pipeline whose stacked arrays hold the copies of several blocks (one stack per block), of several
            # repeats, or padding rows
            "piped_groups": bool(pipeline and pipeline["groups"]),
            "piped_copies": bool(pipeline and pipeline["copies"]),
            "piped_padded": bool(pipeline and pipeline["padded"]),
            # generate.py's cache_layouts: the pipelined repeat, whose caches are split over `pipe` like its copies
            "cache_keywords": [("piped", pipeline["repeat"]["name"])] if pipeline else [],
            # checkpoint.py's Checkpoints past (MANIFESTS, KEEP_CHECKPOINTS): the rows of the stacked arrays, and
            # PowerSGD's state, which checkpoints leave out
            "checkpoint_args": ["STACK_ROWS"] * bool(ctx["repeats"]) + [("unsaved", ("powersgd",))] * bool(comm["powersgd"]),
            # data.py's batch_arrays past its shardings: context parallelism's balanced order of positions
            "batch_args": ["positions"] * bool(plan.context_sequence_axis and plan.mesh.context),
            # runtime.py's start_devices: the XLA flags and the NCCL algorithm the communication settings ask for
            "device_keywords": [("xla_flags", list(comm["xla_flags"]))] * bool(comm["xla_flags"])
            + [("nccl_algo", comm["nccl_algo"])] * bool(comm["nccl_algo"]),
            # remat's options (runtime/jax/remat.py): `ring` under context parallelism (ring attention)
            "remat_keywords": [("ring", True)] * bool(plan.context_sequence_axis and plan.mesh.context),
            # what a replica's step takes past its batch (train_step.py.j2 `replica`): PowerSGD's state
            "replica_params": ["powersgd"] * bool(comm["powersgd"]),
            # repeat -> the mesh axes of the copy dimension of its stacked arrays (None: whole)
            "stack_axis": {r["name"]: ["pipe"] if pipeline and r["name"] in heads else None for r in ctx["repeats"]},
            # repeats whose copies another repeat's stacked arrays hold (the pipelined repeats but the first, or
            # but each block's first): no arrays of their own in the train state
            "merged": tuple(r for r in pipeline["repeats"] if r not in heads) if pipeline else (),
            "zero": tr.zero,  # not in the shared context (yet)
            # context parallelism: the ranks of the `context` axis (None without it; planner/context_parallel.py)
            "context": plan.mesh.context if plan.context_sequence_axis else None,
            # a float32 master copy of 16-bit parameters in the optimizer state
            "master_weights": bool(tr.precision.master_weights and tr.precision.params != "float32"),
            "accum": accum,
            "comm": comm,  # communication: XLA flags and NCCL_ALGO (lowering/comm.py)
            # per-device bytes the build's costing predicts (plan.json); the program reports what it holds
            "planned": {"params": held.params, "optimizer": held.optimizer, "buffers": held.buffers},
        },
    }
