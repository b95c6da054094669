"""The reference layer `mithril-spec calibrate` times, and the `efficiency` it sets.

A calibrated profile's figures describe kernels in isolation: matmuls at their best shape, element-wise
kernels, a kernel's fixed cost. A model's layer runs its matmuls at smaller and odder shapes (the projections
of a few heads, attention's batched products of a head's width, the backward pass's transposed operands)
between kernels of its own, and reaches less. So calibrate also times one reference layer, a pre-norm
decoder block forward and backward (`PROBE`), on every device at once, and sets the profile's `efficiency`
to what the cost model needs to predict that layer's measured time: the cost model predicts the block, as a
spec, with the profile at efficiency 1 (its matmul time at the best rate, its element-wise traffic, its
kernels' fixed cost), and the efficiency is the matmul time over what the measured time leaves for the
matmuls (docs/cost-model.md#calibration).

Torch runs a tensor-parallel layer as DTensor modules, whose fixed cost (DTensor's dispatch in Python, and on
a CPU whose cores the ranks share, each rank's wait at an all-reduce for a partner the scheduler has put
aside) no isolated figure shows. So on CPU devices, with an even number of them, `calibrate --target torch`
also times the block run tensor-parallel over pairs, as the programs run it, and sets
`sharded_layer_overhead_us` to what the model needs to predict that time: the model costs the block as a
`tensor=2` spec at the calibrated efficiency with no such overhead, and what the measured time leaves is
shared over the block's sharded layer passes.
"""

from __future__ import annotations

import dataclasses
import json

# [batch, seq, dim, heads, ff] of the reference block: 1024 tokens, as the matmul shapes' m
PROBE = (8, 128, 256, 4, 1024)
QUICK_PROBE = (2, 128, 128, 2, 512)
LEAST_EFFICIENCY = 0.01  # (a block timed while the machine stalled, 100x its matmuls' time at the best rate or
# more, does not drive the profile's efficiency towards 0)


def probe_spec(dims: tuple[int, int, int, int, int], hardware: dict, tensor: int = 1) -> str:
    """The reference block as a spec on one device (`tensor` > 1: tensor-parallel over that many), with
    `hardware` (a profile entry, spec units) in its `hardware:` list. JSON inside YAML: every value is
    escaped."""
    b, s, d, heads, ff = dims
    spec = {
        "version": 1, "name": "calibration-probe", "dims": {"seq": s, "d": d, "heads": heads, "ff": ff},
        "model": {
            "inputs": {"x": {"shape": ["batch", "seq", "d"], "dtype": "float32"},
                       "y": {"shape": ["batch", "seq", "d"], "dtype": "float32"}},
            "layers": [
                {"op": "layer_norm", "name": "ln1", "input": "x"},
                {"op": "attention", "name": "attn", "heads": "heads", "causal": True},
                {"op": "add", "name": "res1", "inputs": ["x", "attn"]},
                {"op": "layer_norm", "name": "ln2"},
                {"op": "mlp", "name": "mlp", "hidden": "ff", "activation": "gelu"},
                {"op": "add", "name": "res2", "inputs": ["res1", "mlp"]},
            ],
            "loss": {"op": "mse", "predictions": "res2", "targets": "y"},
        },
        "mesh": {"tensor": tensor} if tensor > 1 else {"data": 1},
        # (the logical axes the attention's heads and the mlp's hidden features carry, split over `tensor`)
        **({"sharding": {"rules": dict.fromkeys(("heads", "kv_heads", "mlp"), "tensor")}} if tensor > 1 else {}),
        "training": {"batch_size": b, "steps": 1, "optimizer": {"name": "sgd", "lr": 1e-3}},
        "hardware": [hardware],
    }
    return json.dumps(spec, indent=1)


@dataclasses.dataclass(frozen=True)
class ProbeTerms:
    """The cost model's view of the reference block's forward and backward pass (seconds): its matmuls (at the
    profile's best rate unless `probe_terms` is given another efficiency), its element-wise traffic and its
    kernels' fixed cost; run tensor-parallel, its blocking collectives and its sharded-tensor layer passes too."""

    matmul_s: float
    elementwise_s: float
    overhead_s: float
    blocking_s: float = 0.0
    sharded: int = 0  # sharded-tensor layer passes (CostOptions.sharded_layers), each charged in overhead_s

    @property
    def busy_s(self) -> float:
        """The device's own work: matmuls, element-wise traffic, kernels (and sharded layers, if charged)."""
        return self.matmul_s + self.elementwise_s + self.overhead_s


def probe_terms(dims: tuple[int, int, int, int, int], fields: dict, target: str, tensor: int = 1,
                efficiency: float = 1.0) -> ProbeTerms:
    """The model's terms for the block under `fields` (a profile entry, spec units) at `efficiency`, as
    `plan --target TARGET` costs it (the target's attention kernel decides which activations it stores; run
    tensor-parallel over `tensor` devices, the target's sharded-tensor layers are charged)."""
    from .frontend import compile_document
    from .planner.hardware import lookup
    from .source import load_text
    from .lowering.costing import costing

    entry = {**fields, "efficiency": efficiency}
    c = compile_document(load_text(probe_spec(dims, entry, tensor), "calibration-probe.yaml"))
    hw = lookup(entry["name"], c.spec, c.doc)
    t = costing(c.plan, target).on(hw).time
    assert t is not None
    return ProbeTerms(t.compute_s, t.elementwise_s, t.overhead_s, t.blocking_comm_s, t.sharded_layers)


def efficiency_from_probe(measured_s: float, terms: ProbeTerms) -> float:
    """The efficiency at which the model's matmul time plus its other terms equals the measured time; 1 when
    the other terms and the matmuls at the best rate already take as long."""
    left = measured_s - terms.elementwise_s - terms.overhead_s
    if left <= terms.matmul_s:
        return 1.0
    return max(LEAST_EFFICIENCY, terms.matmul_s / left)


def sharded_overhead_from_probe(measured_s: float, terms: ProbeTerms, scale: float = 1.0) -> float:
    """Seconds of one sharded-tensor layer pass at which the model predicts the block run tensor-parallel:
    what the measured time leaves beyond the model's other terms for it (`terms`: costed with no such
    overhead; its own work times `scale`, the measured over the predicted time of the plain block where the
    model predicts that one slower than measured, the efficiency at its bound of 1), shared over its sharded
    layer passes; 0 when those terms already take as long."""
    left = measured_s - scale * terms.busy_s - terms.blocking_s
    return max(0.0, left) / terms.sharded if terms.sharded else 0.0
