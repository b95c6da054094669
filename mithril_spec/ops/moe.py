"""moe: a mixture-of-experts feed-forward layer with top-k routing; experts shard over the `expert` axis.

Two expert forms: fc -> activation -> proj with biases (gelu, relu, silu), or bias-free SwiGLU (gate, up,
down: Mixtral's w1, w3, w2). Gates are the router's softmax probabilities of the chosen experts, optionally
renormalised over them (Mixtral; Qwen2-MoE's norm_topk_prob). Routing has `capacity` slots per expert and
sample, or is dropless (every expert has a slot for every token of the sample: the programs run the experts
as grouped matmuls over the routed tokens sorted by expert, or under expert parallelism over every slot). Shared experts (Qwen2-MoE,
DeepSeek) are one SwiGLU MLP that every token passes, optionally scaled by a sigmoid gate; a router z-loss
joins the load-balancing loss."""

from __future__ import annotations

import math
from typing import Literal, Optional

from pydantic import Field

from .. import codes
from ..spec.common import Size
from .base import LayerArgs, Op, OpError, OpResult, ParamDef, expect_features, expect_float, given
from .mlp import ffn_forms


class MoeArgs(LayerArgs):
    op: Literal["moe"]
    experts: Size = Field(description="number of experts")
    top_k: Size = Field(1, description="experts each token is routed to")
    hidden: Size = Field(description="hidden size of each expert's MLP")
    capacity_factor: float = Field(1.25, gt=0, description="slots per expert = capacity_factor * tokens * top_k / experts")
    aux_loss_weight: float = Field(0.01, ge=0, description="weight of the load-balancing loss added to the model loss")
    activation: Literal["gelu", "relu", "silu", "swiglu"] = Field(
        "gelu", description="the experts' MLP: fc -> activation -> proj with biases, or swiglu: bias-free "
        "down(silu(gate(x)) * up(x)) (Mixtral's w1, w3, w2)")
    normalize_gates: bool = Field(False, description="renormalise each token's top_k gates to sum to 1 (Mixtral; "
                                  "Qwen2-MoE's norm_topk_prob); false: the router's probabilities as they are")
    dropless: bool = Field(False, description="no capacity: every expert has a slot for every token of the sample, "
                           "so no routed token is dropped (no capacity_factor with it); the experts run as grouped "
                           "matmuls over the routed tokens (under expert parallelism: over every slot, experts / "
                           "top_k times the routed tokens)")
    shared_experts: int = Field(0, ge=0, description="experts every token passes besides its routed ones "
                                "(Qwen2-MoE: 1, DeepSeek: n), one bias-free SwiGLU MLP of shared_experts * "
                                "shared_hidden features; needs activation: swiglu")
    shared_hidden: Optional[Size] = Field(None, description="hidden size of each shared expert (default: hidden)")
    shared_gate: bool = Field(False, description="scale the shared experts' output by sigmoid(x @ shared_gate.weight) "
                              "(Qwen2-MoE's shared_expert_gate)")
    z_loss_weight: float = Field(0.0, ge=0, description="weight of the router z-loss (mean over tokens of "
                                 "logsumexp(router logits)^2) added to the model loss")


class Moe(Op):
    kind = "moe"
    Args = MoeArgs
    has_params = True
    has_aux_loss = True
    tensor_parallel = "experts"  # the experts' hidden features over `tensor` (Megatron's MLP, per expert)
    # capacity is filled in token order over the whole sample: under context parallelism the programs gather
    # the sequence in its order, run the layer whole on every context rank and keep the rank's places
    context_parallel = "gather"
    # (tensor parallelism in torch: the experts' hidden features, fc/gate/up on their outputs and proj/down on
    # their inputs, and the shared expert's alike; the router, experts.proj.bias and shared_gate stay whole)
    handled_dims = {"experts.fc.weight": (2,), "experts.fc.bias": (1,), "experts.proj.weight": (1,),
                    "experts.gate.weight": (2,), "experts.up.weight": (2,), "experts.down.weight": (1,),
                    "shared.gate.weight": (1,), "shared.up.weight": (1,), "shared.down.weight": (0,)}
    expert_dims = {"experts.fc.weight": 0, "experts.fc.bias": 0, "experts.proj.weight": 0, "experts.proj.bias": 0,
                   "experts.gate.weight": 0, "experts.up.weight": 0, "experts.down.weight": 0}

    def forms(self, attrs):
        return frozenset(f for f, on in (("normalize", attrs["normalize_gates"]), ("shared", attrs["shared_hidden"]),
                                         ("shared_gate", attrs["shared_gate"]), ("z_loss", attrs["z_loss_weight"]),
                                         ("dropless", attrs["dropless"]),
                                         # the experts' MLPs: gated (swiglu) or ungated
                                         ("experts_gated", attrs["activation"] == "swiglu"),
                                         ("experts_ungated", attrs["activation"] != "swiglu"))
                         if on)

    jax_function = True  # generate.py's decode calls train.py's `moe`

    def decodes(self, attrs):
        """Dropless routing decodes one position at a time: every choice is kept, so a token's output depends on
        it alone. Capped routing fills an expert's slots over the whole sample (a later token can take the slot
        of an earlier one's second choice), which no decode of the positions so far can follow."""
        return bool(attrs["dropless"])

    def torch_args(self, attrs, decode=False, split=False):
        a = attrs
        if decode:  # generate.py's flags (the decode reads the sizes from the weights)
            return [(k, True) for k, on in (("normalize", a["normalize_gates"]), ("shared", a["shared_hidden"]),
                                            ("shared_gate", a["shared_gate"])) if on]
        return [(k, v) for k, v in (("normalize", a["normalize_gates"] or None), ("dropless", a["dropless"] or None),
                                    ("shared_hidden", a["shared_hidden"]), ("shared_gate", a["shared_gate"] or None),
                                    ("z_loss_weight", a["z_loss_weight"])) if v]

    # the functional helpers' flags (JAX's and MLX's moe), in signature order: (parameter, the layer's attr)
    HELPER_FLAGS = (("normalize", "normalize_gates"), ("grouped", "dropless"), ("shared", "shared_hidden"),
                    ("shared_gate", "shared_gate"), ("z_loss", "z_loss_weight"))

    def helper_keywords(self, attrs):
        return given((name, True, attrs[attr]) for name, attr in self.HELPER_FLAGS)

    def helper_params(self, uses):
        """The flags (name, False) some layer of `uses` (their attrs) sets."""
        return given((name, False, any(a[attr] for a in uses)) for name, attr in self.HELPER_FLAGS)

    def jax_params(self, uses):
        return self.helper_params(uses)

    def jax_keywords(self, layer):
        # `grouped`: the jax lowering's `moe_grouped` (dropless routing without the experts split)
        return self.helper_keywords({**layer["attrs"], "dropless": layer["moe_grouped"]})

    def jax_parts(self, uses, program):
        forms = ffn_forms(uses)
        dropless, zloss = any(a["dropless"] for a in uses), any(a["z_loss_weight"] for a in uses)
        shared, gated = any(a["shared_hidden"] for a in uses), any(a["shared_gate"] for a in uses)
        normalize = any(a["normalize_gates"] for a in uses)
        return {
            # the experts' feed-forward over their slots (dense dispatch) and over sorted rows (dropless routing)
            "slot_experts_ffn": [{"swiglu": "slot_swiglu", "both": "slot_either", "plain": "slot_fc_act_proj"}[forms]],
            "grouped_experts": ["grouped_experts_head", {"swiglu": "grouped_swiglu", "both": "grouped_either", "plain": "grouped_fc_act_proj"}[forms],
                                "grouped_experts_tail"] * dropless,
            # the docstring's fragments: the gates, the experts' forms and shared experts, the z-loss, dropless routes
            "moe_gates_doc": ["renormalised_doc" if normalize else "not_renormalised_doc"],
            "moe_experts_doc": [{"swiglu": "experts_swiglu_doc", "both": "experts_both_doc", "plain": "experts_plain_doc"}[forms]] + [("shared_gated_doc" if gated else "shared_doc")] * shared,
            "moe_losses_doc": ["z_loss_doc"] * zloss,
            "moe_routes_doc": ["grouped_doc"] * dropless,
            # context parallelism: the layer runs on the whole sequence in token order
            "moe_tokens": ["tokens_in_order"] * program["ring"],
            # the router's logits kept for the z-loss
            "moe_router": ["router_logits" if zloss else "router_probs"],
            # the gates renormalised, the experts (grouped where dropless), the shared experts (gated)
            "moe_experts": ["normalize_gates"] * normalize + ["grouped_or_slots" if dropless else "slots"]
            + [("shared_experts_gated" if gated else "shared_experts")] * shared,
            # the z-loss, and the output back in the places' order (context parallelism)
            "moe_losses": ["z_loss"] * zloss + ["places_return" if program["ring"] else "shaped_return"],
        }

    def decode_features(self, attrs):
        out = {"experts", "experts_gated" if attrs["activation"] == "swiglu" else "experts_ungated"}
        out |= {f"experts_{f}" for f in ("normalize", "shared", "shared_gate") if f in self.forms(attrs)}
        return frozenset(out)

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
            raise OpError(codes.E056, f"top_k ({k}) is larger than the number of experts ({e})", "top_k",
                          help="each token is routed to top_k distinct experts")
        tokens = x.numel // d
        tokens_per_sample = tokens
        swiglu = args.activation == "swiglu"
        n_shared = args.shared_experts
        if n_shared and not swiglu:
            raise OpError(codes.E030, "shared experts are SwiGLU MLPs: set activation: swiglu", "shared_experts")
        if args.dropless and "capacity_factor" in args.model_fields_set:
            raise OpError(codes.E030, "dropless routing has no capacity: remove capacity_factor (or dropless)",
                          "capacity_factor")
        if not n_shared and (args.shared_gate or args.shared_hidden is not None):
            field = "shared_gate" if args.shared_gate else "shared_hidden"
            raise OpError(codes.E030, f"{field} is a setting of the shared experts: set shared_experts", field)
        params = [ParamDef("router.weight", (d, e), (emb, None))]
        if swiglu:  # per routed token: three matmuls, silu and the product (expert_flops)
            params += [ParamDef("experts.gate.weight", (e, d, h), ("experts", emb, "mlp")),
                       ParamDef("experts.up.weight", (e, d, h), ("experts", emb, "mlp")),
                       ParamDef("experts.down.weight", (e, h, d), ("experts", "mlp", emb))]
        else:
            params += [ParamDef("experts.fc.weight", (e, d, h), ("experts", emb, "mlp")),
                       ParamDef("experts.fc.bias", (e, h), ("experts", "mlp"), init="zeros"),
                       ParamDef("experts.proj.weight", (e, h, d), ("experts", "mlp", emb)),
                       ParamDef("experts.proj.bias", (e, d), ("experts", emb), init="zeros")]
        expert_flops = self.expert_flops({"dim": d, "hidden": h, "activation": args.activation})
        sh = n_shared * (size("shared_hidden") if args.shared_hidden is not None else h)
        if n_shared:
            params += [ParamDef("shared.gate.weight", (d, sh), (emb, "mlp")),
                       ParamDef("shared.up.weight", (d, sh), (emb, "mlp")),
                       ParamDef("shared.down.weight", (sh, d), ("mlp", emb))]
            if args.shared_gate:
                params.append(ParamDef("shared_gate.weight", (d, 1), (emb, None)))
        # Slots per expert per sample (docs/program.md "Mixture of experts"): decided here, once, for every
        # target. Dropless: as many as the sample's tokens (a token chooses an expert at most once).
        capacity = tokens_per_sample if args.dropless else math.ceil(args.capacity_factor * tokens_per_sample * k / e)
        # the router and the experts: top_k expert MLPs per token (dropless routing runs the experts as grouped
        # matmuls over the routed tokens alone; under expert parallelism it fills every slot: `costs` adds them)
        flops = 2 * tokens * d * e + k * tokens * expert_flops
        if n_shared:
            flops += tokens * (2 * 3 * d * sh + 4 * sh + (2 * d + 4 if args.shared_gate else 0))
        if args.z_loss_weight:
            flops += 3 * tokens * e
        attrs = {"dim": d, "experts": e, "top_k": k, "hidden": h, "capacity_factor": args.capacity_factor,
                 "capacity": capacity, "dropless": args.dropless, "normalize_gates": args.normalize_gates,
                 "aux_loss_weight": args.aux_loss_weight, "z_loss_weight": args.z_loss_weight,
                 "activation": args.activation, "shared_hidden": sh, "shared_gate": args.shared_gate}
        return OpResult(x, tuple(params), attrs, flops=flops)

    def costs(self, c):
        a = c.attrs
        tokens = c.b * (c.x.numel // c.x.shape[-1])
        swiglu = a["activation"] == "swiglu"
        first = "experts.gate.weight" if swiglu else "experts.fc.weight"
        ep = c.sorted_axes(c.param(first).spec[0])  # expert parallel axes
        T = c.tp.get(first, frozenset())
        c.div_axes |= T
        # token slots computed per device: dropless, the routed tokens sorted by expert (grouped matmuls) or,
        # under expert parallelism, every expert's slot for every token (the slots travel whole: all-to-all)
        grouped = a["dropless"] and not ep
        if grouped:
            slots = tokens * a["top_k"]
        elif a["dropless"]:
            slots = tokens * a["experts"]
            c.flops += (a["experts"] - a["top_k"]) * (c.x.numel // a["dim"]) * self.expert_flops(a)
        else:
            slots = math.ceil(a["capacity_factor"] * tokens * a["top_k"])
        cb = c.compute_bytes
        if c.context > 1:  # the sequence split over `context`: gathered whole in its order on every rank, and
            c.gather_sequence()  # kept for the backward pass instead of the rank's places
        else:
            c.save_input()
        c.save("router", tokens * a["experts"] * 4)
        c.save("dispatched", slots * a["dim"] * cb)
        # the hidden features before and after the activation (swiglu: gate, up and their product)
        for j in range(3 if swiglu else 2):
            c.save(f"hidden{j}", slots * a["hidden"] // c.deg(T) * cb)
        c.save("combined", slots * a["dim"] * cb)
        if a["shared_hidden"]:  # the shared experts' gate, up and product, and their gate's logit
            Ts = c.tp.get("shared.gate.weight", frozenset())
            for j in range(3):
                c.save(f"shared{j}", tokens * a["shared_hidden"] // c.deg(Ts) * cb)
            if a["shared_gate"]:
                c.save("shared_gate", tokens * 4)
        if ep:
            payload = slots * a["dim"] * cb
            what = "expert parallel (moe dispatch and combine)"
            for ph in c.phases:
                c.add_coll("all-to-all", ep, ph, what, payload, True, 2)
            c.add_coll("all-to-all", ep, "backward", what, payload, True, 2)
        if T:  # each expert's MLP split on its hidden features (Megatron's, per expert): its rows' partial sums
            rows = tokens * a["top_k"] if grouped else c.b * a["experts"] * a["capacity"]
            self._tensor_parallel(c, T, rows * a["dim"] * cb)
        Ts = c.tp.get("shared.gate.weight", frozenset()) if a["shared_hidden"] else frozenset()
        if Ts:  # the shared experts' MLP split alike: its partial output and its input's gradient all-reduced
            ax, nbytes = c.sorted_axes(Ts), tokens * a["dim"] * cb
            for ph in c.phases:
                c.add_coll("all-reduce", ax, ph, "tensor-parallel (moe) shared experts' output all-reduce", nbytes, True)
            if c.needs_dx:
                c.add_coll("all-reduce", ax, "backward", "tensor-parallel (moe) shared experts' input-gradient "
                           "all-reduce", nbytes, True)

    @staticmethod
    def expert_flops(a) -> int:
        """One routed token's flops in one expert's MLP."""
        d, h = a["dim"], a["hidden"]
        return 2 * 3 * d * h + 4 * h if a["activation"] == "swiglu" else 2 * 2 * d * h + 8 * h

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
