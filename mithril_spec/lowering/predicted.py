"""What the plan predicts for one step of the program being built, as plain data: the figures `--profile`
prints next to what it measures (docs/program.md "Profiling"), and the activation offload the program counts.
Read from the build's one `Costing` (lowering/costing.py), the costs its plan.json holds and `plan --target
TARGET` prints; step times for the built-in profiles a device's name selects at run time (DEVICE_PROFILES),
each pricing those costs (no second estimate). They live in plan.json (`predicted`, `profile_predictions`),
which the program's `--profile` reads (runtime/profile.py `plan_predictions`); the program embeds only their
digest (`PREDICTED_DIGEST`, to know its own plan.json) and the offload threshold it runs with."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..planner import hardware as hw
from ..planner.costs import KINDS
from ..targets import TARGETS
from .costing import Costing

# A device name the program reads (torch.cuda.get_device_name, jax's device_kind) -> the built-in profile.
DEVICE_PROFILES = (("H200", "h200-141gb"), ("H100", "h100-sxm-80gb"), ("A100", "a100-80gb"), ("TPU v5", "tpu-v5e"),
                   ("cpu", "cpu"))


def _seconds(x: float) -> float:
    """A predicted time to 4 significant digits (the model's figures carry no more)."""
    return float(f"{x:.4g}")


def predicted(costing: Costing) -> dict[str, Any]:
    plan, costs = costing.plan, costing.costs
    acts = costs.worst.activations
    comm = {k: sum(c.total_bytes for c in costs.collectives if c.kind == k) for k in KINDS}
    calls = {k: sum(c.count for c in costs.collectives if c.kind == k) for k in KINDS}
    # the devices the target's programs run on (a torch program's table holds no TPU)
    devices = [(key, name) for key, name in DEVICE_PROFILES if key in TARGETS[costing.target].capabilities.profiled_devices]
    profiles = {}
    for name in dict.fromkeys(name for _key, name in devices):  # the profiles a device name selects
        t = costing.on(hw.lookup(name, plan.spec)).time
        assert t is not None
        per_kind = {k: 0.0 for k in KINDS}
        for c, s in zip(costs.collectives, t.collective_s):
            per_kind[c.kind] += s
        profiles[name] = {"step_s": _seconds(t.step_s), "compute_s": _seconds(t.compute_s),
                          "offload_s": _seconds(t.offload_s),
                          "comm_s": {k: _seconds(v) for k, v in per_kind.items() if comm[k]}}
    return {
        "peak_bytes": costs.peak,
        # bytes per device per step, and calls, of each collective kind the plan counts
        "comm_bytes": {k: v for k, v in comm.items() if v},
        "comm_calls": {k: v for k, v in calls.items() if comm[k]},
        "profiles": profiles,
        "device_profiles": [list(p) for p in devices],
        # activation offload (training.offload): the threshold, bytes moved out per step, held on the host
        "offload": None if costs.offload_threshold is None else {
            "threshold": costs.offload_threshold, "per_step": acts.offload_per_step, "host_bytes": acts.offloaded},
    }


def profile_predictions(costing: Costing) -> dict[str, Any] | None:
    """plan.json's `predicted` (and `plan --target T --format json`'s): `predicted(costing)` where the
    target's programs profile (`--profile`), else None."""
    return predicted(costing) if TARGETS[costing.target].capabilities.profile else None


def digest(document: dict[str, Any] | None) -> str | None:
    """The first 16 hex digits of the sha256 of `document` (plan.json's `predicted`) as compact JSON with
    sorted keys: what the program embeds (`PREDICTED_DIGEST`) and runtime/profile.py `plan_predictions`
    computes the same way from the plan.json it finds, to know it is the program's own."""
    if document is None:
        return None
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
