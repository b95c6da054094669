"""Hardware profiles: what one device computes, holds and moves, for the cost model.

Built-in profiles cover common accelerators; a spec adds its own in a `hardware:` section (a list of
profiles, each optionally starting from a built-in `base`). Figures are per device, in SI units here
(FLOP/s, bytes, bytes/s, seconds); the spec section uses TFLOP/s, GB, GB/s and microseconds.

Mesh axes map onto the machine innermost first: the mesh is laid out in canonical axis order (pipe, data,
fsdp, expert, context, tensor; tensor innermost), so the innermost axes whose devices lie within one node of
`devices_per_node` devices use the intra-node link and the rest the inter-node network.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from .. import codes
from ..axes import MESH_AXES
from ..diagnostics import Diagnostic, DiagnosticError, did_you_mean
from ..source import Document
from ..spec.root import Spec
from .mesh import Mesh, UsageError

T, G = 1e12, 1e9


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str
    description: str
    flops: dict[str, float]  # peak dense FLOP/s per device by compute dtype
    memory_bytes: float  # per device
    reserved_bytes: float  # kept by the runtime (context, communication buffers, workspaces)
    hbm_bytes_per_s: float
    devices_per_node: int
    intra_node_bytes_per_s: float  # per device, one direction
    inter_node_bytes_per_s: float  # per device, one direction
    intra_node_latency_s: float  # per ring step
    inter_node_latency_s: float
    efficiency: float = 0.5  # assumed fraction of peak FLOP/s reached by the model's compute
    # per device, one direction, between device and host memory (PCIe): activation offload's transfers
    host_bytes_per_s: float = 25 * G
    kernel_overhead_s: float = 0.0  # fixed time of one kernel (dispatch, launch); measured by `calibrate`
    # fixed time of one tensor-parallel layer's sharded-tensor dispatch (torch DTensor), forward and backward
    sharded_layer_overhead_s: float = 0.0
    # element-wise (memory-bound) activation traffic, charged on its own (0: folded into `efficiency`)
    elementwise_bytes_per_s: float = 0.0
    # data-parallel collectives run beside the compute (a GPU's side stream); False: each waits for the compute
    # and the compute for it (CPU devices: the issuing thread blocks, devices share the cores); measured by `calibrate`
    overlap_collectives: bool = True

    @property
    def usable_bytes(self) -> float:
        return self.memory_bytes - self.reserved_bytes

    def peak_flops(self, dtype: str) -> float:
        return self.flops.get(dtype) or self.flops.get("float32") or min(self.flops.values())

    def to_json(self) -> dict:
        return {
            "name": self.name, "description": self.description, "flops": dict(self.flops),
            "memory_bytes": self.memory_bytes, "reserved_bytes": self.reserved_bytes,
            "hbm_bytes_per_s": self.hbm_bytes_per_s, "devices_per_node": self.devices_per_node,
            "intra_node_bytes_per_s": self.intra_node_bytes_per_s,
            "inter_node_bytes_per_s": self.inter_node_bytes_per_s,
            "intra_node_latency_s": self.intra_node_latency_s, "inter_node_latency_s": self.inter_node_latency_s,
            "efficiency": self.efficiency, "host_bytes_per_s": self.host_bytes_per_s,
            "kernel_overhead_s": self.kernel_overhead_s, "sharded_layer_overhead_s": self.sharded_layer_overhead_s,
            "elementwise_bytes_per_s": self.elementwise_bytes_per_s,
            "overlap_collectives": self.overlap_collectives,
        }


BUILTIN: dict[str, Hardware] = {
    h.name: h
    for h in (
        Hardware(
            "h100-sxm-80gb", "NVIDIA H100 SXM 80GB, 8 per node on NVLink 4 (450 GB/s per direction), "
            "400 Gb/s InfiniBand NDR per GPU between nodes",
            {"bfloat16": 989.4 * T, "float16": 989.4 * T, "tfloat32": 494.7 * T, "float32": 66.9 * T,
             "float8": 1978.9 * T},
            80 * G, 2 * G, 3350 * G, 8, 450 * G, 50 * G, 3e-6, 8e-6, host_bytes_per_s=55 * G,  # PCIe Gen5 x16
        ),
        Hardware(
            "h200-141gb", "NVIDIA H200 SXM 141GB, 8 per node on NVLink 4 (450 GB/s per direction), "
            "400 Gb/s InfiniBand NDR per GPU between nodes",
            {"bfloat16": 989.4 * T, "float16": 989.4 * T, "tfloat32": 494.7 * T, "float32": 66.9 * T,
             "float8": 1978.9 * T},
            141 * G, 2 * G, 4800 * G, 8, 450 * G, 50 * G, 3e-6, 8e-6, host_bytes_per_s=55 * G,  # PCIe Gen5 x16
        ),
        Hardware(
            "a100-80gb", "NVIDIA A100 SXM 80GB, 8 per node on NVLink 3 (300 GB/s per direction), "
            "200 Gb/s InfiniBand HDR per GPU between nodes",
            {"bfloat16": 312 * T, "float16": 312 * T, "tfloat32": 156 * T, "float32": 19.5 * T},
            80 * G, 2 * G, 2039 * G, 8, 300 * G, 25 * G, 3e-6, 8e-6, host_bytes_per_s=25 * G,  # PCIe Gen4 x16
        ),
        Hardware(
            "a100-40gb", "NVIDIA A100 SXM 40GB, 8 per node on NVLink 3 (300 GB/s per direction), "
            "200 Gb/s InfiniBand HDR per GPU between nodes",
            {"bfloat16": 312 * T, "float16": 312 * T, "tfloat32": 156 * T, "float32": 19.5 * T},
            40 * G, 2 * G, 1555 * G, 8, 300 * G, 25 * G, 3e-6, 8e-6, host_bytes_per_s=25 * G,  # PCIe Gen4 x16
        ),
        Hardware(
            "h800-80gb", "NVIDIA H800 SXM 80GB (the H100 with NVLink cut to 400 GB/s both ways), 8 per node, "
            "400 Gb/s InfiniBand NDR per GPU between nodes",
            {"bfloat16": 989.4 * T, "float16": 989.4 * T, "tfloat32": 494.7 * T, "float32": 66.9 * T,
             "float8": 1978.9 * T},
            80 * G, 2 * G, 3350 * G, 8, 200 * G, 50 * G, 3e-6, 8e-6, host_bytes_per_s=55 * G,  # PCIe Gen5 x16
        ),
        Hardware(
            "v100-32gb", "NVIDIA V100 SXM2 32GB (tensor cores: float16 only), 8 per node on NVLink 2 (150 GB/s "
            "per direction), 4 x 100 Gb/s InfiniBand EDR per node (DGX-1) between nodes",
            {"float16": 125 * T, "float32": 15.7 * T},
            32 * G, 1.5 * G, 900 * G, 8, 150 * G, 6.25 * G, 4e-6, 10e-6, host_bytes_per_s=12 * G,  # PCIe Gen3 x16
        ),
        Hardware(
            "tpu-v4", "Google TPU v4 chip (32 GB HBM), pods of up to 4,096 chips on a 3D-torus ICI (~50 GB/s "
            "per axis ring), data-center network between pods; float32 matmuls as 3 bf16 passes",
            {"bfloat16": 275 * T, "float16": 275 * T, "float32": 275 / 3 * T},
            32 * G, 0.5 * G, 1200 * G, 4096, 50 * G, 6.25 * G, 1e-6, 10e-6, host_bytes_per_s=16 * G,
        ),
        Hardware(
            "tpu-v5p", "Google TPU v5p chip (95 GB HBM), pods of up to 8,960 chips on a 3D-torus ICI (~100 GB/s "
            "per axis ring), data-center network between pods; float32 matmuls as 3 bf16 passes",
            {"bfloat16": 459 * T, "float16": 459 * T, "float32": 459 / 3 * T},
            95 * G, 0.5 * G, 2765 * G, 8960, 100 * G, 6.25 * G, 1e-6, 10e-6, host_bytes_per_s=16 * G,
        ),
        Hardware(
            "tpu-v5e", "Google TPU v5e chip (16 GB HBM), slices of up to 256 chips on ICI (~100 GB/s per "
            "axis ring), data-center network between slices; float32 matmuls as 3 bf16 passes",
            {"bfloat16": 197 * T, "float16": 197 * T, "float32": 197 / 3 * T},
            16 * G, 0.5 * G, 819 * G, 256, 100 * G, 3.1 * G, 1e-6, 10e-6, host_bytes_per_s=16 * G,  # PCIe Gen4 x8
        ),
        Hardware(
            "cpu", "a generic host CPU as one device (e.g. a simulated JAX CPU device): 8 per host sharing "
            "memory, 25 Gb/s Ethernet between hosts",
            {"float32": 0.5 * T, "bfloat16": 0.25 * T, "float16": 0.1 * T},
            64 * G, 1 * G, 100 * G, 8, 20 * G, 3 * G, 10e-6, 50e-6, efficiency=0.3,
            host_bytes_per_s=20 * G,  # "host" memory is the same RAM: a copy
        ),
    )
}

ALIASES = {
    "h100": "h100-sxm-80gb", "h100-sxm": "h100-sxm-80gb", "h100-80gb": "h100-sxm-80gb",
    "h200": "h200-141gb", "a100": "a100-80gb", "a100-sxm-80gb": "a100-80gb",
    "v5e": "tpu-v5e", "tpuv5e": "tpu-v5e", "tpu-v5-lite": "tpu-v5e",
    "a100-40": "a100-40gb", "a100-sxm-40gb": "a100-40gb", "h800": "h800-80gb", "v100": "v100-32gb",
    "v100-sxm2-32gb": "v100-32gb", "v4": "tpu-v4", "tpuv4": "tpu-v4", "v5p": "tpu-v5p", "tpuv5p": "tpu-v5p",
}  # fmt: skip


def names(spec: Optional[Spec] = None) -> list[str]:
    own = [h.name for h in (spec.hardware or [])] if spec is not None else []
    return own + [n for n in BUILTIN if n not in own]


def lookup(name: str, spec: Optional[Spec] = None, doc: Optional[Document] = None) -> Hardware:
    """The profile `name`: a profile file (FILE.yaml, or FILE.yaml#NAME for one of several entries; what
    `mithril-spec calibrate` writes), else the spec's own `hardware` entries, then the built-in ones (and
    aliases). Raises UsageError for an unknown name or an unreadable file, DiagnosticError for an incomplete
    or invalid profile."""
    if is_profile_file(name):
        return load_profile_file(name)
    if spec is not None and spec.hardware:
        for i, h in enumerate(spec.hardware):
            if h.name == name:
                return from_spec(h, ("hardware", i), doc)
    key = name.lower()
    key = ALIASES.get(key, key)
    if key in BUILTIN:
        return BUILTIN[key]
    choices = names(spec)
    hint = did_you_mean(name, choices + list(ALIASES)) or ""
    raise UsageError(f"--hardware: unknown profile `{name}` (known: {', '.join(choices)}) {hint}".strip())


_FIELDS = {  # spec field -> (Hardware field, scale)
    "memory_gb": ("memory_bytes", G),
    "reserved_gb": ("reserved_bytes", G),
    "hbm_gb_per_s": ("hbm_bytes_per_s", G),
    "devices_per_node": ("devices_per_node", 1),
    "intra_node_gb_per_s": ("intra_node_bytes_per_s", G),
    "inter_node_gb_per_s": ("inter_node_bytes_per_s", G),
    "intra_node_latency_us": ("intra_node_latency_s", 1e-6),
    "inter_node_latency_us": ("inter_node_latency_s", 1e-6),
    "efficiency": ("efficiency", 1),
    "host_gb_per_s": ("host_bytes_per_s", G),
    "kernel_overhead_us": ("kernel_overhead_s", 1e-6),
    "sharded_layer_overhead_us": ("sharded_layer_overhead_s", 1e-6),
    "elementwise_gb_per_s": ("elementwise_bytes_per_s", G),
}
_OPTIONAL = {"reserved_gb": 0.0, "intra_node_latency_us": 5.0, "inter_node_latency_us": 10.0, "efficiency": 0.5,
             "hbm_gb_per_s": 1000.0, "host_gb_per_s": 25.0,
             "kernel_overhead_us": 0.0, "sharded_layer_overhead_us": 0.0, "elementwise_gb_per_s": 0.0}


def from_spec(h, path: tuple, doc: Optional[Document]) -> Hardware:
    def pos(p):
        return doc.pos(p) if doc is not None else None

    if h.base is not None:
        key = ALIASES.get(h.base.lower(), h.base.lower())
        if key not in BUILTIN:
            raise DiagnosticError([Diagnostic(
                codes.E013, f"hardware `{h.name}`: unknown base profile `{h.base}`", pos(path + ("base",)),
                help=did_you_mean(h.base, list(BUILTIN)) or f"built-in profiles: {', '.join(BUILTIN)}")])
        base = BUILTIN[key]
        values = dataclasses.asdict(base)
        values["flops"] = dict(base.flops)
    else:
        missing = [f for f in ("flops", "memory_gb", "devices_per_node", "intra_node_gb_per_s",
                               "inter_node_gb_per_s") if getattr(h, f) is None]
        if missing:
            raise DiagnosticError([Diagnostic(
                codes.E011, f"hardware `{h.name}` needs {', '.join(f'`{m}`' for m in missing)} (or a `base` profile)",
                pos(path), help=f"start from a built-in profile with `base:` ({', '.join(BUILTIN)})")])
        values = {"flops": {}}
        for f, default in _OPTIONAL.items():
            field, scale = _FIELDS[f]
            values[field] = default * scale
    values["name"] = h.name
    values["description"] = h.description or (f"{h.base} with overrides" if h.base else h.name)
    if h.flops:
        values["flops"].update({k: v * T for k, v in h.flops.items()})
    for f, (field, scale) in _FIELDS.items():
        v = getattr(h, f)
        if v is not None:
            values[field] = v * scale
    if h.overlap_collectives is not None:
        values["overlap_collectives"] = h.overlap_collectives
    hw = Hardware(**values)
    if hw.reserved_bytes >= hw.memory_bytes:
        raise DiagnosticError([Diagnostic(codes.E013, f"hardware `{h.name}`: reserved memory is not less than memory",
                                          pos(path + ("reserved_gb",)))])
    return hw


def float8_diagnostics(spec: Spec, doc: Optional[Document], hw: Hardware) -> list[Diagnostic]:
    """E049 for `precision.float8` on a profile without FP8 matmuls (no `float8` peak: A100, V100, TPUs, CPUs):
    the programs would emulate them there, at no speed-up (a test run on the CPU is the emulation's use)."""
    if not spec.training.precision.float8 or "float8" in hw.flops:
        return []
    return [Diagnostic(
        codes.E049, f"`precision.float8` needs FP8 matmuls, and the profile `{hw.name}` has none (no `float8` "
        "peak in its `flops`)", doc.pos(("training", "precision", "float8")) if doc is not None else None,
        help="plan for a device with FP8 matmuls (h100-sxm-80gb, h200-141gb, h800-80gb, or a profile with a "
        "`float8` figure), or set `precision.float8: false`; without FP8 hardware the torch program only "
        "emulates them (for tests), slower than the compute dtype")]


# ---------------------------------------------------------------- profile files (`mithril-spec calibrate`)

PROFILE_SUFFIXES = (".yaml", ".yml", ".toml")


def is_profile_file(name: str) -> bool:
    """`--hardware` names a file rather than a profile: it ends in a spec suffix (before any `#NAME`)."""
    return name.partition("#")[0].lower().endswith(PROFILE_SUFFIXES)


def load_profile_file(name: str) -> Hardware:
    """The profile of a file holding a `hardware:` list (the format of the spec's section): its only entry,
    or the one named after `#`."""
    import pydantic

    from ..source import load_file
    from ..spec.hardware import ProfileFile
    from ..validate import _convert

    path, _, wanted = name.partition("#")
    if not Path(path).is_file():
        raise UsageError(f"--hardware {name}: no such file")
    try:
        pdoc = load_file(path)
    except OSError as e:
        raise UsageError(f"--hardware {name}: cannot read: {e.strerror or e}") from None
    if not isinstance(pdoc.data, dict) or "hardware" not in pdoc.data:
        raise UsageError(f"--hardware {name}: not a profile file (a `hardware:` list, as `mithril-spec "
                         "calibrate` writes)")
    try:
        entries = ProfileFile.model_validate(pdoc.data).hardware
    except pydantic.ValidationError as e:
        raise DiagnosticError(_convert(e, pdoc)) from None
    found = [i for i, h in enumerate(entries) if not wanted or h.name == wanted]
    if len(found) != 1:
        listed = ", ".join(h.name for h in entries)
        why = f"no profile `{wanted}` there" if wanted else f"{len(entries)} profiles there"
        raise UsageError(f"--hardware {name}: {why} (give FILE#NAME, one of: {listed})")
    return from_spec(entries[found[0]], ("hardware", found[0]), pdoc)


# ---------------------------------------------------------------- mesh axes onto the machine


def axis_strides(mesh: Mesh) -> dict[str, int]:
    """Device-id stride of each mesh axis (canonical order, the last axis innermost)."""
    strides, s = {}, 1
    for a in reversed(MESH_AXES):
        strides[a] = s
        s *= mesh.size(a)
    return strides


def intra_node(mesh: Mesh, axes, hw: Hardware) -> bool:
    """True when every group of a collective over `axes` lies within one node."""
    strides = axis_strides(mesh)
    span = 1
    for a in axes:
        span = max(span, strides[a] * mesh.size(a))
    return span <= hw.devices_per_node


def link(mesh: Mesh, axes, hw: Hardware) -> tuple[float, float, str]:
    """(bandwidth bytes/s per device, latency per ring step, link name) for a collective over `axes`."""
    if intra_node(mesh, axes, hw):
        return hw.intra_node_bytes_per_s, hw.intra_node_latency_s, "intra-node"
    return hw.inter_node_bytes_per_s, hw.inter_node_latency_s, "inter-node"
