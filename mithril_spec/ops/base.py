"""What every operator provides: its spec arguments, a shape rule, parameters (canonical shape,
logical axes, init) and forward FLOPs.

Shapes here leave out the batch dimension: every activation is `[batch, *shape]`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar, Optional

from pydantic import Field, StrictInt

from .. import codes
from ..spec.common import Ident, Strict

INT_DTYPES = ("int32", "int64")
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]  # without the leading batch dimension
    axes: tuple[Optional[str], ...]  # logical axis per dimension (None: unnamed)
    dtype: str

    def show(self) -> str:
        return "[" + ", ".join(["batch", *map(str, self.shape)]) + "]"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_int(self) -> bool:
        return self.dtype in INT_DTYPES


@dataclasses.dataclass(frozen=True)
class ParamDef:
    name: str  # local to its layer, e.g. "q.weight"
    shape: tuple[int, ...]
    axes: tuple[Optional[str], ...]
    init: str = "normal"  # normal | zeros | ones
    std: float = 0.02
    # Per dimension, how many indivisible units it holds (e.g. heads in [dim, heads*head_dim]);
    # sharding must split units, not just elements. None: every element is a unit.
    units: Optional[tuple[int, ...]] = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class OpResult:
    out: TensorType
    params: tuple[ParamDef, ...] = ()
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)  # resolved arguments for the targets
    flops: int = 0  # forward FLOPs per sample
    buffers: tuple[ParamDef, ...] = ()  # non-trained state (batch-norm running statistics)


class OpError(Exception):
    """A problem with one operator's arguments or inputs; `field` names the argument to point at."""

    def __init__(self, code: str, message: str, field: str | None = None, help: str | None = None):
        super().__init__(message)
        self.code, self.message, self.field, self.help = code, message, field, help


class LayerArgs(Strict):
    """Fields every layer accepts."""

    name: Optional[Ident] = Field(None, description="names the output and prefixes the parameters")
    input: Optional[Ident] = Field(None, description="input tensor; default: the previous layer's output")
    inputs: Optional[list[Ident]] = Field(None, description="input tensors, for operators with several")
    stage: Optional[StrictInt] = Field(None, ge=0, description="pipeline stage of this layer")
    device: Optional[StrictInt] = Field(None, ge=0, description="the device along the `pipe` mesh axis that runs "
                                        "this layer (Mithril's device_id): consecutive layers on one device form "
                                        "a pipeline stage; inside a block, every copy's layer")


SizeFn = Callable[[str], int]  # resolves a Size-valued argument by field name (positions handled by caller)


class Op:
    """One operator and everything the compiler knows about it.

    Subclasses set `kind`, `Args`, `arity` and implement `infer` (shape rule, parameters, FLOPs). The class
    attributes and methods below are what the planner, the cost model, the target checks and the render
    adapters ask instead of comparing operator names; the defaults describe an operator with no parameters
    that keeps nothing for the backward pass.
    """

    kind: ClassVar[str]
    Args: ClassVar[type[LayerArgs]]
    arity: ClassVar[int] = 1  # number of inputs; 0 means two or more
    has_params: ClassVar[bool] = False

    # -- how it computes
    # Acts on each element alone: may sit between a column- and a row-parallel linear layer.
    elementwise: ClassVar[bool] = False
    # Acts on each sequence position alone: runs unchanged on a sequence split over `tensor`.
    per_position: ClassVar[bool] = False
    # Context parallelism (the `context` mesh axis splits the sequence, docs/program.md "Context
    # parallelism"): "position" (acts on each position alone, or reads the global positions: runs on its
    # chunks of the sequence), "ring" (attends over the sequence: ring attention), "gather" (needs the whole
    # sequence in its order: the programs all-gather it over `context` going in, run the layer whole on every
    # context rank and keep the rank's places coming out), None (per_position decides).
    context_parallel: ClassVar[Optional[str]] = None
    # Normalises over the features: a feature axis split over the mesh needs its statistics reduced.
    normalizes: ClassVar[bool] = False
    # Normalises with statistics over the batch: data parallelism must reduce them over the ranks.
    batch_statistics: ClassVar[bool] = False
    # Adds an auxiliary (load-balancing) loss to the model's loss.
    has_aux_loss: ClassVar[bool] = False
    # Its random numbers (is_random) are drawn for the whole layer and each tensor-parallel rank keeps its share
    # (attention: the dropout mask of its heads), so a split over `tensor` does not change them.
    random_tensor_parallel: ClassVar[bool] = False
    # Under sequence parallelism (a block's positions split over `tensor`) its random numbers are still those of
    # the whole sequence: dropout keeps its positions' slice of the whole mask, attention gathers the sequence
    # and keeps its heads'.
    random_sequence_parallel: ClassVar[bool] = False
    # Under context parallelism (the sequence split over `context`, in its load-balanced order) its random
    # numbers are still those of the one-device run: dropout keeps its places' entries of the whole sequence's
    # mask, attention the entries of the blocks of probabilities a rank computes (its queries x a key block).
    random_context_parallel: ClassVar[bool] = False
    # Decoding one position at a time (generate.py), it keeps the keys and values of the earlier positions.
    kv_cache: ClassVar[bool] = False
    # Tensor parallelism: None (cannot split), "matmul" (column or row parallel by its weight's layout),
    # "pair" (a column-parallel projection in and a row-parallel projection out, Megatron style), "experts"
    # (moe: every expert's MLP, and the shared experts', such a pair on its hidden features, split on
    # handled_dims; the router and the dispatch whole on every rank) or "gather" (batch_norm: parameters and buffers stored split, the
    # parameters gathered whole for use, each rank keeping its slice of the running statistics).
    tensor_parallel: ClassVar[Optional[str]] = None
    # Parameter dimensions the operator computes on sharded (tensor parallelism); a mesh axis that shards
    # another dimension, or a batch axis on any dimension, is gathered before use (ZeRO-3 / FSDP).
    handled_dims: ClassVar[dict[str, tuple[int, ...]]] = {}
    # Parameter dimensions whose mesh axes are expert parallelism (the experts stay, tokens travel).
    expert_dims: ClassVar[dict[str, int]] = {}
    # Its table may be reused, transposed, by a later linear layer (`tie:`).
    tieable: ClassVar[bool] = False
    # In torch these parameters are nn.Linear weights, stored [out, in] (canonical layout is [in, out]).
    torch_transposed: ClassVar[frozenset[str]] = frozenset()
    # Of those, the weights whose nn.Linear modules run in FP8 with `precision.float8` (torchao.float8, when both
    # dimensions are multiples of 16): the torch program's Linear modules whose forward it calls
    float8_weights: ClassVar[frozenset[str]] = frozenset()
    # The JAX program constrains its output to its activation layout even where that is the batch split alone
    # (an embedding's looked-up rows would otherwise come out laid out as its table).
    constrain_output: ClassVar[bool] = False
    # The JAX program defines a function named after the operator (its `_def` macro) that its macro calls:
    # the sampling program (generate.py) imports it from train.py for its decode.
    jax_function: ClassVar[bool] = False

    def helpers(self, attrs: dict[str, Any]) -> frozenset[str]:
        """The shared definitions its macros call, which a program defines once when a layer needs them:
        "project_together" (jax: several input projections as one matmul), "pool2d" (mlx: a pooling window),
        "gather_places" (torch under context parallelism: batch statistics over the whole sequence),
        "gather_sequence" (torch under context parallelism: the layer runs on the whole sequence)."""
        return frozenset({"project_together"}) if len(self.input_projections(attrs)) > 1 else frozenset()

    def forms(self, attrs: dict[str, Any]) -> frozenset[str]:
        """The variants of its own template code this layer uses (a program renders only the variants its layers
        use): moe's "normalize", "shared", "shared_gate", "z_loss"."""
        return frozenset()

    def infer(self, args: Any, inputs: list[TensorType], size: SizeFn, ctx: Any) -> OpResult:
        raise NotImplementedError

    def pipeline_limit(self, attrs: dict[str, Any]) -> Optional[str]:
        """Why this layer cannot run inside a pipeline (the targets' shared limit), or None."""
        return None

    def index_bound(self, attrs: dict[str, Any]) -> Optional[int]:
        """For an operator whose integer input indexes a table: the number of rows (synthetic data stays
        below it); None otherwise."""
        return None

    def input_projections(self, attrs: dict[str, Any]) -> tuple[str, ...]:
        """For a "pair" operator: the weights of its column-parallel input projections ([in, out] each). The
        programs multiply the input by all of them as one matmul (when their output features are split
        alike), so its gradient is one partial sum: one all-reduce over `tensor` (Megatron's count)."""
        return ()

    def decodes(self, attrs: dict[str, Any]) -> bool:
        """Can the layer run one sequence position at a time, the earlier positions' state cached (the
        sampling program's decode, docs/program.md "Sampling")? Per-position operators can."""
        return self.per_position

    def torch_args(self, attrs: dict[str, Any], decode: bool = False, split: bool = False) -> list[tuple[str, Any]]:
        """The optional keyword arguments of the torch program's call for this layer, (name, value) pairs in the
        call's order, only those the layer sets: its module's constructor (templates/torch/ops.py.j2 <op>_init),
        or with `decode` generate.py's decode call (decode_<op>; `split`: its weights stay split over
        `tensor`)."""
        return []

    def decode_features(self, attrs: dict[str, Any]) -> frozenset[str]:
        """What the sampling program's shared decode code must handle for this layer (lowering/sampling.py
        gathers them over the layers as `sampling.features`): "kv_attention" (a cached attention), with
        "qkv_bias" (biased projections) and "o_bias_off" (biased q/k/v, not o); "dense_mlp" (an mlp), with
        "gated" (swiglu), "ungated" (another activation) and "gate_activation" (a gate other than silu); "experts"
        (a dropless moe layer), with "experts_gated" / "experts_ungated" and its forms "experts_normalize",
        "experts_shared", "experts_shared_gate"."""
        return frozenset()

    def context_role(self, attrs: dict[str, Any]) -> Optional[str]:
        """How the layer runs on a sequence split over `context`: "position", "ring", "gather", or None (it
        cannot: it mixes positions, or draws random numbers whose masks would follow the split)."""
        if self.is_random(attrs) and not self.random_context_parallel:
            return None
        return self.context_parallel or ("position" if self.per_position else None)

    def helper_keywords(self, attrs: dict[str, Any]) -> list[tuple[str, Any]]:
        """The optional keyword arguments of the layer's call of its helper function in the functional programs
        (JAX's and MLX's ops.py), in the helper's parameter order: (name, value), each value a literal, only those
        that differ from the helper's default. A target adds its own (JAX's `parts`, MLX's `tp`)."""
        return []

    def jax_keywords(self, layer: dict[str, Any]) -> list[tuple[str, Any]]:
        """helper_keywords in the JAX program (templates/jax/ops.py.j2; `layer`: the jax lowering's layer dict,
        its `attrs` and what the lowering adds)."""
        return self.helper_keywords(layer["attrs"])

    def jax_params(self, uses: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        """The optional parameters of the JAX program's helper function (templates/jax/ops.py.j2 `<op>_def`) that
        some layer of the program passes, `uses` the attrs of every layer of the op: (name, default) in order."""
        return []

    def is_random(self, attrs: dict[str, Any]) -> bool:
        """Does the layer draw random numbers (a mask per step, micro-batch and rank)?"""
        return False

    def jax_parts(self, uses: list[dict[str, Any]], program: dict[str, Any]) -> dict[str, list[str]]:
        """The slots of its helper function in the JAX program (templates/jax/ops.py.j2 `<op>_def`): {slot: the
        macros of templates/jax/ops_parts.py.j2 it renders}, every slot given (lowering/parts/jax_model.py), so
        that the helper holds only the code some layer runs. `uses`: the attrs of every layer of the op (none:
        the program has none); `program`: `ring` (context parallelism), `evaluates` (an `eval` section),
        `random` (the random helpers' macros), `draws` (the operators some layer of which draws)."""
        return {}

    def fused_kernel(self, attrs: dict[str, Any]) -> bool:
        """Does a target whose kernel for this layer is fused (the `fused_attention` capability, the cost
        model's CostOptions.fused_attention) save less for the backward pass than the operator's own count?"""
        return False

    def score_flops(self, attrs: dict[str, Any]) -> float:
        """Forward FLOPs per sample that selective remat recomputes (attention scores); 0 for most."""
        return 0.0

    def costs(self, c: Any) -> None:
        """Records what one layer saves for the backward pass and the collectives it implies, through the
        cost model's per-layer context `c` (`planner/costs/walk.py`, `LayerCosts`). Default: nothing saved."""


MASK_BYTES = 1  # a dropout mask element (bool)


class SavesInputs(Op):
    """An operator whose backward pass needs its inputs (activations, norms, max pooling)."""

    def costs(self, c: Any) -> None:
        c.save_inputs()


def given(options) -> list[tuple[str, Any]]:
    """(name, value) of each (name, value, on) whose `on` holds, in order: a call's or signature's optional
    arguments."""
    return [(name, value) for name, value, on in options if on]


def expect_float(t: TensorType, what: str) -> None:
    if t.is_int:
        raise OpError(codes.E029, f"{what} needs a floating-point input, got {t.dtype} {t.show()}", "input")


def expect_features(t: TensorType, what: str) -> None:
    if not t.shape:
        raise OpError(codes.E028, f"{what} needs a feature dimension, got {t.show()}", "input")


def expect_rank(t: TensorType, rank: int, what: str, layout: str) -> None:
    if len(t.shape) != rank:
        raise OpError(codes.E028, f"{what} expects a {layout} input, got {t.show()}", "input")
