"""The gradient contract of docs/program.md "Equivalence": a parallel program's first-step gradients
(`--export-grads`, by canonical name) against the one-device program's."""

from __future__ import annotations

import numpy as np


def assert_same_gradients(ref: dict, par: dict, tol: float, what: str) -> float:
    """Every parameter's gradient (by canonical name) equal to the reference's: |par - ref| <= tol * |ref| +
    FLOOR * |whole ref| (L2 norms over the parameter, and over every gradient). FLOOR: float32's resolution
    of the whole gradient, for a gradient that is zero up to rounding (a batch_norm's bias ahead of layer
    norms: 1e-9 where the others are 1e-2) or cancels (its weight), whose own norm says nothing. A wrong
    gradient differs by a large part of itself. Returns the largest relative difference (with the floor)."""
    assert sorted(par) == sorted(ref), f"{what}: gradients of other parameters: {sorted(set(par) ^ set(ref))}"
    whole = float(np.sqrt(sum(np.square(g.astype(np.float64)).sum() for g in ref.values())))
    worst = 0.0
    for name, g in ref.items():
        assert par[name].shape == g.shape, f"{what}: {name} has shape {par[name].shape}, not {g.shape}"
        g = g.astype(np.float64)
        norm, diff = float(np.linalg.norm(g)), float(np.linalg.norm(par[name] - g))
        assert diff <= tol * norm + FLOOR * whole, (
            f"{what}: the gradient of {name} differs from one device's by {diff / max(norm, 1e-30):.2e} of its norm "
            f"{norm:.3e} (ratio of norms {np.linalg.norm(par[name]) / max(norm, 1e-30):.4f}; the whole's {whole:.3e})")
        worst = max(worst, diff / (norm + FLOOR / tol * whole))  # (relative, with the floor)
    return worst


FLOOR = 1e-7  # float32's resolution of the whole gradient (relative to its norm)
