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


def human_flops(n: float) -> str:
    for unit in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1000 or unit == "E":
            return f"{n:.0f} FLOP" if unit == "" else f"{n:.1f} {unit}FLOP"
        n /= 1000
    return str(n)


def human_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def render_costs(costs) -> str:
    """The cost summary printed after the table (memory, communication, FLOPs, step time)."""
    lines = []
    for st in costs.stages:
        s, a, t = st.states, st.activations, st.temporaries
        where = (f"per device on pipe rank {st.stage} ({', '.join(st.layers)}; {st.in_flight:g} micro-batch(es) "
                 f"in flight)") if len(costs.stages) > 1 else "per device"
        lines.append(
            f"predicted memory {where} (remat {a.remat}, zero {costs.zero}, micro-batch of {costs.local_batch} "
            f"sample(s) per device): states {human_bytes(s.total)} (params {human_bytes(s.params)}, grads "
            f"{human_bytes(s.grads)}, optimizer {human_bytes(s.optimizer)}"
            + (f" incl. master weights {human_bytes(s.master)}" if s.master else "")
            + (f", buffers {human_bytes(s.buffers)}" if s.buffers else "")
            + f") + activations {human_bytes(a.total)} + temporaries {human_bytes(t.total)} = peak "
            f"{human_bytes(st.peak)}")
    f = costs.flops
    lines.append(f"FLOPs per step: forward {human_flops(f.forward)}, backward {human_flops(f.backward)}, recompute "
                 f"{human_flops(f.recompute)}; per device {human_flops(f.per_device_total)}")
    if costs.collectives:
        total = sum(c.total_bytes for c in costs.collectives)
        which = ""
        if len(costs.stages) > 1:
            busiest = max(costs.stages, key=lambda st: st.flops_per_device)
            which = f" on pipe rank {busiest.stage} (the busiest; `--format json` lists every rank's)"
        lines.append(f"communication per step{which}: {len(costs.collectives)} collective(s), {human_bytes(total)} "
                     f"per device")
        rows = [("collective", "mesh axes", "phase", "calls", "bytes/call", "what")]
        for c in costs.collectives:
            rows.append((c.kind, ",".join(c.axes), c.phase, str(c.count), human_bytes(c.bytes), c.what))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            lines.append("  " + " ".join(cell.ljust(w) for cell, w in zip(r[:5], widths)) + " " + r[5])
    else:
        lines.append("communication per step: none")
    tm, hw = costs.time, costs.hardware
    if hw is not None and tm is not None:
        verdict = "fits" if costs.fits else "DOES NOT FIT"
        lines.append(f"on {hw.name}: peak {human_bytes(costs.peak)} of {human_bytes(int(hw.usable_bytes))} usable "
                     f"per device - {verdict}")
        lines.append(
            f"predicted step time {human_seconds(tm.step_s)}: compute {human_seconds(tm.compute_s)} (at "
            f"{tm.efficiency:.0%} of peak), critical-path communication {human_seconds(tm.blocking_comm_s)}, "
            f"data-parallel communication {human_seconds(tm.overlapped_comm_s)} "
            f"({human_seconds(tm.exposed_comm_s)} not hidden by compute), optimizer {human_seconds(tm.optimizer_s)}; "
            f"MFU {tm.mfu:.1%}")
    for n in costs.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines) + "\n"


def render_plan(plan: Plan, costs=None) -> str:
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
                     "[" + ", ".join(["batch", *(a or "-" for a in i.input.type.axes)]) + "]", _pspec(i.spec),
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
    if costs is None:
        from .costs import estimate

        costs = estimate(plan)
    return "\n".join(lines) + "\n\n" + render_costs(costs)
