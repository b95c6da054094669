"""Activation offload (`training.offload`): which saved tensors go to host memory, and what moving them costs.

The threshold compares a saved tensor's elements per device (one micro-batch) with `training.offload.threshold`;
a tensor at or above it leaves the device after the forward pass and comes back for the backward pass. Under
remat only what remat keeps can move (full: the block inputs; selective: no attention scores). The transfers
run on the compute stream (the generated programs copy as they save), so their time adds to the step:
`2 x bytes moved per step / host bandwidth` (out and back, one direction at a time). docs/cost-model.md
"Activation offload".
"""

from __future__ import annotations

from typing import Optional


def offloadable(saved: dict, elems: dict, threshold: Optional[int], drop_scores: bool) -> int:
    """Bytes of the saved tensors (`saved`: key -> (op, bytes, is score); `elems`: key -> elements) that reach
    `threshold` elements; scores left out when remat drops them. 0 without offload."""
    if threshold is None:
        return 0
    return sum(nbytes for key, (_, nbytes, score) in saved.items()
               if elems.get(key, 0) >= threshold and not (score and drop_scores))


def transfer_seconds(bytes_per_step: int, host_bytes_per_s: float) -> float:
    """Seconds per step moving `bytes_per_step` to the host and the same back, one direction at a time."""
    return 2 * bytes_per_step / host_bytes_per_s
