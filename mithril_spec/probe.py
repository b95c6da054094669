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
"""

from __future__ import annotations

import dataclasses
import json

# [batch, seq, dim, heads, ff] of the reference block: 1024 tokens, as the matmul shapes' m
PROBE = (8, 128, 256, 4, 1024)
QUICK_PROBE = (2, 128, 128, 2, 512)
LEAST_EFFICIENCY = 0.01  # (a block timed while the machine stalled, 100x its matmuls' time at the best rate or
# more, does not drive the profile's efficiency towards 0)


def probe_spec(dims: tuple[int, int, int, int, int], hardware: dict) -> str:
    """The reference block as a spec on one device, with `hardware` (a profile entry, spec units) in its
    `hardware:` list. JSON inside YAML: every value is escaped."""
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
        "mesh": {"data": 1},
        "training": {"batch_size": b, "steps": 1, "optimizer": {"name": "sgd", "lr": 1e-3}},
        "hardware": [hardware],
    }
    return json.dumps(spec, indent=1)


@dataclasses.dataclass(frozen=True)
class ProbeTerms:
    """The cost model's view of the reference block's forward and backward pass (seconds): its matmuls at the
    profile's best rate (efficiency 1), its element-wise traffic and its kernels' fixed cost."""

    matmul_s: float
    elementwise_s: float
    overhead_s: float


def probe_terms(dims: tuple[int, int, int, int, int], fields: dict, target: str) -> ProbeTerms:
    """The model's terms for the block under `fields` (a profile entry, spec units), as `plan --target
    TARGET` costs it (the target's attention kernel decides which activations it stores)."""
    from .frontend import compile_document
    from .planner.costs import CostOptions, estimate_targets
    from .planner.hardware import lookup
    from .source import load_text
    from .targets import attention_kernels

    entry = {**fields, "efficiency": 1.0}
    c = compile_document(load_text(probe_spec(dims, entry), "calibration-probe.yaml"))
    hw = lookup(entry["name"], c.spec, c.doc)
    t = estimate_targets(c.plan, attention_kernels([target]), hw, CostOptions(), target=target).time
    assert t is not None
    return ProbeTerms(t.compute_s, t.elementwise_s, t.overhead_s)


def efficiency_from_probe(measured_s: float, terms: ProbeTerms) -> float:
    """The efficiency at which the model's matmul time plus its other terms equals the measured time; 1 when
    the other terms and the matmuls at the best rate already take as long."""
    left = measured_s - terms.elementwise_s - terms.overhead_s
    if left <= terms.matmul_s:
        return 1.0
    return max(LEAST_EFFICIENCY, terms.matmul_s / left)
