"""The document `plan --format json` prints, as pydantic models: the single source of its layout.

`plan_json.plan_to_json` and `costs.serialise.costs_to_json` build these models from a `Plan` and its
`Costs`; `schema.plan_schema_text()` publishes them as schemas/plan.schema.json, whose descriptions are the
field reference (docs/plan-json.md and docs/cost-model.md point to it). Fields are declared in the order
the document prints them. Units: sizes and shapes in elements, `bytes` in bytes, FLOPs in floating-point
operations (a multiply-add counts 2), times in seconds; "per device" means one device (the fullest one
where pipe ranks differ).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictInt, WithJsonSchema

# A JSON number. An integer stays an integer (a plain `float` field would print 1 as 1.0).
Number = Annotated[StrictInt | float, WithJsonSchema({"type": "number"})]
Layout = list[list[str] | None]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


def _f(description: str, **kw: Any) -> Any:
    return Field(description=description, **kw)


# ---------------------------------------------------------------- the plan


class Mesh(_Doc):
    """The device mesh the plan is for."""

    name: str = _f("the mesh's name: a key of `meshes`, `default` for a spec with `mesh:` or without any mesh, "
                   "`cli` for a `--mesh AXIS=SIZE,...` override")
    axes: dict[str, int] = _f("mesh axis -> size, only axes of size > 1, in canonical order (`pipe`, `data`, "
                              "`fsdp`, `expert`, `tensor`); `{}` on one device")
    devices: int = _f("number of devices: the product of the axis sizes")


class Batch(_Doc):
    """How the batch is split."""

    global_: int = _f("`training.batch_size`: samples per optimizer step", alias="global")
    grad_accum: int = _f("`training.grad_accum`: micro-batches per step")
    micro_batch: int = _f("samples per micro-batch over all devices: `global / grad_accum`")
    axes: list[str] = _f("mesh axes the batch dimension is split over (the `batch` sharding rule, else `data`, "
                         "`fsdp`, `expert`; only axes of size > 1)")
    data_parallel: int = _f("the data-parallel degree: product of the sizes of `axes` (1 when empty)")
    per_device: int = _f("samples per device per micro-batch: `micro_batch / data_parallel` (with a pipeline, "
                         "each micro-batch is further split into `pipeline.microbatches`)")


class Input(_Doc):
    """A model input."""

    name: str = _f("the input's name")
    shape: list[Literal["batch"] | int] = _f('`"batch"` followed by the per-sample sizes (elements)')
    dtype: str = _f("`float32`, `bfloat16`, `float16`, `int32` or `int64`")
    layout: Layout = _f("one entry per dimension, batch first: the mesh axes the dimension is split over, or "
                        "null (not split)")
    local_batch: int = _f("samples of this input per device per micro-batch: `micro_batch` divided by the sizes "
                          "of the axes in `layout[0]`")


class Param(_Doc):
    """A trainable parameter outside every repeated block (in the order of the layers) or, after all of them,
    such a buffer (batch_norm `running_mean`/`running_var`). The parameters of a repeated block are listed
    once for all copies, under `repeats`."""

    name: str = _f("canonical name, e.g. `wte.weight` (docs/spec.md#blocks-and-repeat)")
    shape: list[int] = _f("canonical shape, defined by the operator (docs/spec.md#operator-reference)")
    axes: list[str | None] = _f("logical axis per dimension, or null")
    layout: Layout = _f("one entry per dimension: the mesh axes it is split over (over their product, in this "
                        "order), or null (not split)")
    local_shape: list[int] = _f("the shape of one device's shard: each dimension divided by the product of its "
                                "layout's axis sizes")
    dtype: str = _f("storage dtype: `training.precision.params` for parameters, `float32` for buffers")
    bytes: int = _f("bytes of the whole tensor: elements x dtype size (float32 4, bfloat16 and float16 2)")
    local_bytes: int = _f("bytes of one device's shard: `local_shape` elements x dtype size")
    stage: int = _f("pipeline stage that holds it; 0 without a pipeline")
    buffer: bool = _f("true for a buffer (not trained), false for a parameter")


class BlockParam(_Doc):
    """A parameter (or buffer) of a repeated block, for all its copies: every copy has this shape, layout and
    dtype (E073 otherwise)."""

    name: str = _f("name inside the block, e.g. `attn.q.weight`: copy `i` of the repeat `blocks` owns "
                   "`blocks.<i>.attn.q.weight` (docs/spec.md#blocks-and-repeat)")
    shape: list[int] = _f("canonical shape of one copy, defined by the operator (docs/spec.md#operator-reference)")
    axes: list[str | None] = _f("logical axis per dimension, or null")
    layout: Layout = _f("one entry per dimension: the mesh axes it is split over (over their product, in this "
                        "order), or null (not split); the same for every copy")
    local_shape: list[int] = _f("the shape of one device's shard of one copy: each dimension divided by the "
                                "product of its layout's axis sizes")
    dtype: str = _f("storage dtype: `training.precision.params` for parameters, `float32` for buffers")
    bytes: int = _f("bytes of one copy: elements x dtype size (all copies: `count` times this)")
    local_bytes: int = _f("bytes of one device's shard of one copy: `local_shape` elements x dtype size")
    buffer: bool = _f("true for a buffer (not trained), false for a parameter")


class CopyStages(_Doc):
    """Consecutive copies of a repeated block on one pipeline stage."""

    stage: int = _f("the pipeline stage that holds copies `start` to `end - 1` (their parameters and "
                    "buffers); 0 without a pipeline")
    start: int = _f("the first copy of the run, from 0")
    end: int = _f("one past the last copy of the run, as in `blocks[start:end]` of `pipeline.stages[].layers`")


class Repeat(_Doc):
    """A repeated block (a `repeat` layer): `count` copies of one block, its parameters listed once."""

    name: str = _f("the repeat layer's name: the prefix of its copies' parameter names, `<name>.<i>.<param>`")
    block: str = _f("the block it repeats: a key of `model.blocks`")
    count: int = _f("number of copies, numbered 0 to `count - 1`")
    stages: list[CopyStages] = _f("the pipeline stage of every copy, as runs of consecutive copies in copy "
                                  "order that together cover 0 to `count`; one run `{stage: 0, start: 0, end: "
                                  "count}` without a pipeline (what differs between copies)")
    params: list[BlockParam] = _f("one per parameter of the block, in block order, then one per buffer; "
                                  "copy `i` of each is `<name>.<i>.<params[].name>`, on the stage of the run "
                                  "of `stages` holding `i`")


class PerDeviceState(_Doc):
    """Bytes of training state on one device (with a pipeline: the stages of the fullest pipe rank)."""

    params: int = _f("bytes of parameter shards: sum of the parameters' `local_bytes`")
    grads: int = _f("bytes of gradients: the parameter dtype and layout, so equal to `params` unless "
                    "`training.zero: 2` divides each gradient by the data-parallel degree its parameter is "
                    "replicated over")
    optimizer: int = _f("bytes of optimizer state: slots x the parameter shards (2 slots for adam/adamw, 1 for "
                        "sgd with momentum > 0, 0 for sgd without); with `precision.master_weights` (16-bit "
                        "parameters) a float32 master copy and float32 slots; `training.zero: 1` or `2` divides "
                        "it by the data-parallel degree each parameter is replicated over "
                        "(docs/cost-model.md#training-state)")
    buffers: int = _f("bytes of buffer shards (float32)")
    total: int = _f("`params + grads + optimizer + buffers`; activations, temporaries and framework overhead are "
                    "not included (the predicted peak with them is `costs.peak_bytes`)")


class Totals(_Doc):
    """Counts and per-device memory."""

    param_count: int = _f("elements of all trainable parameters (buffers not included; a tied linear has no "
                          "parameters of its own, so a shared table counts once)")
    param_bytes: int = _f("bytes of all trainable parameters, unsharded, in the parameter dtype")
    per_device: PerDeviceState = _f("bytes of training state on one device")
    flops_per_sample_forward: int = _f("forward FLOPs per sample of the whole model (sum over layers, repeat "
                                       "copies included); not divided by the number of devices")


class PipelineStage(_Doc):
    """A pipeline stage."""

    index: int = _f("stage number, from 0")
    rank: int = _f("pipe rank that runs it: `index mod pipe`")
    layers: list[str] = _f("top-level layers on the stage, in order; a slice of a repeat is written "
                           "`blocks[0:2]` (copies 0 and 1)")
    params: int = _f("parameter elements of the stage (not bytes)")
    flops_per_sample_forward: int = _f("forward FLOPs per sample of the stage")


class Pipeline(_Doc):
    """The pipeline (docs/spec.md#pipeline)."""

    pipe: int = _f("size of the `pipe` mesh axis (1 when the mesh has none)")
    virtual_stages: int = _f("stages per pipe rank (1 unless `pipe` > 1)")
    microbatches: int = _f("`pipeline.microbatches`")
    schedule: str = _f("`gpipe`, `1f1b` or `interleaved`")
    bubble_fraction: Number = _f("idle fraction of the schedule, "
                                 "`(pipe-1)/(virtual_stages*microbatches+pipe-1)`; 0 when `pipe` is 1")
    stages: list[PipelineStage] = _f("one per stage, `pipe x virtual_stages` of them")


class Diagnostic(RootModel[dict[str, Any]]):
    """A diagnostic in the format of docs/diagnostics.md#json (the keys below, and more)."""

    model_config = ConfigDict(json_schema_extra={
        "properties": {
            "code": {"type": "string", "description": "the diagnostic code, e.g. `W001` (`mithril-spec explain "
                                                      "CODE`)"},
            "severity": {"enum": ["error", "warning"], "description": "`error` or `warning`"},
            "message": {"type": "string", "description": "what is wrong"},
            "file": {"type": ["string", "null"], "description": "the spec file, or null"},
            "line": {"type": ["integer", "null"], "description": "1-based line, or null"},
            "col": {"type": ["integer", "null"], "description": "1-based column, or null"},
            "help": {"type": ["string", "null"], "description": "how to fix it, or null"},
            "notes": {"type": "array", "items": {"type": "string"}, "description": "further explanations"},
        },
        "required": ["code", "severity", "message"],
    })


# ---------------------------------------------------------------- the costs


class TrainingState(_Doc):
    """Bytes per device of the training state (docs/cost-model.md#training-state)."""

    params: int = _f("parameter shards")
    grads: int = _f("gradients (divided by the ZeRO degree under ZeRO-2)")
    optimizer: int = _f("optimizer state: `master + moments`")
    master: int = _f("float32 master copy of 16-bit parameters (`precision.master_weights`)")
    moments: int = _f("optimizer slots (adam: m and v; sgd: momentum)")
    buffers: int = _f("buffer shards (float32)")
    total: int = _f("`params + grads + optimizer + buffers`")


class ActivationBlock(_Doc):
    """Activations of a repeated block (docs/cost-model.md#activations)."""

    name: str = _f("the repeat's name")
    count: int = _f("copies of the block on this pipe rank")
    per_copy: int = _f("bytes saved by one copy without remat (the largest over copies)")
    scores: int = _f("of `per_copy`, bytes of attention scores and probabilities (what selective remat drops)")
    checkpoint: int = _f("bytes full remat keeps per copy: the block input")


class Activations(_Doc):
    """Bytes per device saved for the backward pass (docs/cost-model.md#activations)."""

    remat: str = _f("the remat setting: `none`, `selective` or `full`")
    saved: int = _f("bytes saved, for all micro-batches in flight")
    recompute: int = _f("full remat: bytes of one block's activations rebuilt during the backward pass")
    total: int = _f("on the device: `saved - offloaded + recompute`")
    offloaded: int = _f("of `saved`, bytes in host memory (`training.offload`; docs/cost-model.md#activation-offload)")
    offload_per_step: int = _f("bytes moved to host memory per step, and the same back (`training.offload`)")
    by_op: dict[str, int] = _f("saved bytes per operator kind, before remat (one micro-batch), sorted by kind")
    blocks: list[ActivationBlock] = _f("one per repeated block on this pipe rank")


class Temporaries(_Doc):
    """Short-lived buffers at the worst moment of a step, in bytes (docs/cost-model.md#temporaries-and-the-peak)."""

    gradient_flow: int = _f("the largest layer's output gradient and input gradient, alive together")
    loss: int = _f("the fp32 log-softmax of the logits and their gradient")
    gathered_params: int = _f("parameters all-gathered over fsdp (or cast to the compute dtype)")
    unsharded_grads: int = _f("gradients of the gathered layers before their reduce-scatter")
    optimizer: int = _f("two fp32 temporaries the size of the largest optimizer-state shard")
    float8_casts: int = _f("`precision.float8`: the FP8 copies of the largest FP8 layer's input, weight and "
                           "output gradient (twice), and their scales (0 without it)")
    total: int = _f("the sum of the above")


class Collective(_Doc):
    """A collective the plan implies (docs/cost-model.md#communication)."""

    kind: str = _f("`all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all` or `send/recv`")
    axes: list[str] = _f("mesh axes of the group")
    group: int = _f("devices per group")
    phase: str = _f("`forward`, `recompute`, `backward` or `step`")
    what: str = _f("what is communicated")
    bytes: int = _f("payload per call per device: the full buffer being reduced or gathered")
    count: int = _f("calls per optimizer step (gradient accumulation and pipeline micro-batches included)")
    total_bytes: int = _f("`bytes x count`")
    wire_bytes: int = _f("bytes a ring sends per device per step, rounded: all-reduce `2 (n-1)/n`, all-gather, "
                         "reduce-scatter and all-to-all `(n-1)/n`, send/recv `1` times `total_bytes`")
    blocking: bool = _f("on the critical path (tensor, sequence, expert parallel, pipeline, loss) rather than "
                        "overlapped with compute (data parallel, ZeRO, fsdp)")
    compression: str = _f("`none`, or the gradient compression of this data-parallel reduction "
                          "(`communication.compression`: `fp16`, `bf16`, `powersgd`); `bytes` is what it sends")


class StageCosts(_Doc):
    """One pipe rank: the pipeline stages its devices hold (everything when there is no pipeline)."""

    stage: int = _f("the pipe rank")
    layers: list[str] = _f("its top-level layers (`blocks[a:b]` for slices of a repeat)")
    devices: int = _f("devices on this pipe rank")
    states: TrainingState = _f("training state per device")
    activations: Activations = _f("activations per device")
    temporaries: Temporaries = _f("temporaries per device")
    in_flight: Number = _f("micro-batches whose activations are alive at once (pipeline schedules)")
    flops_per_device: Number = _f("forward + backward + recompute FLOPs per device per step")
    float8_flops_per_device: Number = _f("of which the FP8 linear layers' (`precision.float8`: forward and "
                                         "backward, timed at the profile's `float8` peak; 0 without it)")
    collectives: list[Collective] = _f("this pipe rank's collectives")
    peak: int = _f("predicted peak bytes per device: `states.total + activations.total + temporaries.total`")


class PerDeviceFlops(_Doc):
    """FLOPs per device per step, for the busiest pipe rank (docs/cost-model.md#flops)."""

    forward: Number = _f("forward FLOPs")
    backward: Number = _f("backward FLOPs")
    recompute: Number = _f("FLOPs remat repeats")
    total: Number = _f("`forward + backward + recompute`")


class Flops(_Doc):
    """FLOPs of one optimizer step (docs/cost-model.md#flops)."""

    forward: Number = _f("forward FLOPs of the whole model (global batch, all micro-batches)")
    backward: Number = _f("backward FLOPs of the whole model: 2 x forward")
    recompute: Number = _f("forward FLOPs remat repeats (full: the repeated blocks; selective: attention "
                           "`q kᵀ` and `p v`)")
    model: Number = _f("`forward + backward`, without recompute (the MFU numerator)")
    per_device: PerDeviceFlops = _f("FLOPs per device")


class Hardware(_Doc):
    """A hardware profile, in SI units (docs/cost-model.md#hardware-and-step-time)."""

    name: str = _f("the profile's name")
    description: str = _f("what the profile models")
    flops: dict[str, Number] = _f("peak dense FLOP/s per device, by compute dtype")
    memory_bytes: Number = _f("device memory, bytes")
    reserved_bytes: Number = _f("memory kept by the runtime (context, communication buffers, workspaces), bytes")
    hbm_bytes_per_s: Number = _f("memory bandwidth, bytes/s")
    devices_per_node: int = _f("devices per node (sharing the intra-node link)")
    intra_node_bytes_per_s: Number = _f("intra-node bandwidth per device, one direction, bytes/s")
    inter_node_bytes_per_s: Number = _f("inter-node bandwidth per device, one direction, bytes/s")
    intra_node_latency_s: Number = _f("intra-node latency per ring step, seconds")
    inter_node_latency_s: Number = _f("inter-node latency per ring step, seconds")
    efficiency: Number = _f("assumed fraction of peak FLOP/s the model's compute reaches")
    kernel_overhead_s: Number = _f("fixed time of one kernel (dispatch, launch), seconds; 0: not modelled")
    sharded_layer_overhead_s: Number = _f("fixed time of one tensor-parallel layer's sharded-tensor dispatch "
                                          "(torch DTensor), forward and backward, seconds; 0: not modelled")
    elementwise_bytes_per_s: Number = _f("bandwidth of element-wise activation traffic, bytes/s; 0: folded "
                                         "into `efficiency`")
    host_bytes_per_s: Number = _f("device-host bandwidth per device, one direction, bytes/s (activation offload)")
    overlap_collectives: bool = _f("whether data-parallel collectives overlap compute on this device; false: "
                                   "all of them is exposed")


class StepTime(_Doc):
    """Predicted time of one optimizer step (docs/cost-model.md#hardware-and-step-time)."""

    peak_flops: Number = _f("peak FLOP/s per device for the compute dtype")
    efficiency: Number = _f("fraction of `peak_flops` assumed reached")
    compute_s: Number = _f("compute seconds: FLOPs per device / (peak_flops x efficiency)")
    blocking_comm_s: Number = _f("seconds of blocking collectives (tensor, sequence, expert parallel, pipeline, "
                                 "loss): on the critical path")
    overlapped_comm_s: Number = _f("seconds of data-parallel, ZeRO and fsdp collectives, overlapped with compute")
    exposed_comm_s: Number = _f("the part of `overlapped_comm_s` compute does not hide: "
                                "`max(0, overlapped - compute)`")
    optimizer_s: Number = _f("seconds of the memory-bound optimizer update")
    bubble: Number = _f("pipeline bubble fraction")
    step_s: Number = _f("seconds per step: `(compute + blocking + exposed + offload + elementwise + "
                      "overhead) / (1 - bubble) + optimizer`")
    mfu: Number = _f("model FLOPs utilisation: forward + backward FLOPs / (step x devices x peak)")
    hfu: Number = _f("hardware FLOPs utilisation: as `mfu`, recompute included")
    samples_per_s: Number = _f("samples per second")
    tokens_per_s: Number | None = _f("tokens per second; null when the inputs are not token sequences")
    collective_s: list[Number] = _f("seconds per step of each entry of `costs.collectives`")
    links: list[str] = _f("`intra-node` or `inter-node`, per entry of `costs.collectives`")
    algorithms: list[str] = _f("`ring` or `tree`, per entry of `costs.collectives`: the algorithm costed "
                               "(`communication.algorithm`; `auto`: the cheaper)")
    offload_s: Number = _f("seconds of activation offload's transfers, out and back (in `step_s`)")
    elementwise_s: Number = _f("seconds of element-wise activation traffic (in `step_s`; 0 unless the profile "
                               "has `elementwise_bytes_per_s`)")
    kernels: int = _f("kernels one device launches per step (counted for `overhead_s`)")
    sharded_layers: int = _f("tensor-parallel layers one device runs through a sharded-tensor dispatch per step "
                             "(`plan --target torch`: its DTensor modules, per micro-batch; counted for `overhead_s`)")
    overhead_s: Number = _f("kernels x the profile's `kernel_overhead_s` + sharded layers x its "
                            "`sharded_layer_overhead_s` (in `step_s`)")


class Costs(_Doc):
    """The cost model's prediction for one optimizer step, per device (docs/cost-model.md)."""

    remat: str = _f("the remat setting costed: `none`, `selective` or `full`")
    target: str | None = _f("the target whose program is costed: its kernels, held states, reduction calls and "
                            "sharded-tensor layers (`plan --target`; a build's `plan.json`: the build's target, "
                            "whose program embeds these figures); null: the largest over the spec's `targets` (a "
                            "note says which target stores less)")
    zero: int = _f("the ZeRO stage: 0, 1 or 2")
    micro_batches: int = _f("micro-batches per optimizer step per device (grad_accum x pipeline micro-batches)")
    local_batch: int = _f("samples per device per micro-batch")
    peak_bytes: int = _f("predicted peak bytes per device: the largest `stages[].peak`")
    offload_threshold: int | None = _f("activation offload (`training.offload`): saved tensors of at least this "
                                       "many elements go to host memory; null: no offload")
    stages: list[StageCosts] = _f("one per pipe rank (one without a pipeline)")
    collectives: list[Collective] = _f("the busiest pipe rank's collectives")
    comm_bytes: int = _f("sum of `collectives[].total_bytes`")
    flops: Flops = _f("FLOPs per step")
    hardware: Hardware | None = _f("the hardware profile (`--hardware`), or null")
    fits: bool | None = _f("whether the peak is within the usable memory; null without `--hardware`")
    capacity_bytes: Number | None = _f("usable memory per device (memory - reserved), or null")
    time: StepTime | None = _f("predicted step time; null without `--hardware`")
    notes: list[str] = _f("caveats for this plan (e.g. remat on a model without repeated blocks)")


class ProfilePrediction(_Doc):
    """One hardware profile's step time for the program's `--profile` (rounded to 4 significant digits)."""

    step_s: Number = _f("seconds per step: `costs.time.step_s` on this profile (`plan --target T --hardware NAME`)")
    compute_s: Number = _f("compute seconds per step: `costs.time.compute_s` on this profile")
    offload_s: Number = _f("activation offload's seconds per step: `costs.time.offload_s` on this profile")
    comm_s: dict[str, Number] = _f("collective kind -> seconds per step, summed over `costs.time.collective_s` "
                                   "(the kinds of `predicted.comm_bytes`)")


class OffloadPrediction(_Doc):
    """Activation offload (`training.offload`) as the program counts it."""

    threshold: int = _f("`costs.offload_threshold`: saved tensors of at least this many elements go to the host")
    per_step: int = _f("bytes moved out per step (and as many back) on the fullest pipe rank: "
                       "`activations.offload_per_step` of the largest `costs.stages[].peak`")
    host_bytes: int = _f("bytes held in host memory at once: that stage's `activations.offloaded`")


class Predicted(_Doc):
    """What the build's program compares its measurements with (`train.py --profile`, docs/program.md
    "Profiling"): `costs` summed per collective kind, and the step time on each built-in hardware profile a
    device's name selects at run time."""

    peak_bytes: int = _f("`costs.peak_bytes`")
    comm_bytes: dict[str, int] = _f("collective kind -> bytes per device per step: `costs.collectives[].total_bytes` "
                                    "summed per kind, the kinds with bytes")
    comm_calls: dict[str, int] = _f("collective kind -> calls per step (`costs.collectives[].count`), the kinds "
                                    "of `comm_bytes`")
    profiles: dict[str, ProfilePrediction] = _f("built-in hardware profile -> the step time on it")
    device_profiles: list[list[str]] = _f("`[name part, profile]` pairs, in the order tried: a device whose name "
                                          "(torch.cuda.get_device_name, jax's device_kind) holds the part (any "
                                          "case) is compared with the profile's figures; the devices the target's "
                                          "programs run on")
    offload: OffloadPrediction | None = _f("activation offload; null without `training.offload`")


class PlanDocument(_Doc):
    """What `mithril-spec plan SPEC --format json` prints for a valid spec (and `build --target T` writes to
    `plan.json`, as `plan --target T` prints it): everything the plan says, per device where it says "per
    device" (docs/plan-json.md)."""

    format: Literal[2] = _f("version of this JSON layout: 2 since repeated blocks are listed once (`repeats`); "
                            "1 listed every copy's parameters under `params`")
    name: str = _f("the spec's `name`")
    mesh: Mesh = _f("the mesh the plan is for")
    batch: Batch = _f("how the batch is split")
    inputs: list[Input] = _f("one per model input, in spec order")
    params: list[Param] = _f("one per trainable parameter outside repeated blocks, then one per buffer outside "
                             "them; the parameters of repeated blocks are under `repeats`")
    repeats: list[Repeat] = _f("one per repeated block (`repeat` layer), in layer order, listing its parameters "
                               "once for all copies; empty when the model repeats nothing")
    totals: Totals = _f("counts and per-device memory")
    pipeline: Pipeline | None = _f("the pipeline's stages; null when the spec has no `pipeline` section")
    diagnostics: list[Diagnostic] = _f("the plan's warnings (W001, W002; with `--hardware`, E050); empty when "
                                       "there are none")
    costs: Costs = _f("the cost model's prediction for one step (docs/cost-model.md)")
    predicted: Predicted | None = _f("what the program of `costs.target` compares `train.py --profile` with, "
                                     "read from `costs` (a build's `plan.json` is where the program reads "
                                     "them); null without `--target`, or for a target whose programs do not "
                                     "profile (mlx)")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
