"""`lower(compiled, target) -> Program`: one target's lowering of a plan, the one typed input of its templates.

The lowering decides, once per (plan, target): whether the target runs the plan at all (E049, raised here by
the target's `Lowering.check`), the costs of the plan as the target's program runs it (one `Costing`,
lowering/costing.py), and everything its templates need: the shared part (lowering/common.py: names,
layouts, parameters, training settings, the prediction), the target's part (lowering/<target>_program.py:
`jax`, `torch`, `mlx` settings), sampling (lowering/sampling.py) and the SLURM launch. The renderer
(render/build.py) renders the templates from the Program's fields and formats what they give; plan.json, the
predictions in it that --profile reads (`predicted`), the figures the program embeds (PLANNED_BYTES,
PREDICTED_DIGEST), `plan --target` and the HTML report are views of the same costing.

The Program is frozen and typed: a key an adapter gives that the Program does not declare (or one it
declares and the adapter does not give) is a TypeError at lowering time, not a template's undefined name.
The values inside the fields are plain JSON-like data (dicts, lists, numbers, strings), as the templates
read them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from ..diagnostics import DiagnosticError
from ..planner.plan_json import plan_to_json
from ..targets import TARGETS
from . import LOWERINGS, jax_program, mlx_program, torch_program
from .common import common_fields
from .costing import Costing, costing
from .parts import program_parts
from .predicted import digest, profile_predictions
from .sampling import sampling_context

if TYPE_CHECKING:
    from ..planner.plan import Plan
    from ..source import Document

# What launch.sbatch records of the build that wrote it (its directory, the Python that ran the build) where
# the lowering is not told: the golden files hold these, a build the real ones (`build` passes them).
BUILD_DIR_PLACEHOLDER = "@BUILD_DIR@"
PYTHON_PLACEHOLDER = "@PYTHON@"

# a field the templates do not read (the Program's metadata, beside the templates' context)
_NOT_RENDERED = {"rendered": False}


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """What the jax and mlx templates know of the model's functions (lowering/jax_program.py model_context)."""

    ops: list[str]
    op_attrs: dict[str, Any]
    helpers: list[str]
    has_dropout: bool
    has_buffers: bool
    train_arg: bool
    has_aux: bool  # a layer with a loss of its own (moe's load balancing)


@dataclasses.dataclass(frozen=True)
class JaxSettings(ModelSettings):
    """`jax.*` in the jax templates (lowering/jax_program.py says what each is)."""

    pipeline: Optional[dict[str, Any]]
    forward_outs: list[str]
    forward_args: list[str]
    scale_args: list[str]
    row_keywords: list[Any]
    schedule_args: list[str]
    cache_keywords: list[Any]
    checkpoint_args: list[Any]
    batch_args: list[str]
    device_keywords: list[Any]
    piped_groups: bool
    piped_copies: bool
    piped_padded: bool
    op_params: dict[str, Any]
    remat_keywords: list[Any]
    replica_params: list[str]
    stack_axis: dict[str, Optional[list[str]]]
    merged: Sequence[str]
    zero: int
    context: Optional[int]
    master_weights: bool
    accum: int
    comm: dict[str, Any]
    planned: dict[str, int]


@dataclasses.dataclass(frozen=True)
class TorchSettings:
    """`torch.*` in the torch templates (lowering/torch_program.py says what each is)."""

    ops: list[str]
    helpers: list[str]
    activations: dict[str, list[str]]
    forms: list[str]
    rotary: bool
    rope_scaled: bool
    qk_norm: bool
    rms_offset: bool
    gelu_gate: bool
    score_scale: bool
    softcap: bool
    has_buffers: bool
    aux_loss: bool
    micro_state: bool
    random: bool
    sequence_dropout: dict[str, list[str]]
    distributed: bool
    dp: str  # "none", "ddp", "fsdp", "hsdp", "zero1", "zero2" (lowering/torch.py data_parallel)
    fsdp: bool
    sharded: bool
    shard_axis: str
    input_layouts: dict[str, list[list[str]]]
    vocab_tables: list[str]
    vocab_tied: bool
    vocab_parallel: bool
    plain_tied: bool  # a linear layer tied to a table left whole over `tensor`
    tied_head: bool  # TiedHead: that layer in a sharded FSDP2 program (plain tensors)
    sync_bn: list[str]
    whole: bool
    mixed: bool
    autocast: bool
    tp_plan: dict[str, str]
    tp_experts: bool
    tp_channels: bool
    sp_repeats: list[Any]
    transposed: bool
    mesh3: dict[str, int]
    mesh_axes: dict[str, int]
    context: Optional[int]
    expert: int
    ep: bool
    expert_group: list[str]
    expert_sum: list[str]
    expert_divisor: int
    expert_average: bool
    pipeline: Optional[dict[str, Any]]
    chunks: int
    prefetch: bool
    optimizer_slots: int
    slot_bytes: int
    zero: int
    master: bool
    shards: bool
    param_bytes: int
    planned: dict[str, int]
    comm: dict[str, Any]
    job_name: str
    # optional parameters of the helper modules, (name, default) pairs (lowering/torch_program.py)
    rope_params: list[tuple[str, Any]]
    attention_params: list[tuple[str, Any]]
    mlp_params: list[tuple[str, Any]]
    moe_params: list[tuple[str, Any]]
    # decisions named by what they mean (lowering/torch_program.py says each)
    parallelized: bool
    store_params: bool
    separate_qkv: bool
    checkpoint_state: list[str]
    stage_args: list[str]
    step_contexts: list[str]
    fsdp_kind: str
    fsdp_mesh: list[str]
    reduce_experts: bool
    keep_table_rows: bool
    sync_last_micro: bool
    chunk_masks: bool
    sync_bn_flat: bool
    expert_flat: bool
    expert_layouts: bool
    lr_schedule: str
    dropout_heads: bool
    dropout_params: list[tuple[str, Any]]
    ddp_axes: list[str]
    ddp_flat: bool
    mesh_every_axis: bool
    zero_all_reduce: bool
    zero_views: bool


@dataclasses.dataclass(frozen=True)
class MlxSettings(ModelSettings):
    """`mlx.*` in the mlx templates (lowering/mlx_program.py says what each is)."""

    tensor: int
    tp: bool
    op_defs: dict[str, dict[str, Any]]
    remat_blocks: bool
    remat_forward: bool
    forward_args: list[str]
    forward_train: list[tuple[str, bool]]
    forward_outs: list[str]
    eval_outs: list[str]
    eval_args: list[str]
    eval_train: list[tuple[str, bool]]
    generate_args: list[str]
    step_args: list[str]
    data: int
    planned: dict[str, int]


@dataclasses.dataclass(frozen=True)
class Program:
    """One target's program of one plan: what its templates render (every field but the first three is a
    name in the templates' context), its files and its one costing."""

    files: tuple[tuple[str, str], ...] = dataclasses.field(metadata=_NOT_RENDERED)  # (template, output file)
    costing: Costing = dataclasses.field(metadata=_NOT_RENDERED)  # plan.json's (its `predicted` too), plan --target's
    plan_json: dict[str, Any] = dataclasses.field(metadata=_NOT_RENDERED)  # plan.json, a view of `costing`
    # ---- the templates' context: shared by every target (lowering/common.py)
    mithril_version: str
    target: str
    spec_name: str
    spec_file: str  # what the program says it was built from (render/build.py origin)
    mesh: dict[str, Any]  # name, axes [[axis, size]], devices, sizes
    batch_axes: list[str]
    dp_degree: int
    inputs: list[dict[str, Any]]
    model_class: str
    tp: dict[str, str]
    blocks: list[dict[str, Any]]
    layers: list[dict[str, Any]]
    loss: dict[str, Any]
    params: list[dict[str, Any]]
    buffers: list[dict[str, Any]]
    top_params: list[dict[str, Any]]
    top_buffers: list[dict[str, Any]]
    repeats: list[dict[str, Any]]
    param_count: int
    memory: dict[str, int]
    training: dict[str, Any]
    data: dict[str, Any]
    eval: Optional[dict[str, Any]]
    pipeline: Optional[dict[str, Any]]
    seq_len: Optional[int]
    flops_per_step: int
    hf: Optional[dict[str, Any]]
    predicted: dict[str, Any]  # the costing's figures for --profile and offload (lowering/predicted.py)
    predicted_digest: Optional[str]  # of plan.json's `predicted` (None: the target does not profile)
    # ---- given by every target's adapter
    spec_hash: str
    model_hash: str
    optimizer_settings: dict[str, Any]
    # ---- generate.py (a language model; None: not rendered) and launch.sbatch
    sampling: Optional[dict[str, Any]]
    slurm: dict[str, Any]
    # ---- which optional pieces each template section renders, {section: {slot: [macro names]}} (lowering/parts)
    parts: dict[str, dict[str, list[str]]]

    settings_field: ClassVar[str] = ""  # the target's own settings: `jax`, `torch`, `mlx`

    def context(self) -> dict[str, Any]:
        """The templates' context: every rendered field by name (the values themselves, not copies)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("rendered", True)}

    @property
    def plan(self) -> Plan:
        return self.costing.plan


@dataclasses.dataclass(frozen=True)
class JaxProgram(Program):
    jax: JaxSettings
    settings_field: ClassVar[str] = "jax"


@dataclasses.dataclass(frozen=True)
class TorchProgram(Program):
    torch: TorchSettings
    settings_field: ClassVar[str] = "torch"


@dataclasses.dataclass(frozen=True)
class MlxProgram(Program):
    mlx: MlxSettings
    settings_field: ClassVar[str] = "mlx"


# per target: its Program class, its settings and the adapter that gives its part of the context
_ADAPTERS: dict[str, tuple[type[Program], type, Callable[..., dict[str, Any]]]] = {
    "jax": (JaxProgram, JaxSettings, jax_program.target_fields),
    "torch": (TorchProgram, TorchSettings, torch_program.target_fields),
    "mlx": (MlxProgram, MlxSettings, mlx_program.target_fields),
}
assert tuple(_ADAPTERS) == tuple(TARGETS), "one Program per declared target"


def slurm_context(devices: int, spec_name: str, build_dir: str, python: str) -> dict[str, object]:
    """launch.sbatch's figures: nodes x ranks per node (at most 8, a divisor of the mesh's devices: GPUs per
    node on a GPU cluster, one core each on a CPU one), the job's name, and the build's directory and Python."""
    per_node = min(devices, 8)
    while devices % per_node:
        per_node -= 1
    return {"nodes": devices // per_node, "per_node": per_node, "build_dir": build_dir, "python": python,
            "job_name": "".join(c if c.isalnum() or c in "_.-" else "-" for c in spec_name)}


def lower(plan: Plan, doc: Document, target: str, spec_file: str, build_dir: str = BUILD_DIR_PLACEHOLDER,
          python: str = PYTHON_PLACEHOLDER) -> Program:
    """`target`'s Program of `plan`: DiagnosticError (E049, from the target's checks) where the target cannot
    run it; else the plan costed once as the target's program runs it, and every field its templates read.
    `spec_file`: what the program says it was built from; `build_dir` (absolute) and `python`: what
    launch.sbatch runs by default."""
    diags = LOWERINGS[target].check(plan, doc)
    if diags:
        raise DiagnosticError(diags)
    cost = costing(plan, target)
    cls, settings, adapter = _ADAPTERS[target]
    ctx = common_fields(plan, target, spec_file, cost)
    ctx.update(adapter(plan, ctx, cost))
    ctx["sampling"] = sampling_context(plan, ctx, target)  # generate.py (a language model), or None
    ctx["slurm"] = slurm_context(plan.mesh.devices, plan.spec.name, build_dir, python)
    ctx[cls.settings_field] = settings(**ctx[cls.settings_field])
    plan_json = plan_to_json(plan, cost.costs, profile_predictions(cost))
    ctx["predicted_digest"] = digest(plan_json["predicted"])  # the program knows its plan.json by it
    ctx["parts"] = program_parts(target, ctx)
    return cls(files=LOWERINGS[target].files_for(plan), costing=cost, plan_json=plan_json, **ctx)
