"""Predicted step time: compute at the profile's efficiency, blocking and exposed communication, the
pipeline bubble and the memory-bound optimizer update."""

from __future__ import annotations

from ..hardware import Hardware, link
from ..plan import Plan
from .collectives import collective_time, pipeline_bubble
from .offload import transfer_seconds
from .overheads import elementwise_seconds, overhead_seconds
from .results import CostOptions, Costs, StepTime


def _comm(colls, plan: Plan, hw: Hardware) -> tuple[list[float], list[str], float, float, list[str]]:
    times, links, algorithms = [], [], []
    blocking = overlapped = 0.0
    algorithm = plan.spec.communication.algorithm
    for c in colls:
        bw, lat, name = link(plan.mesh, c.axes, hw)
        one, run = collective_time(c.kind, c.bytes, c.group, bw, lat, algorithm)
        t = c.count * one
        times.append(t)
        links.append(name)
        algorithms.append(run)
        if c.blocking:
            blocking += t
        else:
            overlapped += t
    return times, links, blocking, overlapped, algorithms


def compute_dtype(precision, hw: Hardware) -> str:
    """The dtype the matmuls run at: float32 compute with `precision.tf32` runs in TensorFloat-32 where the
    device has it (its profile's `tfloat32` peak; a CPU profile has none)."""
    if precision.compute == "float32" and precision.tf32 and "tfloat32" in hw.flops:
        return "tfloat32"
    return precision.compute


def step_time(costs: Costs, plan: Plan, hw: Hardware, options: CostOptions) -> StepTime:
    """Per pipe rank: compute + blocking communication + the data-parallel communication compute does not
    hide; the slowest rank sets the pace, stretched by the pipeline bubble; then the optimizer update."""
    tr = plan.spec.training
    eff = options.efficiency or hw.efficiency
    peak = hw.peak_flops(compute_dtype(tr.precision, hw))
    worst = None
    for st in costs.stages:
        # precision.float8: the FP8 linear layers' matmuls at the profile's float8 peak, the rest at the compute
        # dtype's (a profile without a float8 peak, which `plan --hardware` refuses: planner/hardware.py
        # float8_diagnostics, and the programs' predictions for an A100 or a CPU, where they emulate FP8: all at
        # the compute dtype's, the emulation's cost not modelled)
        f8 = st.float8_flops_per_device
        compute = (st.flops_per_device - f8) / (peak * eff) + f8 / (hw.flops.get("float8", peak) * eff)
        _, _, blocking, overlapped, _ = _comm(st.collectives, plan, hw)
        # (`communication.overlap: false`, or a device whose collectives do not overlap compute, the profile's
        # `overlap_collectives: false`: the data-parallel collectives wait for the compute)
        hidden = options.overlap and plan.spec.communication.overlap is not False and hw.overlap_collectives
        exposed = max(0.0, overlapped - compute) if hidden else overlapped
        # activation offload: its copies run on the compute stream, out after the forward pass, back before the backward
        offload = transfer_seconds(st.activations.offload_per_step, hw.host_bytes_per_s)
        # profiles that measure them (calibrate): element-wise traffic and the kernels' fixed cost
        elementwise = elementwise_seconds(st, costs, hw)
        kernels, sharded, overhead = overhead_seconds(st, costs, plan, hw, options.sharded_layers or 0)
        busy = compute + blocking + exposed + offload + elementwise + overhead
        if worst is None or busy > worst[0]:
            worst = (busy, compute, blocking, overlapped, exposed, offload, elementwise, kernels, sharded, overhead)
    assert worst is not None
    busy, compute, blocking, overlapped, exposed, offload, elementwise, kernels, sharded, overhead = worst
    times, links, _, _, algorithms = _comm(costs.collectives, plan, hw)
    st = costs.worst.states
    optimizer = (st.params + st.grads + 2 * st.optimizer + st.params) / hw.hbm_bytes_per_s
    pl = plan.pipeline
    bubble = pipeline_bubble(plan.mesh.pipe, pl.microbatches, pl.virtual) if pl else 0.0
    step = busy / (1 - bubble) + optimizer
    devices = plan.mesh.devices
    mfu = costs.flops.model / (step * devices * peak) if step > 0 else 0.0
    hfu = (costs.flops.model + costs.flops.recompute) / (step * devices * peak) if step > 0 else 0.0
    tokens = None
    for i in plan.graph.inputs:
        if i.type.is_int and len(i.type.shape) == 1:
            tokens = tr.batch_size * i.type.shape[0] / step
            break
    return StepTime(hw.name, peak, eff, compute, blocking, overlapped, exposed, optimizer, bubble, step, mfu, hfu,
                    tr.batch_size / step, tokens, tuple(times), tuple(links), tuple(algorithms), offload,
                    elementwise, kernels, overhead, sharded)
