"""The human-readable plan: one row per parameter, then totals."""

from __future__ import annotations

from .plan import Plan


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _pspec(spec) -> str:
    parts = []
    for d in spec:
        parts.append("-" if not d else (d[0] if len(d) == 1 else "(" + ",".join(d) + ")"))
    return "[" + ", ".join(parts) + "]"


def _shape(s) -> str:
    return "[" + ", ".join(map(str, s)) + "]"


def render_plan(plan: Plan) -> str:
    mesh = plan.mesh
    tr = plan.spec.training
    lines = [
        f"plan for {plan.spec.name} on mesh `{mesh.name}`: {mesh.describe()} ({mesh.devices} device(s))",
        f"batch: {tr.batch_size} global = {tr.grad_accum} micro-batch(es) of {plan.micro_batch}, "
        f"split over {', '.join(plan.batch_axes) or 'nothing'} (data-parallel degree {plan.dp_degree}): "
        f"{plan.micro_batch // plan.dp_degree} per device",
        "",
    ]
    header = ("parameter", "shape", "logical axes", "layout", "per device", "bytes/device")
    rows = [header]
    for p in plan.params + plan.buffers:
        axes = "[" + ", ".join(a or "-" for a in p.param.axes) + "]"
        rows.append((p.name + ("" if p.param.trainable else " (buffer)"), _shape(p.param.shape), axes,
                     _pspec(p.spec), _shape(p.local_shape), human_bytes(p.local_bytes)))
    for i in plan.inputs:
        rows.append((f"input {i.input.name}", _shape(["batch", *i.input.type.shape]),
                     "[batch, " + ", ".join(a or "-" for a in i.input.type.axes) + "]", _pspec(i.spec),
                     _shape([i.local_batch, *i.input.type.shape]), i.input.type.dtype))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for j, r in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) if c < 5 else cell.rjust(w) for c, (cell, w) in
                               enumerate(zip(r, widths))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    pp = plan.pipeline
    if pp is not None:
        lines += ["", f"pipeline: {pp.schedule}, {len(pp.stages)} stage(s) on pipe={pp.pipe}"
                  + (f" x {pp.virtual} virtual" if pp.virtual > 1 else "")
                  + f", {pp.microbatches} micro-batches, bubble {pp.bubble:.1%}"]
        for s in pp.stages:
            lines.append(f"  stage {s.index} (pipe rank {s.rank}): {s.params:,} params  {', '.join(s.units)}")
    m = plan.memory
    lines += [
        "",
        f"parameters: {plan.param_count:,} ({human_bytes(sum(p.bytes for p in plan.params))} in "
        f"{tr.precision.params})",
        f"per device: params {human_bytes(m.params)}, grads {human_bytes(m.grads)}, "
        f"optimizer ({tr.optimizer.name}) {human_bytes(m.optimizer)}"
        + (f", buffers {human_bytes(m.buffers)}" if m.buffers else "")
        + f"; total {human_bytes(m.total)}",
        f"forward FLOPs per sample: {plan.graph.flops_per_sample:,}",
    ]
    return "\n".join(lines) + "\n"
