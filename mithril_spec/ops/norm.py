"""Normalisations: layer_norm and rms_norm over the last dimension, batch_norm over channels (dim 1)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .. import codes
from .base import LayerArgs, OpError, OpResult, ParamDef, SavesInputs, expect_features, expect_float, given


class LayerNormArgs(LayerArgs):
    op: Literal["layer_norm"]
    eps: float = Field(1e-5, gt=0)
    bias: bool = True


class LayerNorm(SavesInputs):
    kind = "layer_norm"
    jax_function = True
    Args = LayerNormArgs
    has_params = True
    per_position = True
    normalizes = True

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, "layer_norm")
        expect_features(x, "layer_norm")
        d, ax = x.shape[-1], x.axes[-1]
        params = (ParamDef("weight", (d,), (ax,), init="ones"),)
        if args.bias:
            params += (ParamDef("bias", (d,), (ax,), init="zeros"),)
        return OpResult(x, params, {"dim": d, "eps": args.eps, "bias": args.bias}, flops=8 * x.numel)


class RmsNormArgs(LayerArgs):
    op: Literal["rms_norm"]
    eps: float = Field(1e-6, gt=0)
    weight_offset: float = Field(
        0.0, description="added to the weight: x / rms(x) * (weight_offset + weight); Gemma's norms use 1 (their "
        "weight then starts at zeros)")


class RmsNorm(SavesInputs):
    kind = "rms_norm"
    jax_function = True
    Args = RmsNormArgs
    has_params = True
    per_position = True
    normalizes = True

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, "rms_norm")
        expect_features(x, "rms_norm")
        d, ax = x.shape[-1], x.axes[-1]
        params = (ParamDef("weight", (d,), (ax,), init="zeros" if args.weight_offset == 1 else "ones"),)
        return OpResult(x, params, {"dim": d, "eps": args.eps, "weight_offset": args.weight_offset},
                        flops=5 * x.numel)

    def helper_keywords(self, attrs):
        return given((("offset", attrs["weight_offset"], attrs["weight_offset"]),))

    def jax_parts(self, uses, program):
        # with Gemma's weight offset where some layer has one
        return {"rms_norm_def": ["rms_norm_offset" if any(a["weight_offset"] for a in uses) else "rms_norm_plain"]}

    def torch_args(self, attrs, decode=False, split=False):
        return self.helper_keywords(attrs)


class BatchNormArgs(LayerArgs):
    op: Literal["batch_norm"]
    eps: float = Field(1e-5, gt=0)
    momentum: float = Field(0.1, gt=0, lt=1)


class BatchNorm(SavesInputs):
    """Normalises each channel over the batch (and spatial dims); statistics are over the *global* batch."""

    kind = "batch_norm"
    Args = BatchNormArgs
    has_params = True
    normalizes = True
    batch_statistics = True
    # channels split over `tensor` (a channel axis ruled to it): stored split, gathered for use (no handled_dims)
    tensor_parallel = "gather"
    # Over `context` its input is [batch, seq, ...] (every activation is), so its channels are the sequence
    # positions: a rank normalises its places with their rows of the weights, statistics and running buffers.
    context_parallel = "position"

    def helpers(self, attrs):
        return frozenset({"gather_places"})  # its statistics are over every position of the sequence

    def jax_parts(self, uses, program):
        ring, evaluates = program["ring"], program["evaluates"]
        return {
            # its signature and docstring: with `train` where the program evaluates (the running statistics)
            "batch_norm_def": ["batch_norm_evaluating" if evaluates else "batch_norm_training"],
            # its weights read at the places' positions (context parallelism), the evaluation's running statistics
            "batch_norm_inputs": ["channels_in_places"] * ring
            + [("running_statistics_in_places" if ring else "running_statistics")] * evaluates,
            # the statistics moved back to the sequence's order (context parallelism)
            "batch_norm_stats": ["statistics_in_order"] * ring,
        }

    def pipeline_limit(self, attrs):
        return "batch_norm (running statistics per micro-batch and stage)"

    def costs(self, c):
        c.save_inputs()
        if c.batch:  # statistics over the global batch: a mean and a variance per channel, both ways
            stats = 2 * c.attrs["channels"] * 4
            ax = c.sorted_axes(c.batch)
            c.add_coll("all-reduce", ax, "forward", "batch-norm statistics", stats, True)
            c.add_coll("all-reduce", ax, "backward", "batch-norm statistics", stats, True)

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, "batch_norm")
        if not x.shape:
            raise OpError(codes.E028, f"batch_norm needs a channel dimension, got {x.show()}", "input")
        c, ax = x.shape[0], x.axes[0]
        params = (
            ParamDef("weight", (c,), (ax,), init="ones"),
            ParamDef("bias", (c,), (ax,), init="zeros"),
        )
        buffers = (
            ParamDef("running_mean", (c,), (ax,), init="zeros"),
            ParamDef("running_var", (c,), (ax,), init="ones"),
        )
        attrs = {"channels": c, "eps": args.eps, "momentum": args.momentum, "spatial": len(x.shape) - 1}
        return OpResult(x, params, attrs, flops=8 * x.numel, buffers=buffers)
