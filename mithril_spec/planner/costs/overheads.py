"""What a step costs besides its matmul FLOPs and its collectives, for profiles that measure it
(`mithril-spec calibrate`; docs/cost-model.md#calibration):

- element-wise (memory-bound) traffic: norms, activations, residual adds, softmax, dropout and their
  gradients move their tensors through memory at the profile's `elementwise_bytes_per_s`. Each activation
  the backward pass keeps is taken as the output of such a kernel: written once in the forward pass, read
  once in the backward pass, and its gradient written and read once: `ACTIVATION_PASSES` passes over the
  activation bytes of every micro-batch (before remat).
- the fixed cost of a kernel (dispatch, launch), `kernel_overhead_s`, times the kernels of a step: for
  every layer and micro-batch one in the forward pass and two in the backward pass (the input's and the
  parameters' gradients), one more for every layer full remat recomputes, one per collective call and one
  per parameter tensor in the optimizer update. What `calibrate` measures as a kernel's cost is a third of
  a tiny layer's forward and backward pass, so the count and the cost are of the same thing.
- the fixed cost of a tensor-parallel layer run as a sharded-tensor module, `sharded_layer_overhead_s`
  (torch: a DTensor module, each of whose ops goes through DTensor's dispatch in Python, about a millisecond
  of a CPU core per layer's forward and backward), times the layers the target's program runs so
  (`CostOptions.sharded_layers`, from the target: `plan --target torch`) per micro-batch, and a third of it
  for each such layer full remat runs forward again. `calibrate --target torch` sets it from the reference
  block run tensor-parallel over pairs on CPU devices (mithril_spec/probe.py), otherwise measures it as the
  difference between a chain of tiny linear layers run plain and as DTensor modules, forward and backward.

A built-in profile leaves both at 0: its `efficiency` is a whole-model figure that covers them. A calibrated
profile's efficiency is that of a layer's matmuls beside these terms (on CPU devices: the efficiency at which
the model predicts a timed reference block, mithril_spec/probe.py), so these are charged on their own.
"""

from __future__ import annotations

from ...graph import RepeatNode
from ..hardware import Hardware
from ..plan import Plan
from .results import Costs, StageCosts

ACTIVATION_PASSES = 4  # written (forward), read (backward); its gradient written and read (backward)
KERNELS_PER_LAYER = 3  # forward; backward: the input's gradient and the parameters'


def layer_count(plan: Plan, repeated_only: bool = False) -> int:
    """Layers of the model, a repeated block's once per copy (only those with `repeated_only`: what full
    remat recomputes)."""
    return sum(n.count * len(n.layers) if isinstance(n, RepeatNode) else 0 if repeated_only else 1
               for n in plan.graph.layers)


def elementwise_seconds(stage: StageCosts, costs: Costs, hw: Hardware) -> float:
    """Element-wise traffic of one pipe rank per step, at the profile's element-wise bandwidth (0: not
    modelled)."""
    if not hw.elementwise_bytes_per_s:
        return 0.0
    a = stage.activations
    per_micro_batch = sum(a.by_op.values()) / max(stage.in_flight, 1.0)
    return ACTIVATION_PASSES * per_micro_batch * costs.micro_batches / hw.elementwise_bytes_per_s


def kernel_count(stage: StageCosts, costs: Costs, plan: Plan) -> int:
    """Kernels one device of this pipe rank launches per step (see the module's docstring)."""
    pipe = plan.mesh.pipe
    layers = -(-layer_count(plan) // pipe)
    recomputed = -(-layer_count(plan, repeated_only=True) // pipe) if costs.remat == "full" else 0
    calls = sum(c.count for c in stage.collectives)
    tensors = -(-len(plan.params) // pipe)
    return (KERNELS_PER_LAYER * layers + recomputed) * costs.micro_batches + calls + tensors


def overhead_seconds(stage: StageCosts, costs: Costs, plan: Plan, hw: Hardware,
                     sharded_layers: int = 0) -> tuple[int, int, float]:
    """(kernels, sharded-tensor layer passes, their fixed cost in seconds) of one pipe rank per step;
    `sharded_layers`: the target's sharded-tensor modules on one pipe rank (CostOptions.sharded_layers)."""
    k = kernel_count(stage, costs, plan)
    sharded = sharded_layers * costs.micro_batches
    recomputed = sharded / KERNELS_PER_LAYER if costs.remat == "full" else 0.0  # a forward pass again
    return k, sharded, k * hw.kernel_overhead_s + (sharded + recomputed) * hw.sharded_layer_overhead_s
