"""`mithril-spec calibrate`: measure this machine and write a hardware profile the cost model can use.

The measuring runs in a subprocess, a script of `templates/calibrate/` run with this Python interpreter
(mithril_spec itself never imports a framework), which starts the devices as the generated programs of the
target do (torch: one process per device, gloo on CPU, NCCL on GPUs; jax: the accelerators, or simulated CPU
devices in one process) and times, with every device working at once: matrix multiplications per dtype,
a large copy, a layer's element-wise kernels, a reference decoder block forward and backward (CPU devices:
probe.py, which sets the efficiency; torch: also run tensor-parallel over pairs, which sets the sharded-tensor
layers' fixed cost), a chain of tiny kernels and all-reduces at several sizes
(torch: over groups of each size a mesh axis can have, each after a compute burst; jax: in a loop inside one
program), and whether an all-reduce beside a compute burst overlaps it. `profile_fields` turns those timings into the figures of a `hardware:` entry
(docs/cost-model.md#calibration); the file written is a YAML document with one such entry, which
`plan --hardware FILE.yaml` reads and which can be pasted into a spec's `hardware:` list.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from .planner.costs.overheads import ACTIVATION_PASSES
from .planner.mesh import UsageError
from .probe import PROBE, QUICK_PROBE, efficiency_from_probe, probe_terms, sharded_overhead_from_probe
from .render.environment import template_dirs

TARGETS = ("torch", "jax")
FRAMEWORK = {"torch": "torch", "jax": "jax"}  # the module each target's measuring script needs


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the measuring script times: matmul shapes [m, k, n] (m: tokens of a micro-batch, k and n: a
    layer's features), the bytes of the copy and of each all-reduce, the length of the tiny-kernel chain,
    the time spent on each figure (the median of three windows of `budget_s`) and the matmul run before
    each all-reduce."""

    matmul_shapes: tuple[tuple[int, int, int], ...]
    copy_bytes: int
    allreduce_bytes: tuple[int, ...]
    tiny_ops: int
    budget_s: float
    # the compute before each timed all-reduce: on this 2-core CPU some 20 ms, longer than the scheduler's
    # time slice, as a layer's compute between two tensor-parallel collectives is, so that ranks sharing the
    # cores reach the collective as out of step as a program's do
    burst_shape: tuple[int, int, int] = (1024, 512, 512)
    # the [tokens, features] float32 activation the element-wise kernels run on (the matmuls' m tokens)
    elementwise_shape: tuple[int, int] = (1024, 256)
    # the reference block timed on CPU devices (probe.py): [batch, seq, dim, heads, ff]
    probe: tuple[int, int, int, int, int] = PROBE

    def to_config(self, dtypes: tuple[str, ...]) -> dict:
        return {"dtypes": list(dtypes), "matmul_shapes": [list(s) for s in self.matmul_shapes],
                "copy_bytes": self.copy_bytes, "allreduce_bytes": list(self.allreduce_bytes),
                "tiny_ops": self.tiny_ops, "budget_s": self.budget_s, "burst_shape": list(self.burst_shape),
                "elementwise_shape": list(self.elementwise_shape), "probe": list(self.probe),
                "accelerator_shapes": [list(s) for s in ACCELERATOR_SHAPES]}


QUICK = Sizes(((256, 128, 128), (256, 256, 256)), 4 << 20, (4, 1 << 18, 1 << 20), 20, 0.01,
              elementwise_shape=(256, 128), probe=QUICK_PROBE)
DEFAULT = Sizes(((1024, 128, 128), (1024, 256, 256), (1024, 512, 512)), 32 << 20,
                (4, 1 << 16, 1 << 20, 4 << 20), 100, 0.2)  # (windows of 0.2 s: a program's steps, hundreds of ms
# on a time-shared CPU, see the load averaged over that long, over many of the scheduler's time slices)
DTYPES = ("float32", "bfloat16", "float16")
ACCELERATOR_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))  # measured besides the others on a GPU or TPU
LAUNCH_BOUND = 10  # a matmul within this many kernel overheads is timing its launch, not its FLOPs
NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"  # as the spec's `hardware[].name`


def script(target: str) -> Path:
    for d in template_dirs():
        p = d / "calibrate" / f"{target}_measure.py"
        if p.is_file():
            return p
    raise UsageError(f"calibrate: the measuring script for {target} is missing from this installation")


def measure(target: str, processes: int, sizes: Sizes, timeout: float = 600.0) -> dict:
    """Runs the target's measuring script with this interpreter; its raw timings (seconds)."""
    if target not in TARGETS:
        raise UsageError(f"calibrate: unknown target `{target}` (one of {', '.join(TARGETS)})")
    if processes < 1:
        raise UsageError("--processes must be at least 1")
    module = FRAMEWORK[target]
    if importlib.util.find_spec(module) is None:  # (finds the module without importing it)
        raise UsageError(f"calibrate --target {target}: `{module}` is not installed for {sys.executable} "
                         f"(pip install {module})")
    with tempfile.TemporaryDirectory(prefix="mithril-calibrate-") as tmp:
        out = Path(tmp) / "timings.json"
        cmd = [sys.executable, str(script(target)), "--processes", str(processes),
               "--config", json.dumps(sizes.to_config(DTYPES)), "--out", str(out)]
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle threads sleep: the machine may be shared
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
        except subprocess.TimeoutExpired:
            raise UsageError(f"calibrate --target {target}: the measurement took more than {timeout:.0f} s") from None
        if proc.returncode != 0 or not out.is_file():
            lines = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if ln.strip()]
            why = lines[-1].strip() if lines else f"exit code {proc.returncode}"
            raise UsageError(f"calibrate --target {target}: the measurement failed: {why}")
        return json.loads(out.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- timings -> profile figures


def ring_fit(points: list[tuple[float, float]], group: int) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s per ring step) of all-reduce timings [(payload bytes, seconds)] over
    `group` devices, by least squares on the ring model t = 2 (n-1)/n B / bandwidth + 2 (n-1) latency
    (planner/costs/collectives.py `ring_time`). A slope or intercept the noise makes negative is clamped
    (bandwidth from the largest payload, latency 0)."""
    xs = [2 * (group - 1) / group * b for b, _ in points]
    ys = [t for _, t in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var > 0 else 0.0
    if slope <= 0:
        slope = max(ys) / max(xs) if max(xs) > 0 else 1e-12
    intercept = max(0.0, my - slope * mx)
    return 1.0 / slope, intercept / (2 * (group - 1))


def collective_fit(points: list[tuple[float, int, float]]) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s per ring step) of all-reduce timings [(payload bytes, group size,
    seconds)] over groups of several sizes: each size fitted on its own (`ring_fit`), the bandwidth that of
    the largest group (all devices: a data-parallel gradient all-reduce's, large payloads) and the latency that
    of the smallest (a mesh's innermost axis: the tensor-parallel all-reduces, small and blocking the step).
    One latency per ring step cannot describe both: where ranks time-share cores, a collective's cost is
    mostly the wait for its out-of-step members, which grows less than the ring's 2 (n-1) steps with n."""
    sizes = sorted({g for _, g, _ in points})
    fits = {g: ring_fit([(b, t) for b, gg, t in points if gg == g], g) for g in sizes}
    return fits[sizes[-1]][0], fits[sizes[0]][1]


def profile_fields(raw: dict, name: str, target: str | None = None) -> dict:
    """The `hardware:` entry (spec units: TFLOP/s, GB, GB/s, microseconds) of the raw timings; with `target`
    and a timed reference block (raw `probe`), the efficiency that block sets (probe.py)."""
    flops, efficiency = {}, None
    for dtype, rows in raw["matmul"].items():
        rates = [2 * m * k * n / t for m, k, n, t in rows if t > 0]
        if not rates:
            continue
        best = max(rates)
        flops[dtype] = best / 1e12
        if dtype == "float32" or efficiency is None:
            # the model's matmuls run at the mean of the measured shapes, relative to the best of them; those
            # that take no longer than a few kernel launches are left to the kernel overhead
            bound = [2 * m * k * n / t for m, k, n, t in rows if t > LAUNCH_BOUND * raw["tiny_op"]] or rates
            efficiency = sum(bound) / len(bound) / best
    size, t = raw["copy"]
    bandwidth = 2 * size / t  # a copy reads and writes every byte
    n = raw["processes"]
    fields: dict = {"name": name}
    fields["description"] = (f"{raw['device']} ({raw['platform']}), {n} device(s) measured at once by "
                             f"`mithril-spec calibrate` on {platform.node() or 'this machine'}")
    if "matmul_precision" in raw:  # jax: float32 products at the precision the programs use (a GPU's: TF32)
        fields["description"] += f"; float32 matmuls at jax's `{raw['matmul_precision']}` matmul precision"
    fields["flops"] = {k: _round(v) for k, v in flops.items()}
    fields["efficiency"] = _round(min(1.0, efficiency or 1.0))
    fields["memory_gb"] = _round(raw["memory_bytes"] / 1e9)
    fields["hbm_gb_per_s"] = _round(bandwidth / 1e9)
    fields["devices_per_node"] = n
    if n > 1 and any(r[1] > 0 for r in raw["allreduce"]):
        # rows [payload bytes, seconds, group size] (a group of all devices when the size is left out)
        bw, lat = collective_fit([(r[0], r[2] if len(r) > 2 else n, r[1]) for r in raw["allreduce"]])
    else:  # one device (or all-reduces that added no measurable time): the copy's bandwidth, no latency
        bw, lat = bandwidth, 0.0
    fields["intra_node_gb_per_s"] = _round(bw / 1e9)
    fields["intra_node_latency_us"] = _round(lat * 1e6, 0.0)
    # one host: nothing was measured between nodes; the same link stands in for it
    fields["inter_node_gb_per_s"] = fields["intra_node_gb_per_s"]
    fields["inter_node_latency_us"] = fields["intra_node_latency_us"]
    fields["kernel_overhead_us"] = _round(raw["tiny_op"] * 1e6, 0.0)
    if raw.get("sharded_layer"):  # torch, more than one device: [plain chain, DTensor chain, layers] (seconds)
        plain, sharded, layers = raw["sharded_layer"]
        fields["sharded_layer_overhead_us"] = _round(max(0.0, sharded - plain) / layers * 1e6, 0.0)
    # the efficiency is the matmuls' alone: element-wise work is charged on its own, at the rate of the measured
    # element-wise kernels (forward and backward) in the model's unit: ACTIVATION_PASSES passes over each
    # kernel's output (planner/costs/overheads.py); the copy's bandwidth where they were not measured
    # whether collectives overlap compute here: the all-reduce issued beside a burst, as the programs issue
    # their gradient reductions, hides at least half of the shorter of the two (raw [burst, burst then all-reduce,
    # all-reduce beside the burst]); on CPU the issuing thread waits for it (torch) or the devices' threads
    # share the cores (jax), on a GPU a side stream carries it
    if raw.get("overlap"):
        fields["overlap_collectives"] = overlaps(*raw["overlap"])
    if raw.get("elementwise"):
        out_bytes, kernels, t = raw["elementwise"]
        fields["elementwise_gb_per_s"] = _round(ACTIVATION_PASSES * kernels * out_bytes / t / 1e9)
    else:
        fields["elementwise_gb_per_s"] = fields["hbm_gb_per_s"]
    scale = 1.0  # the plain block's measured over predicted time, where the efficiency's bound of 1 overshoots
    if raw.get("probe") and target is not None:
        # the efficiency a model's layer reaches, beyond its element-wise and kernel costs: that at which the
        # model predicts the reference block's measured time (the matmuls' mean above where it was not timed)
        *dims, seconds = raw["probe"]
        at_best = probe_terms(tuple(dims), fields, target)
        fields["efficiency"] = _round(efficiency_from_probe(seconds, at_best))
        predicted = at_best.matmul_s / fields["efficiency"] + at_best.elementwise_s + at_best.overhead_s
        scale = min(1.0, seconds / predicted) if predicted > 0 else 1.0
    if raw.get("probe_tensor") and target is not None:
        # torch on CPU devices: the sharded-tensor layers' fixed cost is that at which the model predicts the
        # reference block run tensor-parallel over pairs (its DTensor dispatch and its ranks' waits for each
        # other, beyond the collectives' ring time); it replaces the tiny chain's figure above, which sees
        # neither a block's ops nor a partner descheduled
        # (where even the efficiency's bound of 1 predicts the plain block slower than measured, the model's
        # figures for the split block are scaled down alike: the excess is not the sharded layers' to absorb)
        *dims, tensor, seconds = raw["probe_tensor"]
        plain = dict(fields, sharded_layer_overhead_us=0.0)
        terms = probe_terms(tuple(dims), plain, target, tensor=tensor, efficiency=fields["efficiency"])
        fields["sharded_layer_overhead_us"] = _round(sharded_overhead_from_probe(seconds, terms, scale) * 1e6, 0.0)
    return fields


OVERLAP_HIDDEN = 0.5  # the fraction of the shorter of burst and all-reduce the two together must hide


def overlaps(burst: float, apart: float, beside: float) -> bool:
    """Do collectives overlap compute: timings of a compute burst alone, followed by an all-reduce, and with the
    all-reduce issued beside it. Hidden: apart - beside, of at most min(burst, all-reduce). An all-reduce that
    adds no measurable time overlaps trivially (nothing to expose)."""
    comm = apart - burst
    if comm <= 0:
        return True
    return apart - beside >= OVERLAP_HIDDEN * min(burst, comm)


def _round(x: float, least: float = 1e-6) -> float:
    """Four significant digits (and at least the spec's smallest figure, 1e-6, or `least`)."""
    return max(float(f"{x:.4g}"), least)


def render(fields: dict, command: str, raw: dict) -> str:
    """The profile file: a `hardware:` list of one entry, with a comment saying how it was measured."""
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Hardware profile measured by `{command}` ({when}).",
        f"# {raw['processes']} device(s) working at once (threads per process: {raw.get('threads', 'default')});",
        "# on a shared machine, other work slows every figure. Use it with `mithril-spec plan SPEC --hardware",
        "# THIS_FILE.yaml`, or paste the entry into the spec's `hardware:` list and give its name.",
        "# Units: TFLOP/s, GB, GB/s, microseconds (docs/cost-model.md#calibration).",
    ]
    if raw.get("probe"):
        b, s, d, heads, ff, seconds = raw["probe"]
        lines.append(f"# efficiency: that at which the cost model predicts a reference decoder block (batch {b}, "
                     f"seq {s}, dim {d}, {heads} heads, ff {ff}), timed at {seconds * 1e3:.1f} ms forward and backward.")
    if raw.get("probe_tensor"):
        *_, ranks, seconds = raw["probe_tensor"]
        lines.append(f"# sharded_layer_overhead_us: that at which it predicts the same block run tensor-parallel over "
                     f"{ranks} ranks (DTensor modules), timed at {seconds * 1e3:.1f} ms.")
    lines.append("hardware:")
    first = True
    for key, value in fields.items():
        prefix = "  - " if first else "    "
        first = False
        if isinstance(value, dict):
            value = "{" + ", ".join(f"{k}: {v!r}" for k, v in value.items()) + "}"
        elif isinstance(value, (str, bool)):
            value = json.dumps(value)  # a YAML double-quoted string; true / false
        lines.append(f"{prefix}{key}: {value}")
    return "\n".join(lines) + "\n"


def calibrate(target: str, output: Path, name: str | None, processes: int, quick: bool, command: str) -> dict:
    """Measures, writes the profile atomically, returns its fields."""
    from .atomic import write_atomic

    if target not in TARGETS:
        raise UsageError(f"calibrate: unknown target `{target}` (one of {', '.join(TARGETS)})")
    if name is not None and not re.fullmatch(NAME, name):
        raise UsageError(f"--name {name!r}: a profile name is letters, digits, `_`, `.` and `-` (64 at most)")
    output = Path(output)
    if output.is_dir():
        raise UsageError(f"-o {output}: is a directory")
    if not output.parent.is_dir():
        raise UsageError(f"-o {output}: no such directory: {output.parent}")
    raw = measure(target, processes, QUICK if quick else DEFAULT)
    fields = profile_fields(raw, name or f"{target}-{raw['platform']}-x{raw['processes']}", target)
    write_atomic(output, render(fields, command, raw), create_parents=False)
    return fields
