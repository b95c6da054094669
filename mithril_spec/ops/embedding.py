"""embedding (token ids -> vectors) and pos_embedding (learned positions added to a sequence)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, StrictInt

from .. import codes
from ..spec.common import Size
from .base import LayerArgs, Op, OpError, OpResult, ParamDef, TensorType, expect_float


class EmbeddingArgs(LayerArgs):
    op: Literal["embedding"]
    vocab: Size
    dim: Size
    scale: Optional[float] = Field(None, gt=0, description="multiplies the rows looked up (Gemma: sqrt(dim))")
    padding_idx: StrictInt | None = Field(
        None, ge=0, description="a row of the table that its lookups do not train (torch's nn.Embedding padding_idx: "
        "transformers' pad_token_id); a tied head's gradient still reaches it")


class Embedding(Op):
    kind = "embedding"
    jax_function = True
    constrain_output = True
    tieable = True
    context_parallel = "position"  # a lookup per position
    handled_dims = {"weight": (0, 1)}
    Args = EmbeddingArgs
    has_params = True

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        if not x.is_int:
            raise OpError(codes.E029, f"embedding needs integer token ids, got {x.dtype} {x.show()}", "input")
        vocab, dim = size("vocab"), size("dim")
        if args.padding_idx is not None and args.padding_idx >= vocab:
            raise OpError(codes.E030, f"padding_idx {args.padding_idx} is not a row of the table (vocab {vocab})",
                          "padding_idx", help=f"give a token id in [0, {vocab})")
        out = TensorType(x.shape + (dim,), x.axes + ("embed",), "float32")
        params = (ParamDef("weight", (vocab, dim), ("vocab", "embed")),)
        attrs = {"vocab": vocab, "dim": dim, "scale": args.scale}
        if args.padding_idx is not None:  # (absent otherwise: the lowerings of specs without it stay as they were)
            attrs["padding_idx"] = args.padding_idx
        return OpResult(out, params, attrs,
                        flops=x.numel * dim if args.scale else 0)

    def decodes(self, attrs):
        return True  # a row per position

    def index_bound(self, attrs):
        return attrs["vocab"]

    def costs(self, c):
        c.save_input()
        w, spec = c.tp.get("weight", frozenset()), c.param("weight").spec  # [vocab, dim]
        T_v = frozenset(a for a in spec[0] if a in w)
        T_e = frozenset(a for a in spec[1] if a in w)
        if T_v:  # vocab parallel: each rank looks up its rows, the others give zeros
            c.reduce_out(T_v, "tensor-parallel all-reduce (embedding output)")
        missing = T_e - c.act_axes(c.out, (len(c.out.shape) - 1,))
        if missing:
            c.add_coll("all-gather", c.sorted_axes(missing), "forward", "all-gather (embedding output)",
                       c.nbytes(c.out, c.out_axes - missing), True)


class PosEmbeddingArgs(LayerArgs):
    op: Literal["pos_embedding"]
    max_len: Size = Field(description="longest sequence the table covers")


class PosEmbedding(Op):
    kind = "pos_embedding"
    Args = PosEmbeddingArgs
    has_params = True
    context_parallel = "position"  # the programs add the rows of the global positions a rank holds

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, "pos_embedding")
        if len(x.shape) != 2:
            raise OpError(codes.E028, f"pos_embedding expects [batch, seq, dim], got {x.show()}", "input")
        max_len = size("max_len")
        seq, dim = x.shape
        if seq > max_len:
            raise OpError(codes.E030, f"sequence length {seq} exceeds max_len {max_len}", "max_len")
        params = (ParamDef("weight", (max_len, dim), (None, x.axes[-1])),)
        return OpResult(x, params, {"max_len": max_len, "dim": dim}, flops=x.numel)

    def decodes(self, attrs):
        return True  # the row of the position

    def jax_parts(self, uses, program):
        # the rows of the places' global positions (context parallelism)
        return {"pos_embedding": ["rows_in_places" if program["ring"] else "first_rows"]}
