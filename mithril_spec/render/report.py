"""The plan report: one self-contained HTML page (inline CSS and SVG, no external assets).

It shows the device mesh as a grid, a partition map (for each large tensor, which shard lives on which
device), per-device memory bars by category, the communication table, FLOPs and the cost model's notes.
Geometry is computed here; templates/report/report.html.j2 only arranges it.
"""

from __future__ import annotations

import colorsys
import math
from typing import Any, Optional

from .. import __version__
from ..planner.costs import Costs
from ..planner.plan import ParamPlan, Plan
from ..planner.table import block_name, human_bytes, human_flops, human_seconds
from .environment import make_environment

MAX_DEVICES_DRAWN = 64
MAX_TENSORS = 8
CELL = 34  # px, one device in a mesh grid
MINI = 18  # px, one device in a partition map's mini grid

CATEGORIES = (  # (key, label, colour)
    ("params", "parameters", "#4e79a7"),
    ("grads", "gradients", "#f28e2b"),
    ("optimizer", "optimizer state", "#e15759"),
    ("buffers", "buffers", "#b07aa1"),
    ("activations", "activations", "#59a14f"),
    ("temporaries", "temporaries", "#edc948"),
)


def colour(i: int, n: int) -> str:
    """A distinct colour for shard i of n."""
    if n <= 1:
        return "#9fb3c8"
    r, g, b = colorsys.hls_to_rgb((i / n * 0.85 + 0.55) % 1.0, 0.58, 0.62)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def _coords(plan: Plan, limit: int = MAX_DEVICES_DRAWN) -> list[dict[str, int]]:
    """Mesh coordinates of the first `limit` device ids (row-major over the mesh axes, the last innermost):
    the devices drawn. (Never every device: a mesh may have millions.)"""
    axes = plan.mesh.axes
    sizes = [plan.mesh.size(a) for a in axes]
    out = []
    for d in range(min(plan.mesh.devices, limit)):
        c, rem = {}, d
        for a, n in zip(reversed(axes), reversed(sizes)):
            c[a] = rem % n
            rem //= n
        out.append(c)
    return out


def _grid_shape(plan: Plan) -> tuple[list[str], list[str]]:
    """Which mesh axes run down the rows and which across the columns of the mesh drawing."""
    axes = list(plan.mesh.axes)
    if not axes:
        return [], []
    if len(axes) == 1:
        return [], axes
    split = len(axes) // 2
    return axes[:split], axes[split:]


def _index(coord: dict[str, int], axes, plan: Plan) -> int:
    i = 0
    for a in axes:
        i = i * plan.mesh.size(a) + coord.get(a, 0)
    return i


def _mesh_cells(plan: Plan, coords, cell: int, fills: Optional[list[str]] = None, labels: bool = True):
    rows_axes, cols_axes = _grid_shape(plan)
    cells = []
    for d, c in enumerate(coords[:MAX_DEVICES_DRAWN]):
        r, k = _index(c, rows_axes, plan), _index(c, cols_axes, plan)
        label = " ".join(f"{a[0]}{c[a]}" for a in plan.mesh.axes)
        cells.append({"x": 4 + k * cell, "y": 4 + r * cell, "w": cell - 3, "h": cell - 3, "device": d,
                      "fill": fills[d] if fills else "#dfe7ef", "title": f"device {d}: {label or 'single device'}",
                      "text": str(d) if labels else ""})
    nrows = max((c["y"] - 4) // cell + 1 for c in cells) if cells else 1
    ncols = max((c["x"] - 4) // cell + 1 for c in cells) if cells else 1  # (of the devices drawn)
    return cells, 8 + ncols * cell, 8 + nrows * cell


def _shard_of(p: ParamPlan, coord: dict[str, int], plan: Plan) -> tuple[int, ...]:
    return tuple(_index(coord, d, plan) for d in p.spec)


def _tensor_view(p: ParamPlan, plan: Plan, coords) -> dict[str, Any]:
    """A tensor drawn as a rectangle cut into its shards, and the mesh coloured by the shard each holds: the
    distinct shards of the devices drawn (`coords`), however many devices the mesh has."""
    shape = p.param.shape
    rows_dims = [0] if len(shape) >= 2 else []
    cols_dims = list(range(1, len(shape))) if len(shape) >= 2 else [0]
    degrees = [plan.mesh.degree(d) for d in p.spec]
    n_shards = math.prod(degrees) if degrees else 1
    shard_ids: dict[tuple, int] = {}
    for c in coords:
        shard_ids.setdefault(_shard_of(p, c, plan), len(shard_ids))
    total = max(len(shard_ids), 1)

    def flat(sh: tuple[int, ...]) -> int:
        i = 0
        for s, n in zip(sh, degrees):
            i = i * n + s
        return i

    # the rectangle: rows split by dim 0's degree, columns by the rest
    W, H = 220.0, (120.0 if len(shape) >= 2 else 26.0)
    rdeg = math.prod(degrees[i] for i in rows_dims) if rows_dims else 1
    cdeg = math.prod(degrees[i] for i in cols_dims) if cols_dims else 1
    blocks = []
    for sh, sid in shard_ids.items():
        r = _mixed(sh, degrees, rows_dims)
        k = _mixed(sh, degrees, cols_dims)
        blocks.append({"x": 2 + k * W / cdeg, "y": 2 + r * H / rdeg, "w": max(W / cdeg - 1, 0.5),
                       "h": max(H / rdeg - 1, 0.5),
                       "fill": colour(sid, total), "title": f"shard {list(sh)} of {degrees}", "shard": sid})
    fills = [colour(shard_ids[_shard_of(p, c, plan)], total) for c in coords]
    cells, gw, gh = _mesh_cells(plan, coords, MINI, fills, labels=False)
    for cell, c in zip(cells, coords):
        cell["shard"] = shard_ids[_shard_of(p, c, plan)]
        cell["title"] += f" holds shard {list(_shard_of(p, c, plan))}"
    replicas = plan.mesh.devices // max(n_shards, 1)
    return {
        "name": p.name, "shape": list(shape), "layout": _pspec(p.spec), "local_shape": list(p.local_shape),
        "bytes": human_bytes(p.bytes), "local_bytes": human_bytes(p.local_bytes), "shards": n_shards,
        "replicas": replicas, "blocks": blocks, "rect_w": W + 4, "rect_h": H + 4, "cells": cells, "grid_w": gw,
        "grid_h": gh,
    }


def _mixed(sh, degrees, dims) -> int:
    i = 0
    for d in dims:
        i = i * degrees[d] + sh[d]
    return i


def _pspec(spec) -> str:
    return "[" + ", ".join("-" if not d else (d[0] if len(d) == 1 else "(" + ",".join(d) + ")") for d in spec) + "]"


def _large_tensors(plan: Plan) -> list[tuple[ParamPlan, str, int]]:
    """The largest parameters, each once: a parameter outside repeated blocks, or a block parameter for all
    its copies (named `blocks.[0-3].attn.q.weight`, drawn from copy 0: every copy has its layout), with its
    name and number of copies."""
    firsts = {b.first.name: (r, b) for r in plan.repeats for b in r.params}
    rows: list[tuple[ParamPlan, str, int]] = []
    for p in plan.params:  # layer order, so that equal sizes keep it
        if p.name in firsts:
            r, b = firsts[p.name]
            rows.append((p, block_name(r, b.local), r.count))
        elif p.name not in plan.in_repeat:
            rows.append((p, p.name, 1))
    ranked = sorted(rows, key=lambda row: -row[0].bytes)
    return ranked[:MAX_TENSORS]


def context(plan: Plan, costs: Costs) -> dict[str, Any]:
    coords = _coords(plan)
    cells, gw, gh = _mesh_cells(plan, coords, CELL)
    hw = costs.hardware
    st = costs.worst
    values = {
        "params": st.states.params, "grads": st.states.grads, "optimizer": st.states.optimizer,
        "buffers": st.states.buffers, "activations": st.activations.total, "temporaries": st.temporaries.total,
    }
    # the bars' scale: up to the usable memory when it is near the peak, else the peak (capacity off scale)
    cap = hw.usable_bytes if hw else None
    on_scale = cap is not None and cap <= 2 * st.peak
    scale_max = max(st.peak * 1.05, cap if on_scale else 0, 1)
    bar_w = 520.0
    n_bars = min(plan.mesh.devices, 32)
    segments = []
    x = 0.0
    for key, label, fill in CATEGORIES:
        w = values[key] / scale_max * bar_w
        segments.append({"key": key, "label": label, "fill": fill, "x": x, "w": w, "bytes": human_bytes(values[key]),
                         "raw": values[key]})
        x += w
    tm = costs.time
    colls = []
    for i, c in enumerate(costs.collectives):
        colls.append({
            "kind": c.kind, "axes": ",".join(c.axes), "group": c.group, "phase": c.phase, "what": c.what,
            "count": c.count, "bytes": human_bytes(c.bytes), "total": human_bytes(c.total_bytes),
            "time": human_seconds(tm.collective_s[i]) if tm else "", "link": tm.links[i] if tm else "",
            "blocking": c.blocking,
        })
    tensors = []
    for p, name, n in _large_tensors(plan):
        view = _tensor_view(p, plan, coords)
        view["name"], view["copies"] = name, n
        tensors.append(view)
    tr = plan.spec.training
    return {
        "version": __version__,
        "name": plan.spec.name,
        "mesh": plan.mesh.describe(),
        "mesh_name": plan.mesh.name,
        "devices": plan.mesh.devices,
        "drawn": min(plan.mesh.devices, MAX_DEVICES_DRAWN),
        "grid_axes": _grid_shape(plan),
        "cells": cells, "grid_w": gw, "grid_h": gh,
        "hardware": hw.name if hw else None,
        "hardware_description": hw.description if hw else None,
        "capacity": human_bytes(int(hw.usable_bytes)) if hw else None,
        "capacity_x": (cap / scale_max * bar_w) if on_scale else None,
        "capacity_off_scale": cap is not None and not on_scale,
        "fits": costs.fits,
        "peak": human_bytes(costs.peak),
        "remat": costs.remat, "zero": costs.zero, "local_batch": costs.local_batch,
        "micro_batches": costs.micro_batches,
        "batch": tr.batch_size, "precision": f"params {tr.precision.params}, compute {tr.precision.compute}",
        "param_count": f"{plan.param_count:,}",
        "segments": segments, "bar_w": bar_w,
        "bar_segments": [s for s in segments if s["raw"] > 0],  # drawn in each bar: the categories that hold bytes
        "bars": list(range(n_bars)), "bars_more": plan.mesh.devices - n_bars,
        "collectives": colls,
        "comm_total": human_bytes(sum(c.total_bytes for c in costs.collectives)),
        "tensors": tensors,
        "by_op": [(k, human_bytes(v)) for k, v in sorted(st.activations.by_op.items(), key=lambda kv: -kv[1])],
        "flops": {
            "forward": human_flops(costs.flops.forward), "backward": human_flops(costs.flops.backward),
            "recompute": human_flops(costs.flops.recompute),
            "per_device": human_flops(costs.flops.per_device_total),
        },
        "time": None if tm is None else {
            "step": human_seconds(tm.step_s), "compute": human_seconds(tm.compute_s),
            "blocking": human_seconds(tm.blocking_comm_s), "overlapped": human_seconds(tm.overlapped_comm_s),
            "exposed": human_seconds(tm.exposed_comm_s), "optimizer": human_seconds(tm.optimizer_s),
            "mfu": f"{tm.mfu:.1%}", "efficiency": f"{tm.efficiency:.0%}",
        },
        "temporaries": [(k, human_bytes(getattr(st.temporaries, k))) for k in
                        ("gradient_flow", "loss", "gathered_params", "unsharded_grads", "optimizer", "float8_casts")
                        if k != "float8_casts" or st.temporaries.float8_casts],
        "notes": list(costs.notes),
    }


def render_report(plan: Plan, costs: Costs) -> str:
    """The report of `plan` with `costs`: those the command prints beside it (`plan --report`: the one costing
    of the plan for `--target`, or target-neutral; `--auto`: the best candidate's), never costed again here."""
    env = make_environment(autoescape=True)
    env.filters["px"] = lambda v: f"{float(v):.1f}"
    return env.get_template("report/report.html.j2").render(**context(plan, costs))
