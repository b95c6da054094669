"""Collectives: what one costs on the wire (ring algorithms) and in time (ring, tree or the cheaper)."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str  # all-reduce | all-gather | reduce-scatter | all-to-all
    axes: tuple[str, ...]  # mesh axes of the group
    group: int  # devices per group
    phase: str  # forward | backward | recompute | step
    what: str
    bytes: int  # payload per call per device: the full (reduced or gathered) buffer
    count: int  # calls per optimizer step
    blocking: bool  # on the critical path (tensor parallel) rather than overlapped (data parallel)
    compression: str = "none"  # none | fp16 | bf16 | powersgd: a data-parallel reduction's (`bytes`: what it sends)

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.count

    @property
    def factor(self) -> float:
        """Bytes each device sends per payload byte (ring algorithms)."""
        n = self.group
        if self.kind == "send/recv":
            return 1.0
        return 2 * (n - 1) / n if self.kind == "all-reduce" else (n - 1) / n

    @property
    def steps(self) -> int:
        if self.kind == "send/recv":
            return 1
        return 2 * (self.group - 1) if self.kind == "all-reduce" else self.group - 1

    @property
    def wire_bytes(self) -> float:
        return self.factor * self.total_bytes


def pipeline_bubble(stages: int, micro_batches: int, virtual: int = 1) -> float:
    """Idle fraction of a GPipe / 1F1B schedule: (p - 1) / (m + p - 1); interleaved with v virtual stages
    per rank: (p - 1) / (v m + p - 1)."""
    if stages <= 1:
        return 0.0
    return (stages - 1) / (virtual * micro_batches + stages - 1)


def ring_time(kind: str, payload: float, group: int, bandwidth: float, latency: float) -> float:
    """Seconds for one ring collective of `payload` bytes over `group` devices."""
    if kind == "send/recv":
        return payload / bandwidth + latency
    if group <= 1:
        return 0.0
    if kind == "all-reduce":
        return 2 * (group - 1) / group * payload / bandwidth + 2 * (group - 1) * latency
    return (group - 1) / group * payload / bandwidth + (group - 1) * latency


def tree_time(payload: float, group: int, bandwidth: float, latency: float) -> float:
    """Seconds for one all-reduce of `payload` bytes as a double binary tree (NCCL's tree): the payload,
    split over two trees and pipelined, goes up (reduce) and down (broadcast) once: 2 payload / bandwidth,
    and 2 ceil(log2 n) latency steps."""
    if group <= 1:
        return 0.0
    return 2 * payload / bandwidth + 2 * math.ceil(math.log2(group)) * latency


def collective_time(kind: str, payload: float, group: int, bandwidth: float, latency: float,
                    algorithm: str = "ring") -> tuple[float, str]:
    """(seconds, algorithm run) for one collective under `communication.algorithm`: ring, tree (all-reduce
    only: NCCL runs the other collectives as rings), or auto (the cheaper of the two)."""
    ring = ring_time(kind, payload, group, bandwidth, latency)
    if algorithm == "ring" or kind != "all-reduce" or group <= 1:
        return ring, "ring"
    tree = tree_time(payload, group, bandwidth, latency)
    if algorithm == "tree" or tree < ring:
        return tree, "tree"
    return ring, "ring"
