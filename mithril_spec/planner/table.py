"""The human-readable plan: one row per parameter (one per block parameter for all copies of a repeated
block), then totals."""

from __future__ import annotations

from .plan import BlockParamPlan, Plan, RepeatPlan


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


def copy_range(count: int) -> str:
    """`[0-3]`: the copies of a repeated block, as the collapsed rows name them (`blocks.[0-3].attn.q.weight`)."""
    return f"[0-{count - 1}]" if count > 1 else "[0]"


def block_name(rep: RepeatPlan, local: str) -> str:
    """The row name of a block parameter for all copies, e.g. `blocks.[0-3].attn.q.weight`."""
    return f"{rep.name}.{copy_range(rep.count)}.{local}"


def stage_runs(stages) -> list[tuple[int, int, int]]:
    """Consecutive runs of equal stages in a per-copy list: (start, end, stage), copies start..end-1."""
    runs: list[list[int]] = []
    for i, s in enumerate(stages):
        if runs and runs[-1][2] == s:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1, s])
    return [(a, b, s) for a, b, s in runs]


def repeat_stage_runs(plan: Plan, rep: RepeatPlan) -> list[tuple[int, int, int]]:
    """Which copies of a repeat sit on which pipeline stage: (start, end, stage) runs, in copy order. Every
    parameter of a copy is on the copy's stage; a block without parameters follows the pipeline's split."""
    blocks = rep.params + rep.buffers
    if blocks:
        return stage_runs(c.stage for c in blocks[0].copies)
    pp = plan.pipeline
    if pp is None:
        return [(0, rep.count, 0)]
    spans = pp.repeat_split.get(rep.name) or ((0, rep.count),)
    if len(spans) == 1:
        return [(0, rep.count, pp.layer_stage.get(rep.name, 0))]
    return [(a, b, s) for s, (a, b) in enumerate(spans) if b > a]


def _stage_cell(runs: list[tuple[int, int, int]]) -> str:
    """`1` when every copy is on stage 1, else `[0-1]: 0, [2-3]: 1` (copies: stage)."""
    if len(runs) == 1:
        return str(runs[0][2])
    return ", ".join(f"[{a}-{b - 1}]: {s}" if b - a > 1 else f"[{a}]: {s}" for a, b, s in runs)


def _block_rows(plan: Plan) -> dict[str, tuple[RepeatPlan, BlockParamPlan]]:
    """Canonical name of copy 0 of every block parameter and buffer -> (its repeat, the block parameter)."""
    return {b.first.name: (r, b) for r in plan.repeats for b in r.params + r.buffers}


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
        if a.offloaded or a.offload_per_step:
            lines.append(f"activation offload (tensors of at least {costs.offload_threshold:,} elements): "
                         f"{human_bytes(a.offloaded)} of the saved activations in host memory, "
                         f"{human_bytes(a.saved - a.offloaded)} on the device; {human_bytes(a.offload_per_step)} "
                         f"moved out and back per step")
    f = costs.flops
    lines.append(f"FLOPs per step: forward {human_flops(f.forward)}, backward {human_flops(f.backward)}, recompute "
                 f"{human_flops(f.recompute)}; per device {human_flops(f.per_device_total)}")
    busiest = max(costs.stages, key=lambda st: st.flops_per_device)
    if busiest.float8_flops_per_device:
        lines.append(f"FP8 linear layers (precision.float8): {human_flops(busiest.float8_flops_per_device)} of the "
                     f"FLOPs per device (at the profile's float8 peak), their FP8 casts "
                     f"{human_bytes(busiest.temporaries.float8_casts)} of the temporaries")
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
            f"({human_seconds(tm.exposed_comm_s)} not hidden by compute), optimizer {human_seconds(tm.optimizer_s)}"
            + (f", activation offload {human_seconds(tm.offload_s)} at {human_bytes(int(hw.host_bytes_per_s))}/s"
               if tm.offload_s else "")
            + (f", element-wise traffic {human_seconds(tm.elementwise_s)}" if tm.elementwise_s else "")
            + (f", {tm.kernels:,} kernels" + (f" and {tm.sharded_layers:,} sharded-tensor layer passes"
                                               if tm.sharded_layers and hw.sharded_layer_overhead_s else "")
               + f" {human_seconds(tm.overhead_s)}" if tm.overhead_s else "")
            + f"; MFU {tm.mfu:.1%}")
        if "tree" in tm.algorithms:  # (ring everywhere else: the cost model's default)
            tree = [c.what for c, a in zip(costs.collectives, tm.algorithms) if a == "tree"]
            lines.append(f"costed as double binary trees (communication.algorithm): {'; '.join(tree)}")
    for n in costs.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines) + "\n"


def render_plan(plan: Plan, costs) -> str:
    """`plan`'s text output, with `costs`: the command's one costing of the plan (lowering/costing.py)."""
    mesh = plan.mesh
    tr = plan.spec.training
    lines = [
        f"plan for {plan.spec.name} on mesh `{mesh.name}`: {mesh.describe()} ({mesh.devices} device(s))",
        f"batch: {tr.batch_size} global = {tr.grad_accum} micro-batch(es) of {plan.micro_batch}, "
        f"split over {', '.join(plan.batch_axes) or 'nothing'} (data-parallel degree {plan.dp_degree}): "
        f"{plan.micro_batch // plan.dp_degree} per device",
        "",
    ]
    pp = plan.pipeline
    header = ("parameter", "shape", "logical axes", "layout", "per device", "bytes/device") + (
        ("stage",) if pp is not None else ())
    rows = [header]
    firsts = _block_rows(plan)
    in_repeat = plan.in_repeat
    for p in plan.params + plan.buffers:
        stage = str(p.stage)
        name = p.name
        if name in in_repeat:  # one row per block parameter, at the place of its first copy
            hit = firsts.get(name)
            if hit is None:
                continue
            rep, blk = hit
            name = block_name(rep, blk.local)
            stage = _stage_cell(stage_runs(c.stage for c in blk.copies)) if pp is not None else stage
        axes = "[" + ", ".join(a or "-" for a in p.param.axes) + "]"
        rows.append((name + ("" if p.param.trainable else " (buffer)"), _shape(p.param.shape), axes,
                     _pspec(p.spec), _shape(p.local_shape), human_bytes(p.local_bytes))
                    + ((stage,) if pp is not None else ()))
    for i in plan.inputs:
        local = [n // plan.mesh.degree(d) for n, d in zip(i.input.type.shape, i.spec[1:])]  # (a split sequence)
        rows.append((f"input {i.input.name}", _shape(["batch", *i.input.type.shape]),
                     "[" + ", ".join(["batch", *(a or "-" for a in i.input.type.axes)]) + "]", _pspec(i.spec),
                     _shape([i.local_batch, *local]), i.input.type.dtype)
                    + (("",) if pp is not None else ()))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for j, r in enumerate(rows):
        lines.append("  ".join(cell.rjust(w) if c == 5 else cell.ljust(w) for c, (cell, w) in
                               enumerate(zip(r, widths))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    notes = []
    for rep in plan.repeats:
        if rep.params or rep.buffers:
            split = pp is not None and len(repeat_stage_runs(plan, rep)) > 1
            notes.append(f"{block_name(rep, '*')}: {rep.count} cop{'ies' if rep.count > 1 else 'y'} of block "
                         f"`{rep.block}` (copy i is `{rep.name}.i.*`), one row for all copies, sizes per copy"
                         + ("; stage `[a-b]: s`: copies a to b on stage s" if split else ""))
    if notes:
        lines += ["", *notes]
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
    ]
    for t in plan.spec.targets or ():
        more = plan.memory_for(t).total - m.total
        if more:  # the layers outside the pipelined block run on every pipe rank in that target's program
            from ..targets import TARGETS

            pl = plan.pipeline
            padded = TARGETS[t].capabilities.pipeline_pads_stages and len({len(c) for c in pl.stage_copies}) > 1
            lines.append(f"  the {t} program holds {human_bytes(more)} more per device: it runs the layers outside the "
                         "pipelined block on every pipe rank" + (
                             f" and pads every stage to {max(map(len, pl.stage_copies))} copies of the block"
                             if padded else "") + (" (counted in the predicted peak below)"
                                                   if costs.target in (None, t) else ""))
    lines.append(f"forward FLOPs per sample: {plan.graph.flops_per_sample:,}")
    return "\n".join(lines) + "\n\n" + render_costs(costs)
