"""The optional `hardware` section: device profiles for `mithril-spec plan --hardware NAME`.

A profile either starts from a built-in one (`base: h100-sxm-80gb`) and overrides some figures, or gives
them all. Units: TFLOP/s, GB (10^9 bytes) and GB/s per device, microseconds.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, PositiveInt

from .common import Strict

# Figures stay within what the cost model's arithmetic can carry (no overflow to infinity, no division by
# almost nothing): from 10^-6 to 10^9 of their unit.
Figure = Annotated[float, Field(ge=1e-6, le=1e9)]
NonNegative = Annotated[float, Field(ge=0, le=1e9)]


class Hardware(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64, description="profile name")
    base: Optional[str] = Field(None, description="a built-in profile to start from, e.g. h100-sxm-80gb")
    description: Optional[str] = None
    flops: Optional[dict[Literal["float32", "tfloat32", "bfloat16", "float16", "float8"], Figure]] = Field(
        None, description="peak dense TFLOP/s per device, by compute dtype (`tfloat32`: float32 matmuls in "
        "TensorFloat-32, what float32 compute runs at with `precision.tf32`; `float8`: FP8 matmuls, what the "
        "linear layers run at with `precision.float8`: a profile without it cannot run them)"
    )
    memory_gb: Optional[Figure] = Field(None, description="device memory, GB (10^9 bytes)")
    reserved_gb: Optional[NonNegative] = Field(
        None, description="memory the runtime keeps for itself (context, workspace), GB"
    )
    hbm_gb_per_s: Optional[Figure] = Field(None, description="device memory bandwidth, GB/s")
    devices_per_node: Optional[PositiveInt] = Field(
        None, description="devices joined by the fast intra-node link (the innermost mesh axes use it)"
    )
    intra_node_gb_per_s: Optional[Figure] = Field(
        None, description="per-device, one-direction bandwidth of the intra-node link, GB/s"
    )
    inter_node_gb_per_s: Optional[Figure] = Field(
        None, description="per-device, one-direction bandwidth between nodes, GB/s"
    )
    intra_node_latency_us: Optional[NonNegative] = None
    inter_node_latency_us: Optional[NonNegative] = None
    host_gb_per_s: Optional[Figure] = Field(
        None, description="per-device, one-direction bandwidth between device and host memory (PCIe), GB/s: "
        "activation offload's transfers"
    )
    efficiency: Optional[Annotated[float, Field(gt=0, le=1)]] = Field(
        None, description="fraction of peak FLOP/s the model's compute is assumed to reach"
    )
    kernel_overhead_us: Optional[NonNegative] = Field(
        None, description="fixed time of one kernel (dispatch and launch) on top of its FLOPs and bytes, "
        "microseconds; 0 by default (`mithril-spec calibrate` measures it)"
    )
    sharded_layer_overhead_us: Optional[NonNegative] = Field(
        None, description="fixed time of one tensor-parallel layer's sharded-tensor dispatch (torch: a DTensor "
        "module; on CPU devices also the ranks' waits for each other at its all-reduces), forward and backward, "
        "on top of its kernels and collectives, microseconds; charged by `plan --target` for "
        "targets that dispatch so; 0 by default (`mithril-spec calibrate --target torch` measures it)"
    )
    elementwise_gb_per_s: Optional[NonNegative] = Field(
        None, description="bandwidth of element-wise (memory-bound) activation traffic, charged on its own, "
        "GB/s; 0 by default: folded into `efficiency` (`mithril-spec calibrate` measures it)"
    )
    overlap_collectives: Optional[bool] = Field(
        None, description="whether data-parallel collectives overlap compute (true by default: a GPU's side "
        "stream); false: the step waits for each of them (CPU devices; `mithril-spec calibrate` measures it)"
    )


class ProfileFile(Strict):
    """A profile file (`plan --hardware FILE.yaml`; what `mithril-spec calibrate` writes): a `hardware` list
    in the format of the spec's section."""

    hardware: list[Hardware] = Field(min_length=1, description="device profiles")
