"""Plan -> the part of every target's Program (lowering/program.py) that all targets share: plain, JSON-able
data that the Jinja templates of every target read.

Everything the generated program needs is decided in the lowering (names, layouts, hyper-parameters), so
templates only arrange it. Each target adds its own entries (lowering/jax_program.py, lowering/torch_program.py); what the
programs do with them is docs/program.md.
"""

from __future__ import annotations

import builtins
import functools
import keyword
import re
from typing import Any

from .. import __version__
from ..graph import Node, RepeatNode
from ..hf_import import hf_context
from ..ops import OPS
from ..ops.loss import LOSSES
from ..planner.plan import Plan
from ..template_files import template_dirs
from .base import linear_style, tensor_dims
from .costing import Costing
from .predicted import predicted

# Local variable names the templates use themselves; tensor variables that would shadow them get a `_`.
LOCAL_NAMES = {
    "self", "params", "p", "x", "cfg", "batch", "mesh", "model", "args", "loss", "logits", "step", "state",
    "opt_state", "rng", "prefix", "i", "h", "inputs", "compute_dtype", "remat", "out", "mask", "q", "k", "v",
    "hits",
}  # fmt: skip

# A template line that defines or imports a module-level name of the program (at the start of a line:
# `def f`, `class C`, `NAME = ...`, `A, B = ...`), or imports one anywhere (`import a.b as c`, `from a import b`).
_DEFINES = re.compile(r"^(?:async\s+def|def|class)\s+([A-Za-z_]\w*)|^([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*(?::[^=\n]*)?=(?!=)")
_IMPORT = re.compile(r"^\s*(?:from\s+[\w.]+\s+)?import\s+([^(#\n]+)")


@functools.lru_cache(maxsize=1)
def program_names() -> frozenset[str]:
    """Every name a generated program defines at module level or imports, in any target: read from the
    templates (each section is included at module level), so a name a template adds is reserved at once.
    Names that only some spec's program defines are included too (a spare `_` never hurts)."""
    names: set[str] = set()
    for directory in template_dirs():
        for path in sorted(directory.glob("*/*.py.j2")):
            for line in path.read_text().splitlines():
                if m := _DEFINES.match(line):
                    names.update(n.strip() for n in (m.group(1) or m.group(2)).split(","))
                elif m := _IMPORT.match(line):
                    for part in m.group(1).split(","):
                        words = part.split()
                        if words and words[0].replace(".", "").replace("_", "").isalnum():
                            # `import a.b` binds `a`; `import a.b as c` and `from m import a as c` bind `c`
                            names.add(words[-1] if len(words) == 3 and words[1] == "as" else words[0].split(".")[0])
    return frozenset(n for n in names if n.isidentifier())


# Every name a tensor variable must not take: the templates' local names, Python's builtins (`range`,
# `len`, `__debug__`...), and every name a generated program defines or imports (np, jax, torch, F, mx,
# os, json, forward, Data, ...). Such a variable gets a `_`; canonical names (parameters, checkpoints,
# parameter files) are never renamed.
MODEL_CLASS = "Model"  # the torch program's model class (rendered from the context, so not read above)
RESERVED = LOCAL_NAMES | set(dir(builtins)) | program_names() | {MODEL_CLASS}


def var(name: str) -> str:
    """A safe Python variable for a tensor name (names are validated identifiers already)."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"not an identifier: {name!r}")  # unreachable for validated specs
    return f"{name}_" if name in RESERVED else name


def rename_vars(scope: dict[str, str], reserved: set[str]) -> dict[str, str]:
    """tensor name -> variable, unique in its scope: a variable that is its own tensor name and free stays;
    every other one (renamed by `var`, or colliding with `reserved`, the names a target's code uses itself)
    takes trailing `_` until it is free (never RESERVED, `reserved`, nor another variable of the scope)."""
    taken = reserved | RESERVED
    out = {name: v for name, v in scope.items() if v == name and v not in taken}
    used = set(out.values()) | taken
    for name, v in scope.items():
        if name not in out:
            while v in used:
                v += "_"
            used.add(v)
            out[name] = v
    return {name: out[name] for name in scope}


def class_name(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.replace("-", "_").split("_") if part) or "Block"


def _pspec(spec) -> list:
    return [list(d) if d else None for d in spec]


def _layer(node: Node | RepeatNode) -> dict[str, Any]:
    if isinstance(node, RepeatNode):
        return {
            "name": node.name,
            "var": var(node.name),
            "op": "repeat",
            "block": node.block,
            "class_name": class_name(node.block),
            "count": node.count,
            "inputs": list(node.inputs),
            "input_vars": [var(i) for i in node.inputs],
            "out_shape": list(node.out.shape),
        }
    return {
        "name": node.name,
        "var": var(node.name),
        "op": node.op,
        "inputs": list(node.inputs),
        "input_vars": [var(i) for i in node.inputs],
        "in_shapes": [list(t.shape) for t in node.in_types],
        "out_shape": list(node.out.shape),
        "attrs": dict(node.attrs),
        "params": [p.name for p in node.params],
        "buffers": [b.name for b in node.buffers],
        "stage": node.stage,
    }


def _tp_styles(plan: Plan, prefix: str, node: Node) -> dict[str, str]:
    """Tensor-parallel style per sub-module of a layer: colwise / rowwise (PyTorch's parallelize_module)."""
    out = {}
    for p in node.params:
        if not p.name.endswith("weight"):
            continue
        module = p.name[: -len(".weight")] if "." in p.name else ""
        full = f"{prefix}{node.name}.{p.name}"
        if OPS[node.op].tieable:  # an embedding table [vocab, dim]: vocab split is row-wise in torch
            dims = tensor_dims(plan, full)
            style = "rowwise" if dims == (0,) else "colwise" if dims == (1,) else "replicate"
        else:
            style = linear_style(plan, full)
        if style != "replicate":
            out[(node.name + "." + module) if module else node.name] = style
    return out


def _pipeline(plan: Plan) -> dict[str, Any] | None:
    pp = plan.pipeline
    if pp is None:
        return None
    return {
        "pipe": pp.pipe,
        "virtual_stages": pp.virtual,
        "stages": len(pp.stages),
        "microbatches": pp.microbatches,
        "schedule": pp.schedule,
        "bubble": pp.bubble,
        "layer_stage": dict(pp.layer_stage),
        # repeat name -> [[start, end], ...] copies per stage
        "repeat_split": {k: [list(s) for s in v] for k, v in pp.repeat_split.items()},
        "stage_layers": [list(s.units) for s in pp.stages],
    }


def _param(p) -> dict[str, Any]:
    return {
        "name": p.name,
        "shape": list(p.param.shape),
        "axes": list(p.param.axes),
        "layout": _pspec(p.spec),
        "local_shape": list(p.local_shape),
        "init": p.param.init,
        "std": p.param.std,
        "decay": p.decay,
        "layer": p.param.layer,
        # nn.Linear keeps [out, in]: the torch program transposes at the parameter-file boundary
        "transpose": p.param.torch_transposed,
        "fsdp_dim": next((i for i, d in enumerate(p.spec) if "fsdp" in d), None),
        "tensor_dim": next((i for i, d in enumerate(p.spec) if "tensor" in d), None),
    }


def _buffer(b) -> dict[str, Any]:
    return {"name": b.name, "shape": list(b.param.shape), "layout": _pspec(b.spec), "init": b.param.init,
            "layer": b.param.layer}


def fused_parts(plan: Plan, prefix: str, node: Node) -> int | None:
    """The number of shards the output features of a layer's input projections are split into, when all of
    them are split alike (Op.input_projections: the programs then compute them as one matmul, each weight
    viewed as [in, parts, out / parts] so that no shard moves); None when they differ or there are none."""
    names = OPS[node.op].input_projections(node.attrs)
    # the tensor-parallel axes of each output dimension (a batch axis there, fsdp's, is gathered before use)
    degrees = {plan.mesh.degree(tuple(a for a in plan.param(f"{prefix}{node.name}.{w}").spec[-1]
                                      if a not in plan.batch_axes)) for w in names}
    return degrees.pop() if len(degrees) == 1 else None


def _with_parts(layer: dict[str, Any], plan: Plan, prefix: str, node: Node) -> dict[str, Any]:
    if OPS[node.op].input_projections(node.attrs):
        layer["attrs"]["fused_parts"] = fused_parts(plan, prefix, node)
    return layer


def index_inputs(plan: Plan) -> set[str]:
    """The integer inputs whose values index something: a table (embedding rows) or the classes of the
    loss. Their `high` is a true bound, which the programs check data from disk against (an input that
    only feeds other arithmetic has `high` 2 for synthetic data, and no bound)."""
    out = {r for n in plan.graph.layers if isinstance(n, Node) and OPS[n.op].index_bound(n.attrs) is not None
           for r in n.inputs}
    loss = plan.graph.loss
    return out | ({loss.targets} if LOSSES[loss.op].class_targets else set())


def _eval(plan: Plan) -> dict[str, Any] | None:
    """The spec's `eval` section, its `path` absolute (plan.data_files); `accuracy`: the loss compares class
    ids, so the evaluation also counts the predictions (argmax) equal to their target."""
    ev = plan.spec.eval
    if ev is None:
        return None
    return {**ev.model_dump(), "path": plan.data_files.get("eval"),
            "accuracy": LOSSES[plan.graph.loss.op].class_targets}


def common_fields(plan: Plan, target: str, spec_file: str, costing: Costing) -> dict[str, Any]:
    """`costing`: the build's one costing of `plan` for `target` (lowering/costing.py), whose figures the program
    embeds (and plan.json's `predicted` holds) as plan.json's `costs` holds them."""
    spec, graph, mesh = plan.spec, plan.graph, plan.mesh
    tr = spec.training
    blocks: dict[str, dict[str, Any]] = {}
    for node in graph.layers:
        if isinstance(node, RepeatNode) and node.block not in blocks:
            blocks[node.block] = {
                "name": node.block,
                "class_name": class_name(node.block),
                "layers": [_with_parts(_layer(n), plan, f"{node.name}.0.", n) for n in node.layers],
                "output": node.layers[-1].name,
                "output_var": var(node.layers[-1].name),
            }
    tp: dict[str, str] = {}
    block_tp: dict[str, dict[str, str]] = {}
    for node in graph.layers:
        if isinstance(node, RepeatNode):
            styles: dict[str, str] = {}
            for inner in node.layers:
                styles.update(_tp_styles(plan, f"{node.name}.0.", inner))
            block_tp.setdefault(node.block, styles)
        else:
            tp.update(_tp_styles(plan, "", node))
    for b in blocks.values():
        b["tp"] = block_tp.get(b["name"], {})
    first_seq = next((i.input.type.shape[0] for i in plan.inputs if i.input.type.is_int and i.input.type.shape),
                     None)
    opt = tr.optimizer.model_dump()
    indexed = index_inputs(plan)
    return {
        "mithril_version": __version__,
        "target": target,
        "spec_name": spec.name,
        "spec_file": spec_file,
        "mesh": {
            "name": mesh.name,
            "axes": [[a, mesh.size(a)] for a in mesh.axes],
            "devices": mesh.devices,
            "sizes": dict(mesh.sizes),
        },
        "batch_axes": list(plan.batch_axes),
        "dp_degree": plan.dp_degree,
        "inputs": [
            {
                "name": i.input.name,
                "var": var(i.input.name),
                "shape": list(i.input.type.shape),
                "dtype": i.input.type.dtype,
                "is_int": i.input.type.is_int,
                "high": i.input.high,
                # values from disk must lie in [0, high): it indexes a table or the loss's classes
                "bounded": i.input.type.is_int and i.input.name in indexed,
                "layout": _pspec(i.spec),
                "local_batch": i.local_batch,
            }
            for i in plan.inputs
        ],
        "model_class": MODEL_CLASS,
        "tp": tp,
        "blocks": list(blocks.values()),
        "layers": [_layer(n) if isinstance(n, RepeatNode) else _with_parts(_layer(n), plan, "", n)
                   for n in graph.layers],
        "loss": {"op": graph.loss.op, "prediction": graph.loss.prediction, "prediction_var": var(graph.loss.prediction),
                 "targets": graph.loss.targets, "targets_var": var(graph.loss.targets)},
        "params": [_param(p) for p in plan.params],  # every parameter by canonical (per-copy) name
        "buffers": [_buffer(b) for b in plan.buffers],
        # one row per parameter outside the repeats, and per block parameter of each repeat: what the
        # generated tables hold (canonical per-copy names are `<repeat>.<i>.<local>`)
        "top_params": [_param(p) for p in plan.top_params],
        "top_buffers": [_buffer(b) for b in plan.top_buffers],
        "repeats": [
            {
                "name": r.name,
                "block": r.block,
                "count": r.count,
                "params": [{**_param(b.first), "local": b.local,
                            "stages": sorted({c.stage for c in b.copies})} for b in r.params],
                "buffers": [{**_buffer(b.first), "local": b.local} for b in r.buffers],
            }
            for r in plan.repeats
        ],
        "param_count": plan.param_count,
        "memory": {"params": plan.memory.params, "grads": plan.memory.grads, "optimizer": plan.memory.optimizer},
        "training": {
            "batch_size": tr.batch_size,
            "grad_accum": tr.grad_accum,
            "micro_batch": plan.micro_batch,
            "steps": tr.steps,
            "optimizer": opt,
            "schedule": tr.schedule.model_dump(),
            "clip_grad_norm": tr.clip_grad_norm,
            "precision": tr.precision.model_dump(),
            # float16 compute's loss scaling (None: none): `dynamic` and the scaler's settings
            "loss_scaling": tr.precision.loss_scaling(),
            "remat": tr.remat,
            "seed": tr.seed,
            "checkpoint": tr.checkpoint.model_dump() if tr.checkpoint else None,
        },
        # the files as the plan resolved them (absolute; a relative path is relative to the spec's directory)
        "data": {"mask": None, **spec.data.model_dump(), **{key: plan.data_files[role] for key, role in
                                               (("path", "data"), ("tokenizer", "tokenizer"), ("mask", "mask"))
                                               if role in plan.data_files}},
        "eval": _eval(plan),
        "pipeline": _pipeline(plan),
        "seq_len": first_seq,
        # model FLOPs of one optimizer step: forward and backward (twice the forward) over the batch
        "flops_per_step": 3 * int(graph.flops_per_sample) * tr.batch_size,
        "hf": hf_context(plan),  # a spec imported from Hugging Face: its checkpoints' names (hf_import.py)
        # the plan's figures for one step (plan.json's `predicted`, which --profile reads; activation offload)
        "predicted": predicted(costing),
    }
