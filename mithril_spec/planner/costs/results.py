"""What the cost model returns: memory per pipe rank, collectives, FLOPs and step time."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..hardware import Hardware
from ..states import StateMemory
from .collectives import Collective

REMAT_MODES = ("none", "selective", "full")
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send/recv")


@dataclasses.dataclass(frozen=True)
class CostOptions:
    remat: Optional[str] = None  # override training.remat
    # Parameters gathered (or cast) for the forward pass are freed and produced again for the backward
    # (PyTorch FSDP2's default, the ZeRO-3 paper). False: kept until the backward, as XLA does without remat.
    regather: bool = True
    overlap: bool = True  # data-parallel collectives overlap with compute
    efficiency: Optional[float] = None  # override the hardware profile's
    # The target runs attention (at dropout rate 0) with a fused kernel that stores no [b, heads, s, s]
    # probabilities (its `fused_attention` capability; mithril_spec/targets). False: they are stored, the
    # largest of the targets (`plan` costs the spec's targets together unless given `--target`).
    fused_attention: bool = False
    # The target's program issues the data-parallel gradient reduction as this many calls per step, each a share
    # of the gradients and each paying the collective's latency (torch FSDP2: one per fully_shard unit; DDP: one
    # per bucket). None: one call of all the gradients (`plan` without `--target`)
    reduction_calls: Optional[int] = None
    # The target's program runs this many layers of one pipe rank as sharded-tensor modules, each op through a
    # dispatch in Python (torch: DTensor modules of tensor parallelism), per micro-batch. None: none
    sharded_layers: Optional[int] = None
    # The target whose program's held bytes the states follow (Plan.memory_for: a pipelined jax program holds
    # the layers outside the pipelined block on every pipe rank, and every stage padded to the largest).
    # None: the largest over the spec's targets (what every build must fit)
    target: Optional[str] = None




@dataclasses.dataclass(frozen=True)
class BlockActivations:
    name: str  # the repeat's name
    count: int
    per_copy: int  # bytes saved per copy with no remat (the largest over copies)
    scores: int  # of which attention scores/probabilities (dropped by selective remat)
    checkpoint: int  # the block input, all that full remat keeps per copy


@dataclasses.dataclass(frozen=True)
class Activations:
    """Bytes per device saved for the backward pass (one micro-batch, times those in flight in a pipeline)."""

    remat: str
    saved: int  # for all micro-batches in flight
    recompute: int  # full remat: one block's activations rebuilt during the backward pass
    by_op: dict[str, int]  # saved bytes by operator kind (before remat)
    blocks: tuple[BlockActivations, ...]
    offloaded: int = 0  # of `saved`, the bytes in host memory (activation offload, all micro-batches in flight)
    offload_per_step: int = 0  # bytes moved to host memory per step (and the same back), activation offload

    @property
    def total(self) -> int:
        """On the device: what is saved and not offloaded, and the recomputation."""
        return self.saved - self.offloaded + self.recompute


@dataclasses.dataclass(frozen=True)
class Temporaries:
    """Short-lived buffers at the worst moment of a step (see docs/cost-model.md)."""

    gradient_flow: int  # gradients of the largest layer's output and input, alive together
    loss: int  # fp32 log-softmax and the logits' gradient
    gathered_params: int  # parameters gathered over fsdp (or cast to the compute dtype)
    unsharded_grads: int  # a layer's gradients before their reduce-scatter
    optimizer: int  # update temporaries of the largest parameter shard (fp32)
    float8_casts: int = 0  # precision.float8: the FP8 copies of the largest FP8 layer's operands and their scales

    @property
    def total(self) -> int:
        return (self.gradient_flow + self.loss + self.gathered_params + self.unsharded_grads + self.optimizer
                + self.float8_casts)


@dataclasses.dataclass(frozen=True)
class StageCosts:
    """One pipe rank: the pipeline stages its devices hold (everything when there is no pipeline)."""

    stage: int  # the pipe rank
    layers: tuple[str, ...]  # top-level layers (and `blocks[a:b]` slices of repeats) on this rank
    devices: int  # devices on this rank
    states: StateMemory
    activations: Activations
    temporaries: Temporaries
    in_flight: float  # micro-batches whose activations are alive at once (pipeline schedules)
    collectives: tuple["Collective", ...]
    flops_per_device: float  # forward + backward + recompute, one step
    float8_flops_per_device: float = 0.0  # of which the FP8 linear layers' (precision.float8), forward + backward

    @property
    def peak(self) -> int:
        return self.states.total + self.activations.total + self.temporaries.total




@dataclasses.dataclass(frozen=True)
class Flops:
    forward: float  # whole model, one step (all micro-batches, global batch)
    backward: float  # 2 x forward
    recompute: float  # remat
    per_device_forward: float
    per_device_backward: float
    per_device_recompute: float

    @property
    def model(self) -> float:
        """Forward + backward, without recompute (the MFU numerator)."""
        return self.forward + self.backward

    @property
    def per_device_total(self) -> float:
        return self.per_device_forward + self.per_device_backward + self.per_device_recompute


@dataclasses.dataclass(frozen=True)
class StepTime:
    hardware: str
    peak_flops: float  # per device, for the compute dtype
    efficiency: float
    compute_s: float
    blocking_comm_s: float  # tensor-parallel collectives: on the critical path
    overlapped_comm_s: float  # data-parallel collectives: overlapped with compute
    exposed_comm_s: float  # the part of overlapped_comm_s that compute does not hide
    optimizer_s: float  # memory-bound optimizer update
    bubble: float  # pipeline bubble fraction
    step_s: float
    mfu: float
    hfu: float  # counts recompute too
    samples_per_s: float
    tokens_per_s: Optional[float]
    collective_s: tuple[float, ...]  # per entry of Costs.collectives
    links: tuple[str, ...]  # intra-node | inter-node, per entry of Costs.collectives
    algorithms: tuple[str, ...] = ()  # ring | tree, per entry of Costs.collectives (communication.algorithm)
    offload_s: float = 0.0  # activation offload's transfers to host memory and back (in step_s)
    elementwise_s: float = 0.0  # element-wise activation traffic (costs/overheads.py; in step_s)
    kernels: int = 0  # kernels per step on one device of the slowest pipe rank
    overhead_s: float = 0.0  # kernels and sharded layers x the profile's fixed cost of each (in step_s)
    sharded_layers: int = 0  # tensor-parallel layers run through a sharded-tensor dispatch per step (torch DTensor)


@dataclasses.dataclass(frozen=True)
class Costs:
    remat: str
    zero: int
    micro_batches: int
    local_batch: int  # samples per device per micro-batch
    stages: tuple[StageCosts, ...]
    collectives: tuple[Collective, ...]  # of the busiest pipe rank (the only one without a pipeline)
    flops: Flops
    hardware: Optional[Hardware]
    time: Optional[StepTime]
    notes: tuple[str, ...]
    # the target whose kernels the activations follow (`plan --target`); None: the largest of the spec's targets
    target: Optional[str] = None
    offload_threshold: Optional[int] = None  # activation offload: saved tensors of this many elements or more

    @property
    def worst(self) -> StageCosts:
        return max(self.stages, key=lambda s: s.peak)

    @property
    def peak(self) -> int:
        return self.worst.peak

    @property
    def capacity(self) -> Optional[float]:
        return self.hardware.usable_bytes if self.hardware else None

    @property
    def fits(self) -> Optional[bool]:
        return None if self.hardware is None else self.peak <= self.hardware.usable_bytes

    def comm_bytes(self, kind: Optional[str] = None, axes: Optional[tuple] = None) -> int:
        return sum(c.total_bytes for c in self.collectives
                   if (kind is None or c.kind == kind) and (axes is None or c.axes == tuple(axes)))
