"""moe: a mixture-of-experts feed-forward layer with top-k routing; experts shard over the `expert` axis."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from ..spec.common import Size
from .base import LayerArgs, Op, OpError, OpResult, ParamDef, expect_features, expect_float


class MoeArgs(LayerArgs):
    op: Literal["moe"]
    experts: Size = Field(description="number of experts")
    top_k: Size = Field(1, description="experts each token is routed to")
    hidden: Size = Field(description="hidden size of each expert's MLP")
    capacity_factor: float = Field(1.25, gt=0, description="slots per expert = capacity_factor * tokens * top_k / experts")
    aux_loss_weight: float = Field(0.01, ge=0, description="weight of the load-balancing loss added to the model loss")
    activation: Literal["gelu", "relu", "silu"] = "gelu"


class Moe(Op):
    kind = "moe"
    Args = MoeArgs
    has_params = True
    has_aux_loss = True
    tensor_parallel = "experts"  # the experts' hidden features over `tensor` (Megatron's MLP, per expert)
    # capacity is filled in token order over the whole sample: under context parallelism the programs gather
    # the sequence in its order, run the layer whole on every context rank and keep the rank's places
    context_parallel = "gather"
    handled_dims = {"experts.fc.weight": (2,), "experts.fc.bias": (1,), "experts.proj.weight": (1,)}
    expert_dims = {"experts.fc.weight": 0, "experts.fc.bias": 0, "experts.proj.weight": 0, "experts.proj.bias": 0}

    def helpers(self, attrs):
        return frozenset({"gather_sequence"})  # its capacity is filled in token order: the whole sequence

    def pipeline_limit(self, attrs):
        return "moe layers (their load-balancing loss does not cross the pipeline yet)"

    def infer(self, args, inputs, size, ctx):
        (x,) = inputs
        expect_float(x, "moe")
        expect_features(x, "moe")
        d, emb = x.shape[-1], x.axes[-1]
        e, k, h = size("experts"), size("top_k"), size("hidden")
        if k > e:
            raise OpError("E056", f"top_k ({k}) is larger than the number of experts ({e})", "top_k",
                          help="each token is routed to top_k distinct experts")
        tokens = x.numel // d
        tokens_per_sample = tokens
        params = (
            ParamDef("router.weight", (d, e), (emb, None)),
            ParamDef("experts.fc.weight", (e, d, h), ("experts", emb, "mlp")),
            ParamDef("experts.fc.bias", (e, h), ("experts", "mlp"), init="zeros"),
            ParamDef("experts.proj.weight", (e, h, d), ("experts", "mlp", emb)),
            ParamDef("experts.proj.bias", (e, d), ("experts", emb), init="zeros"),
        )
        flops = 2 * tokens * d * e + k * (2 * tokens * 2 * d * h + 8 * tokens * h)
        # Slots per expert per sample (docs/program.md "Mixture of experts"): decided here, once, for every target.
        capacity = math.ceil(args.capacity_factor * tokens_per_sample * k / e)
        attrs = {"dim": d, "experts": e, "top_k": k, "hidden": h, "capacity_factor": args.capacity_factor,
                 "capacity": capacity,
                 "aux_loss_weight": args.aux_loss_weight, "activation": args.activation}
        return OpResult(x, params, attrs, flops=flops)

    def costs(self, c):
        a = c.attrs
        tokens = c.b * (c.x.numel // c.x.shape[-1])
        ep = c.sorted_axes(c.param("experts.fc.weight").spec[0])  # expert parallel axes
        T = c.tp.get("experts.fc.weight", frozenset())
        c.div_axes |= T
        slots = math.ceil(a["capacity_factor"] * tokens * a["top_k"])  # token slots computed per device
        cb = c.compute_bytes
        if c.context > 1:  # the sequence split over `context`: gathered whole in its order on every rank, and
            c.gather_sequence()  # kept for the backward pass instead of the rank's places
        else:
            c.save_input()
        c.save("router", tokens * a["experts"] * 4)
        c.save("dispatched", slots * a["dim"] * cb)
        c.save("hidden0", slots * a["hidden"] // c.deg(T) * cb)
        c.save("hidden1", slots * a["hidden"] // c.deg(T) * cb)
        c.save("combined", slots * a["dim"] * cb)
        if ep:
            payload = slots * a["dim"] * cb
            what = "expert parallel (moe dispatch and combine)"
            for ph in c.phases:
                c.add_coll("all-to-all", ep, ph, what, payload, True, 2)
            c.add_coll("all-to-all", ep, "backward", what, payload, True, 2)
        if T:  # each expert's MLP split on its hidden features (Megatron's, per expert)
            self._tensor_parallel(c, T, c.b * a["experts"] * a["capacity"] * a["dim"] * cb)

    @staticmethod
    def _tensor_parallel(c, T, slot_bytes: int) -> None:
        """The router and the dispatch run whole on every rank, so what is all-reduced is the experts'
        partial outputs over every slot [E, b, C, d] (forward) and the slots' partial input gradient
        (backward), not the tokens; a sequence split over `tensor` is gathered before the layer (and the
        output gradient in the backward pass), each rank keeping its positions of the output."""
        ax = c.sorted_axes(T)
        what = "tensor-parallel (moe)"
        split = c.in_axes & T
        for ph in c.phases:
            if split:
                c.add_coll("all-gather", ax, ph, what + " input all-gather", c.nbytes(c.x, c.in_axes - T), True)
            c.add_coll("all-reduce", ax, ph, what + " expert outputs all-reduce (every slot)", slot_bytes, True)
        if split:
            c.add_coll("all-gather", ax, "backward", what + " output-gradient all-gather",
                       c.nbytes(c.out, c.out_axes - T), True)
        if c.needs_dx:
            c.add_coll("all-reduce", ax, "backward", what + " slot-gradient all-reduce", slot_bytes, True)
