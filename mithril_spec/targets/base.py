"""What a target is: its capabilities and files, declared once, below the planner (the spec language takes
its `targets` values from the registry, the planner its capabilities). What turns a plan a target cannot
run into E049 diagnostics, and a plan into the Program its templates render, is the target's lowering
(mithril_spec/lowering/), above the planner: this layer imports nothing of the planner, the lowerings or
the renderers.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

from ..axes import MESH_AXES  # noqa: F401 (the targets' mesh_axes)

# what the jax and torch targets refuse with context parallelism (docs/targets.md)
CONTEXT_LIMIT = ("Context parallelism (the `context` axis splits the sequence; ring attention) combines with `data`, "
         "`fsdp` and `tensor`, not with `pipe` or `expert`, `training.zero` above 0, `remat: selective`, rules or "
         "layouts naming `context` or the sequence axis, an imported model (`hf`), nor with layers that mix "
         "sequence positions (convolutions, pooling, reshapes); dropout (layers and attention) keeps the "
         "one-device masks, batch_norm normalises each rank's positions and a moe layer gathers the whole "
         "sequence over `context` (its capacity is filled in token order); the sequence must split into 2 x "
         "context chunks.")



@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a target can express. Everything here is checked against the plan by `Lowering.check` (lowering/base.py) and listed
    in the capability table of docs/targets.md (generated)."""

    mesh_axes: tuple[str, ...]  # mesh axes it can split over
    zero_stages: tuple[int, ...]  # training.zero values (the fsdp axis is ZeRO-3 in every target)
    master_weights: bool  # fp32 master copy of 16-bit parameters
    pipeline_schedules: tuple[str, ...]
    explicit_stages: bool  # `stage:` fields (otherwise the planner's even split of one repeated block)
    zero_with_pipeline: bool
    compute_dtypes: tuple[str, ...]
    param_dtypes: tuple[str, ...]
    # (params dtype, compute dtype) pairs it cannot run, with the reason
    dtype_limits: tuple[tuple[str, str, str], ...] = ()
    # batch statistics (batch_norm) reduced over the data-parallel ranks
    global_batch_statistics: bool = True
    # parameters split over the `data` axis (a `sharding.params` layout or a rule naming `data`)
    data_param_layouts: bool = True
    # `sharding.inputs` layouts other than the batch over the batch axes (a non-batch dimension split, or
    # the batch over other axes)
    input_layouts: bool = True
    ops: Optional[frozenset[str]] = None  # operators it renders; None: every registered operator
    launchers: tuple[str, ...] = ()
    # why a capability is missing, by what E049 names: a mesh axis ("tensor"), "zero", "master_weights",
    # "pipeline", "ops", a dtype ("bfloat16"): the diagnostic's help gives the reason before the way out
    reasons: tuple[tuple[str, str], ...] = ()
    # remat policies it implements (training.remat)
    remat: tuple[str, ...] = ("none", "selective", "full")
    # in a spec without `targets:`, validate checks this target too
    default: bool = True
    # the `eval` section in a build with more than one pipeline stage
    eval_with_pipeline: bool = False
    # a linear layer tied to an embedding table on another pipeline stage: "" refused; else in words, how
    # the program runs it
    tied_across_stages: str = ""
    # `--profile DIR` (docs/program.md "Profiling"): "" not supported; else in words, what it traces
    profile: str = ""
    # the devices (names as lowering/predicted.py's DEVICE_PROFILES read them) its programs run on: the
    # hardware profiles whose predictions --profile compares with (a torch program never runs on a TPU)
    profiled_devices: tuple[str, ...] = ()
    # generate.py of a language model (Plan.language_model): "" none; else in words, which builds have it
    sampling: str = ""
    # operators it runs inside a pipeline although the operator names a pipeline limit (Op.pipeline_limit):
    # dropout and attention dropout with the masks of the build without a pipeline, ...
    pipelined_ops: frozenset[str] = frozenset()
    # a pipelined build runs the layers outside the pipelined block on every pipe rank (so each holds their
    # parameters: Plan.memory_for), rather than on the stage the planner gives them
    pipeline_outside_everywhere: bool = False
    # a pipelined build pads every stage to the largest stage's copies of the pipelined block (SPMD: each pipe
    # rank holds the same shapes), so each pipe rank holds virtual_stages x that many copies (Plan.memory_for)
    pipeline_pads_stages: bool = False
    # attention without dropout runs as a fused kernel that stores no [b, heads, s, s] probabilities for the
    # backward pass (the plan's activations follow it: planner/costs CostOptions.fused_attention)
    fused_attention: bool = False
    # activation offload (training.offload): the remat settings it offloads under (empty: none), and the mesh
    # axes it does not offload on (lowering/offload.py checks them)
    offload_remat: tuple[str, ...] = ()
    offload_without: tuple[str, ...] = ()
    # FP8 linear layers (`precision.float8`): torchao.float8 in the torch target
    float8: bool = False
    # the `communication` settings it realises (lowering/communication.py checks them): gradient compressions,
    # collective algorithms, `bucket_mb`, the `overlap` values it can honour, fsdp `prefetch` depth
    compression: tuple[str, ...] = ("none",)
    collective_algorithms: tuple[str, ...] = ("auto",)
    bucket_size: bool = False
    overlap: tuple[bool, ...] = ()
    fsdp_prefetch: bool = False

    def reason(self, what: str, help: str) -> str:
        why = dict(self.reasons).get(what)
        return f"{why}; {help}" if why else help


class Target:
    """One target's declaration. Subclasses set the class attributes; its checks and lowering are the
    `Lowering` of the same name (lowering/)."""

    name: ClassVar[str]
    title: ClassVar[str]  # for people: "JAX", "PyTorch"
    capabilities: ClassVar[Capabilities]
    # (template, output file) rendered by `mithril-spec build`; plan.json is added to every build
    files: ClassVar[tuple[tuple[str, str], ...]]
    # output files rendered only for some plans: (file, the Plan attribute that must be set, not None or
    # false, for it), e.g. ("generate.py", "language_model") (planner/language_model.py)
    conditional_files: ClassVar[tuple[tuple[str, str], ...]] = ()
    imports: ClassVar[str]  # what its programs import besides the standard library
    limits: ClassVar[tuple[str, ...]] = ()  # what its lowering's `check_more` refuses, in words (docs/targets.md)

    def files_for(self, plan) -> tuple[tuple[str, str], ...]:
        """The (template, output file) pairs a build of `plan` renders: `files` less the conditional files
        whose condition the plan does not meet."""
        when = dict(self.conditional_files)
        return tuple((t, name) for t, name in self.files if name not in when or getattr(plan, when[name]))

    # where the per-layer pipeline diagnostics point (within the layer)
    pipeline_limit_field: ClassVar[tuple[str, ...]] = ("name",)
