"""Resolution: `Spec` -> `Graph`.

Dims are substituted, blocks and repeats expanded, every reference checked, shapes and dtypes inferred
operator by operator, and every parameter given its canonical name, shape and logical axes.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
from collections.abc import Iterator
from typing import Any, ClassVar, Optional, Union

from . import codes, pyast
from .diagnostics import Diagnostic, DiagnosticError, Label, did_you_mean
from .limits import MAX_EXPRESSION_CHARS, MAX_INT, MAX_LAYERS, float_not_finite, int_too_large, show
from .ops import OPS, OpError, ParamDef, TensorType
from .ops.loss import LOSSES
from .source import Document
from .spec.model import Repeat
from .spec.root import Spec


@dataclasses.dataclass(frozen=True)
class InputNode:
    name: str
    type: TensorType
    path: tuple
    high: int = 0  # exclusive upper bound of integer values (synthetic data); 0 for float inputs


@dataclasses.dataclass(frozen=True)
class Node:
    """One operator application. `inputs` name tensors in the same scope."""

    name: str
    op: str
    inputs: tuple[str, ...]
    in_types: tuple[TensorType, ...]
    out: TensorType
    attrs: dict[str, Any]
    params: tuple[ParamDef, ...]
    buffers: tuple[ParamDef, ...]
    flops: int  # forward, per sample
    path: tuple
    stage: Optional[int] = None
    device: Optional[int] = None  # `device:` (planner/pipeline.py maps devices to stages)
    is_repeat: ClassVar[bool] = False


@dataclasses.dataclass(frozen=True)
class RepeatNode:
    name: str
    block: str
    count: int
    inputs: tuple[str, ...]
    in_types: tuple[TensorType, ...]
    out: TensorType
    layers: tuple[Node, ...]  # the block, resolved for this input
    path: tuple
    stage: Optional[int] = None
    device: Optional[int] = None
    op: str = "repeat"
    is_repeat: ClassVar[bool] = True

    @property
    def flops(self) -> int:
        return self.count * sum(n.flops for n in self.layers)


@dataclasses.dataclass(frozen=True)
class Param:
    """A parameter of the whole model, by canonical name."""

    name: str
    shape: tuple[int, ...]
    axes: tuple[Optional[str], ...]
    init: str
    std: float
    layer: str  # canonical layer path, e.g. blocks.3.attn
    path: tuple  # spec path of the layer that owns it
    trainable: bool = True
    units: Optional[tuple[int, ...]] = None  # see ParamDef.units
    # an nn.Linear-style weight: PyTorch stores it [out, in], transposed from the canonical [in, out]
    torch_transposed: bool = False

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclasses.dataclass(frozen=True)
class LossNode:
    op: str
    prediction: str
    targets: str
    path: tuple


@dataclasses.dataclass(frozen=True)
class Graph:
    name: str
    dims: dict[str, int]
    inputs: tuple[InputNode, ...]
    layers: tuple[Union[Node, RepeatNode], ...]
    loss: LossNode
    params: tuple[Param, ...]
    buffers: tuple[Param, ...]

    @property
    def param_count(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def flops_per_sample(self) -> int:
        return sum(n.flops for n in self.layers)

    def nodes(self) -> Iterator[Node]:
        """Every layer: the top-level ones and, for each repeat, its block's (those of its first copy)."""
        for top in self.layers:
            yield from (top.layers if top.is_repeat else (top,))

    @property
    def placed(self) -> tuple[Union[Node, RepeatNode], ...]:
        """The layers with a `device:` (top-level layers, repeats, and layers of a block), in order."""
        return tuple(x for top in self.layers for x in ((top, *top.layers) if top.is_repeat else (top,))
                     if x.device is not None)


# ---------------------------------------------------------------- sizes

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


class _SizeError(Exception):
    def __init__(self, code: str, message: str, help: str | None = None):
        self.code, self.message, self.help = code, message, help


def eval_size(value: Any, dims: dict[str, int]) -> int:
    """A size: int, dim name, or + - * / // over them. Division must be exact; every number on the way is
    below 2^53 (E015) and an expression at most MAX_EXPRESSION_CHARS long. Raises _SizeError."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _SizeError(codes.E012, f"a size must be an integer or a dim name, got {show(value)}")
    if isinstance(value, int):
        n = _bounded(value, value)
    else:
        if len(value) > MAX_EXPRESSION_CHARS:
            raise _SizeError(codes.E021, f"size expression of {len(value):,} characters (at most {MAX_EXPRESSION_CHARS})",
                             "name the size in `dims` and use the name")
        try:
            tree = pyast.parse(value.strip(), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            raise _SizeError(codes.E021, f"cannot read size expression {value!r}", "use dim names, integers and + - * /")
        n = _eval(tree.body, dims, value)
    if n <= 0:
        raise _SizeError(codes.E021, f"size {show(value)} is {n}; sizes must be positive")
    return n


def _bounded(n: int, text: Any) -> int:
    if int_too_large(n):
        what = "is" if n == text else "reaches"
        raise _SizeError(codes.E015, f"size {show(text)} {what} {n:,}: out of range (sizes are below 2^53)",
                         "sizes and their products are below 2^53 (9,007,199,254,740,992)")
    return n


def _eval(node: ast.AST, dims: dict[str, int], text: str) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return _bounded(node.value, text)
    if isinstance(node, ast.Name):
        if node.id not in dims:
            raise _SizeError(codes.E020, f"undefined dim `{node.id}`", did_you_mean(node.id, dims) or "define it in `dims`")
        return dims[node.id]
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, dims, text), _eval(node.right, dims, text)
        if type(node.op) in _BINOPS:
            return _bounded(_BINOPS[type(node.op)](a, b), text)
        if isinstance(node.op, (ast.Div, ast.FloorDiv)):
            if b == 0 or a % b:
                raise _SizeError(codes.E021, f"{text!r}: {a} is not divisible by {b}")
            return a // b
    raise _SizeError(codes.E021, f"unsupported size expression {text!r}", "use dim names, integers and + - * /")


# ---------------------------------------------------------------- resolution

_DERIVED = {"capacity": "capacity_factor"}  # a derived attribute -> the argument it comes from


class _Resolver:
    def __init__(self, spec: Spec, doc: Document):
        self.spec = spec
        self.doc = doc
        self.diags: list[Diagnostic] = []
        self.dims = dict(spec.dims)
        self.top: dict[str, Node] = {}  # resolved top-level layers, for ties
        self.failed: set[str] = set()  # inputs and layers that could not be resolved (already reported)

    def error(self, code: str, message: str, path: tuple, help: str | None = None, key: bool = False,
              labels: tuple[Label, ...] = ()) -> None:
        self.diags.append(Diagnostic(code, message, self.doc.pos(path, key=key), help=help, labels=labels))

    def size(self, value: Any, path: tuple) -> Optional[int]:
        try:
            return eval_size(value, self.dims)
        except _SizeError as e:
            self.error(e.code, e.message, path, e.help)
            return None

    def run(self) -> Graph:
        inputs = self.inputs()
        layers, env, used, produced = self.scope(
            list(self.spec.model.layers),
            ("model", "layers"),
            {i.name: i.type for i in inputs},
            first=inputs[0].name if inputs else None,
            prefix="",
        )
        loss = self.loss(env, used, layers)
        if not self.diags:  # unused tensors are only meaningful in a graph that resolved completely
            self.dangling(produced, used, keep=loss.prediction if loss else None, last_is_output=False)
        # Every input must be used by a layer or by the loss.
        for inp in inputs:
            if inp.name not in used and not self.diags:
                self.error(
                    codes.E027,
                    f"model input `{inp.name}` is never used",
                    inp.path,
                    help="remove it, or give it to a layer with `input:` / the loss with `targets:`",
                    key=True,
                )
        if self.diags or loss is None:
            raise DiagnosticError(self.diags)
        self.limits(inputs, layers)
        if self.diags:
            raise DiagnosticError(self.diags)
        inputs = self.integer_ranges(inputs, layers, loss, env)
        params, buffers = self.collect(layers)
        return Graph(self.spec.name, self.dims, tuple(inputs), tuple(layers), loss, params, buffers)

    # -- inputs
    def inputs(self) -> list[InputNode]:
        out = []
        for name, inp in self.spec.model.inputs.items():
            path = ("model", "inputs", name)
            shape = list(inp.shape)
            if not shape or shape[0] != "batch":
                self.error(codes.E013, f"input `{name}` must have `batch` as its first dimension", path + ("shape",),
                           help="e.g. shape: [batch, seq]")
                self.failed.add(name)
                continue
            dims, axes = [], []
            ok = True
            for i, s in enumerate(shape[1:], start=1):
                if s == "batch":
                    self.error(codes.E013, "`batch` may appear only once, first", path + ("shape", i))
                    ok = False
                    continue
                n = self.size(s, path + ("shape", i))
                ok &= n is not None
                dims.append(n or 1)
                axes.append(s if isinstance(s, str) and s.isidentifier() else None)
            if inp.axes is not None:
                if len(inp.axes) != len(shape):
                    self.error(codes.E013, f"input `{name}` has {len(shape)} dimensions but {len(inp.axes)} axis names",
                               path + ("axes",))
                    ok = False
                else:
                    axes = list(inp.axes[1:])
            if ok:
                out.append(InputNode(name, TensorType(tuple(dims), tuple(axes), inp.dtype), path))
            else:
                self.failed.add(name)
        return out

    # -- a scope: the top-level layer list or one block
    def scope(self, layers, path, env, first, prefix, in_block=False):
        env = dict(env)
        nodes: list[Union[Node, RepeatNode]] = []
        used: set[str] = set()
        produced: dict[str, tuple] = {}
        failed: set[str] = set() if in_block else self.failed  # the top level also sees failed inputs
        later = {self._name(layer, i) for i, layer in enumerate(layers)}
        prev = first
        for i, layer in enumerate(layers):
            lpath = path + (i,)
            name = self._name(layer, i)
            if name in env:
                if name in produced:
                    first = (self.doc.pos(produced[name] + ("name",)),)
                elif not in_block and name in self.spec.model.inputs:
                    first = (self.doc.pos(("model", "inputs", name), key=True),)
                else:
                    first = ()
                self.error(codes.E025, f"duplicate name `{name}`", lpath + ("name",),
                           help="layer names must be unique in their scope and differ from the model inputs",
                           labels=tuple(Label(p, "first defined here") for p in first))
                continue
            refs = self.references(layer, lpath, prev)
            if refs is None or any(ref in failed for ref, _ in refs):
                # An earlier error broke what this layer reads; that error was reported where it happened.
                failed.add(name)
                prev = None
                continue
            types = []
            for ref, rpath in refs:
                if ref == name:
                    self.error(codes.E026, f"layer `{name}` uses its own output", rpath)
                elif ref in env:
                    types.append(env[ref])
                    used.add(ref)
                    continue
                elif ref in later:
                    self.error(codes.E026, f"layer `{name}` uses `{ref}`, which is defined after it", rpath,
                               help="layers may only use outputs of layers written before them")
                else:
                    choices = list(env)
                    self.error(codes.E022, f"undefined tensor `{ref}`", rpath,
                               help=did_you_mean(ref, choices) or "name a model input or an earlier layer")
            if len(types) != len(refs):
                failed.add(name)
                prev = None
                continue
            if getattr(layer, "stage", None) is not None and getattr(layer, "device", None) is not None:
                self.error(codes.E054, f"`{name}` has both `stage:` and `device:`", lpath + ("device",),
                           help="give one of them: `device:` names the pipe device (consecutive layers on one "
                           "device form a stage), `stage:` the stage itself")
            if in_block and getattr(layer, "stage", None) is not None:
                # every copy of the block would take the layer to that stage: not a pipeline any schedule runs
                self.error(codes.E054, f"`{name}` is inside a block: a `stage:` there would place the layer of every "
                           "copy on one stage", lpath + ("stage",),
                           help="give `stage:` to the `repeat` (all its copies) or to top-level layers, `device:` to "
                           "the block's layers (every copy on that device), or leave stages to the planner (it "
                           "splits one repeated block evenly)")
            node = self.repeat(layer, lpath, name, refs, types, in_block) if isinstance(layer, Repeat) else (
                self.op(layer, lpath, name, refs, types, prefix))
            if node is None:
                failed.add(name)
                prev = None
                continue
            nodes.append(node)
            env[name] = node.out
            produced[name] = lpath
            if not prefix and not in_block and isinstance(node, Node):
                self.top[name] = node
            prev = name
        return nodes, env, used, produced

    def _name(self, layer, i: int) -> str:
        return layer.name or f"{layer.op}_{i}"

    def references(self, layer, lpath, prev) -> Optional[list[tuple[str, tuple]]]:
        inputs = getattr(layer, "inputs", None)
        if layer.input is not None and inputs is not None:
            self.error(codes.E013, "give either `input` or `inputs`, not both", lpath + ("inputs",), key=True)
            return None
        if inputs is not None:
            return [(r, lpath + ("inputs", j)) for j, r in enumerate(inputs)]
        if layer.input is not None:
            return [(layer.input, lpath + ("input",))]
        if prev is None:
            return None  # an earlier error broke the chain; it was reported there
        return [(prev, lpath)]

    def dangling(self, produced: dict[str, tuple], used: set[str], keep: Optional[str],
                 last_is_output: bool = True) -> None:
        """E027 for outputs nothing reads. A block's last layer is its output; at the top level only the
        loss's prediction is an output."""
        names = list(produced)
        for name in names:
            if name not in used and name != keep and not (last_is_output and name == names[-1]):
                self.error(codes.E027, f"the output of `{name}` is never used", produced[name],
                           help="later layers take the previous output by default; use `input:`/`inputs:` to wire it in, or remove it")

    # -- one operator
    def op(self, layer, lpath, name, refs, types, prefix) -> Optional[Node]:
        op = OPS[layer.op]
        if op.arity == 1 and len(types) != 1:
            self.error(codes.E030, f"`{layer.op}` takes one input, got {len(types)}", lpath + ("inputs",), key=True)
            return None
        if op.arity == 0 and len(types) < 2:
            self.error(codes.E030, f"`{layer.op}` takes two or more inputs (`inputs: [a, b]`), got {len(types)}",
                       lpath + ("inputs",) if layer.inputs is not None else lpath, key=True)
            return None

        failed = []

        def size(field: str) -> int:
            parts = tuple(int(p) if p.isdigit() else p for p in field.split("."))
            value: Any = layer
            for p in parts:
                value = value[p] if isinstance(p, int) else getattr(value, p)
            n = self.size(value, lpath + parts)
            if n is None:
                failed.append(field)
                raise OpError("", "", None)
            return n

        try:
            res = op.infer(layer, list(types), size, _TieContext(self, lpath))
        except OpError as e:
            if e.code:
                field = lpath + ((e.field,) if e.field else ())
                if e.field in ("input", "inputs") and getattr(layer, e.field, None) is None:
                    field = lpath
                self.error(e.code, f"`{name}`: {e.message}", field, e.help)
            return None
        return Node(name, layer.op, tuple(r for r, _ in refs), tuple(types), res.out, res.attrs, res.params,
                    res.buffers, res.flops, lpath, layer.stage, layer.device)

    # -- a repeated block
    def repeat(self, layer: Repeat, lpath, name, refs, types, in_block) -> Optional[RepeatNode]:
        if in_block:
            self.error(codes.E013, "a block cannot contain a `repeat`", lpath, help="repeat blocks from `model.layers`")
            return None
        count = self.size(layer.repeat, lpath + ("repeat",))
        if count is not None and count > MAX_LAYERS:
            self.error(codes.E031, f"`{name}` repeats its block {count:,} times; a model has at most {MAX_LAYERS:,} "
                       "layers", lpath + ("repeat",), help=f"repeat a block at most {MAX_LAYERS:,} times")
            return None
        blocks = self.spec.model.blocks
        if layer.block not in blocks:
            self.error(codes.E023, f"undefined block `{layer.block}`", lpath + ("block",),
                       help=did_you_mean(layer.block, blocks) or "define it under `model.blocks`")
            return None
        if count is None or len(types) != 1:
            return None
        bpath = ("model", "blocks", layer.block)
        before = len(self.diags)
        nodes, env, used, produced = self.scope(
            list(blocks[layer.block]), bpath, {"block_input": types[0]}, first="block_input", prefix=name,
            in_block=True)
        if len(self.diags) > before or not nodes:
            return None
        self.dangling(produced, used, keep=None)
        if "block_input" not in used:
            self.error(codes.E027, f"block `{layer.block}` never uses `block_input`", bpath, key=True)
        out = nodes[-1].out
        if count > 1 and (out.shape, out.dtype) != (types[0].shape, types[0].dtype):
            self.error(codes.E028, f"block `{layer.block}` maps {types[0].show()} to {out.show()}; a block repeated "
                       f"{count} times must keep its input shape", lpath + ("repeat",))
            return None
        return RepeatNode(name, layer.block, count, tuple(r for r, _ in refs), tuple(types), out,
                          tuple(nodes), lpath, layer.stage, layer.device)

    # -- the loss
    def loss(self, env, used, layers) -> Optional[LossNode]:
        loss = self.spec.model.loss
        path = ("model", "loss")
        pred_field = LOSSES[loss.op].prediction_field
        pred = getattr(loss, pred_field) or (layers[-1].name if layers else None)
        ok = True
        for ref, field in ((pred, pred_field), (loss.targets, "targets")):
            if ref is None or (ref not in env and ref in self.failed):
                return None
            if ref not in env:
                self.error(codes.E022, f"undefined tensor `{ref}` in the loss", path + (field,),
                           help=did_you_mean(ref, env) or "name a model input or a layer")
                ok = False
            else:
                used.add(ref)
        if not ok:
            return None
        try:
            LOSSES[loss.op].check(env[pred], env[loss.targets])
        except OpError as e:
            self.error(e.code, e.message, path + (e.field,) if getattr(loss, e.field or "", None) else path, e.help)
            return None
        return LossNode(loss.op, pred, loss.targets, path)

    # -- limits, before anything is expanded
    def limits(self, inputs, layers) -> None:
        """E031 when the layers, every repeat expanded, pass MAX_LAYERS (at the repeat that passes it); E015 for
        a tensor (a parameter, or a layer's output or an input with the global batch) of 2^53 elements or
        more."""
        total = 0
        for node in layers:
            total += node.count * len(node.layers) if isinstance(node, RepeatNode) else 1
            if total > MAX_LAYERS:
                path = node.path + (("repeat",) if isinstance(node, RepeatNode) else ())
                self.error(codes.E031, f"the model has more than {MAX_LAYERS:,} layers with its repeats expanded "
                           f"({total:,} up to `{node.name}`)", path,
                           help=f"a model has at most {MAX_LAYERS:,} layers (each repeat counts its block's layers "
                           "once per copy)")
                return
        batch = self.spec.training.batch_size
        for inp in inputs:
            if inp.type.numel * batch >= MAX_INT:
                self.error(codes.E015, f"input `{inp.name}` has {inp.type.numel * batch:,} elements ({inp.type.show()} "
                           f"with batch {batch:,}); a tensor has fewer than 2^53", inp.path + ("shape",),
                           help="use smaller sizes or a smaller batch")
                return
        for node in layers:
            for inner in node.layers if isinstance(node, RepeatNode) else (node,):
                for p in inner.params + inner.buffers:
                    if p.numel >= MAX_INT:
                        self.error(codes.E015, f"`{inner.name}`: parameter `{p.name}` of shape {list(p.shape)} has "
                                   f"{p.numel:,} elements; a tensor has fewer than 2^53", inner.path,
                                   help="use smaller sizes")
                        return
                for key, value in inner.attrs.items():  # derived sizes too (an moe layer's capacity)
                    if int_too_large(value) or float_not_finite(value):
                        field = _DERIVED.get(key, key)
                        where = inner.path + ((field,) if self._has_field(inner.path, field) else ())
                        self.error(codes.E015, f"`{inner.name}`: its {key} ({show(value)}) is out of range (sizes are below "
                                   "2^53, numbers finite)", where, help=f"use a smaller `{field}`")
                        return
                if inner.out.numel * batch >= MAX_INT:
                    self.error(codes.E015, f"`{inner.name}`: its output {inner.out.show()} has {inner.out.numel * batch:,} "
                               f"elements with batch {batch:,}; a tensor has fewer than 2^53", inner.path,
                               help="use smaller sizes or a smaller batch")
                    return

    def _has_field(self, path: tuple, field: str) -> bool:
        node: Any = self.doc.data
        for p in path:
            try:
                node = node[p]
            except (KeyError, IndexError, TypeError):
                return False
        return isinstance(node, dict) and field in node

    # -- integer input ranges, for synthetic data
    def integer_ranges(self, inputs, layers, loss, env) -> list[InputNode]:
        highs: dict[str, int] = {}
        for node in layers:
            high = OPS[node.op].index_bound(node.attrs) if isinstance(node, Node) else None
            if high is not None:  # integer inputs index a table of `high` rows
                for r in node.inputs:
                    highs[r] = min(highs.get(r, high), high)
        if LOSSES[loss.op].class_targets:
            classes = env[loss.prediction].shape[-1]
            highs[loss.targets] = min(highs.get(loss.targets, classes), classes)
        return [
            dataclasses.replace(i, high=highs.get(i.name, 2)) if i.type.is_int else i for i in inputs
        ]

    # -- parameters by canonical name
    def collect(self, layers) -> tuple[tuple[Param, ...], tuple[Param, ...]]:
        params: list[Param] = []
        buffers: list[Param] = []

        def add(node: Node, prefix: str) -> None:
            for p in node.params:
                params.append(Param(f"{prefix}{node.name}.{p.name}", p.shape, p.axes, p.init, p.std,
                                    f"{prefix}{node.name}", node.path, units=p.units,
                                    torch_transposed=p.name in OPS[node.op].torch_transposed))
            for b in node.buffers:
                buffers.append(Param(f"{prefix}{node.name}.{b.name}", b.shape, b.axes, b.init, b.std,
                                     f"{prefix}{node.name}", node.path, trainable=False))

        for node in layers:
            if isinstance(node, RepeatNode):
                for i in range(node.count):
                    for inner in node.layers:
                        add(inner, f"{node.name}.{i}.")
            else:
                add(node, "")
        return tuple(params), tuple(buffers)


class _TieContext:
    def __init__(self, resolver: _Resolver, lpath: tuple):
        self.r = resolver

    def tied_table(self, name: str):
        node = self.r.top.get(name)
        if node is None:
            raise OpError(codes.E022, f"`tie` names `{name}`, which is not an earlier top-level layer", "tie",
                          help=did_you_mean(name, self.r.top) or None)
        if not OPS[node.op].tieable:
            raise OpError(codes.E030, f"`tie` must name an embedding layer; `{name}` is a {node.op}", "tie")
        (w,) = node.params
        return f"{name}.{w.name}", w.shape, w.axes


def resolve(spec: Spec, doc: Document) -> Graph:
    return _Resolver(spec, doc).run()
