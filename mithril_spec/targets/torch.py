"""The PyTorch target (templates/torch): DDP, FSDP2 / HSDP, DTensor tensor and sequence parallelism,
torch.distributed.pipelining, all-to-all expert parallelism, DCP checkpoints."""

from __future__ import annotations

from ..ops import OPS
from .base import CONTEXT_LIMIT, MESH_AXES, Capabilities, Target

# Tensor parallelism (ops/base.py `tensor_parallel`): column- / row-parallel linear layers, Megatron pairs
# (attention, mlp), a moe layer's experts split on their hidden features (the router and the dispatch whole on
# every rank, the experts' partial sums all-reduced) and batch_norm's channels (stored split, gathered for use).
TP_KINDS = ("matmul", "pair", "experts", "gather")
TP_OPS = tuple(k for k, op in OPS.items() if op.tensor_parallel in TP_KINDS)
# Operators a sequence-parallel block may hold: per-position ones, tensor-parallel pairs (attention, mlp) and
# moe layers (which gather the sequence: capacity is filled in token order over the whole sample).
SP_KINDS = ("pair", "experts")
SP_OPS = tuple(k for k, op in OPS.items() if op.per_position or op.tensor_parallel in SP_KINDS)


# ZeRO-1/2 in the torch target: the model replicated over `data` (ZeRO-1: DDP's all-reduce; ZeRO-2: a
# reduce-scatter), the optimizer stepping on each rank's slices (DTensors over `data`), the updated slices
# all-gathered. What it does not combine with, and why (an E049 each, listed in docs/targets.md):
ZERO_LIMITS = (
    ("an `fsdp` axis", "FSDP2 already shards the optimizer state over `fsdp` (ZeRO-3), and the torch program "
     "does not split it further over `data`"),
    ("a `tensor` axis and `data` above 1", "the tensor-parallel parameters are DTensors over (data, fsdp, "
     "tensor) kept by FSDP2, whose optimizer state the torch program does not split over `data`"),
    ("an `expert` axis", "the experts' gradients are reduced apart from DDP's, and the torch program does not "
     "split their optimizer state"),
)


# Parameters split over `data` (`sharding.params` or rules): FSDP2 fully_shard over the data axis, sharding
# exactly those parameters on the dimension the plan splits (the others left to the program, their gradients
# averaged by reduce_whole_grads, as they are under fsdp). What it does not combine with (an E049 each):
DATA_SPLIT_LIMITS = (
    ("fsdp", "an `fsdp` axis", "FSDP2 shards over `fsdp` (HSDP replicates over `data`), and the torch program "
     "does not shard over both"),
    ("tensor", "a `tensor` axis", "the tensor-parallel parameters are DTensors that FSDP2 shards over `fsdp` "
     "only"),
    ("pipe", "a `pipe` axis", "the pipeline stages replicate over `data`"),
    ("expert", "an `expert` axis", "the parameters outside the experts are replicated over `expert` (DDP over "
     "data x expert, or FSDP2 and the program's average over `expert`)"),
    ("context", "a `context` axis", "the parameters' gradients are averaged over `context` apart from FSDP2"),
)


# FP8 linear layers (`precision.float8`, torchao.float8's convert_to_float8_training) combine with `data` (DDP)
# and `fsdp` (FSDP2, the weights all-gathered in the compute dtype). What they do not combine with (an E049 each):
FLOAT8_LIMITS = (
    ("tensor", "a `tensor` axis", "tensor parallelism of FP8 layers needs torchao's Float8ColwiseParallel / "
     "Float8RowwiseParallel styles, which the torch program does not use"),
    ("pipe", "a `pipe` axis", "the pipelined torch program builds its stage modules without the conversion"),
    ("expert", "an `expert` axis", "the torch program's expert parallelism is not run with FP8 layers"),
    ("context", "a `context` axis", "the torch program's context parallelism is not run with FP8 layers"),
)


class TorchTarget(Target):
    name = "torch"
    title = "PyTorch"
    capabilities = Capabilities(
        mesh_axes=MESH_AXES,
        zero_stages=(0, 1, 2),  # over `data` alone (ZERO_LIMITS)
        master_weights=True,
        float8=True,  # torchao.float8 on the linear layers, with DDP and FSDP2 (FLOAT8_LIMITS)
        pipeline_schedules=("gpipe", "1f1b", "interleaved"),
        explicit_stages=True,
        zero_with_pipeline=True,  # over `data` (data_parallel: "zero1" / "zero2"; templates/torch/optimizer.py.j2)
        eval_with_pipeline=True,  # schedule.eval: the stages forward only (templates/torch/pipeline_main.py.j2)
        # templates/torch/pipeline_stages.py.j2 tie_groups / reduce_tied_grads; refused on a stage of the table's
        # pipe rank (lowering/torch.py pipeline_flow)
        tied_across_stages="yes, on another pipe rank than the table: a copy there, its gradient summed with the "
        "table's (Megatron's embedding group)",
        profile="yes (torch.profiler: a trace and a summary per rank, pipelined builds too)",
        profiled_devices=("H200", "H100", "A100", "cpu"),
        sampling="every mesh; a pipeline through its stages",
        compute_dtypes=("float32", "bfloat16", "float16"),
        param_dtypes=("float32", "bfloat16", "float16"),
        dtype_limits=tuple(
            (p, "float32", "store parameters in float32 and compute in bfloat16 (FSDP2 MixedPrecisionPolicy or "
             "autocast)") for p in ("bfloat16", "float16")),
        global_batch_statistics=True,
        data_param_layouts=True,  # FSDP2 over `data` alone (DATA_SPLIT_LIMITS)
        input_layouts=True,  # read as laid out, redistributed to the batch split (_input_layouts)
        reasons=(
            ("offload_remat", "torch's selective activation checkpointing keeps what it saves outside the "
             "saved-tensor hooks that move tensors to the host"),
            ("offload_tensor", "the torch program's offload hooks copy plain tensors, and tensor parallelism saves "
             "DTensors"),
            ("offload_pipe", "the pipelined torch program runs its stages without the offload hooks"),
        ),
        launchers=("launch.sh (torchrun, one machine or several)", "launch.sbatch (SLURM)"),
        fused_attention=True,  # F.scaled_dot_product_attention (at attention dropout 0)
        # dropout, attention: each pipeline micro-batch takes its rows of the micro-step's masks; moe: each
        # stage's load-balancing losses start their gradient at its output (CarryAuxLoss), their values are
        # summed per rank for the logged loss (templates/torch/pipeline_*.py.j2); under expert parallelism
        # each stage splits its own experts (expert_parallel). batch_norm: each pipeline micro-batch has its
        # id, by which the running statistics move once per micro-batch in their order, never in remat's
        # recomputation.
        pipelined_ops=frozenset({"dropout", "attention", "moe", "batch_norm"}),
        # DDP communication hooks (FSDP2: its reduce dtype), NCCL_ALGO in launch.sh, DDP's bucket_cap_mb,
        # FSDP2's explicit prefetch; DDP and FSDP2 always overlap the gradient reduction with the backward pass
        compression=("none", "fp16", "bf16", "powersgd"),
        collective_algorithms=("auto", "ring", "tree"),
        bucket_size=True,
        overlap=(True,),
        fsdp_prefetch=True,
        offload_remat=("none", "full"),  # torch.autograd.graph.saved_tensors_hooks
        offload_without=("pipe", "tensor"),
    )
    files = (
        ("torch/train.py.j2", "train.py"),
        ("torch/launch.sh.j2", "launch.sh"),
        ("torch/launch.sbatch.j2", "launch.sbatch"),
        ("torch/README.md.j2", "README.md"),
        ("torch/generate.py.j2", "generate.py"),
    )
    conditional_files = (("generate.py", "language_model"),)  # sampling from a language model
    imports = "numpy, torch"
    limits = (
        "Layer names may not shadow `torch.nn.Module` or FSDP2 `FSDPModule` attributes, nor start with `_`.",
        "Tensor parallelism over `tensor` applies to " + ", ".join(f"`{k}`" for k in TP_OPS) + " layers: a "
        "column-parallel linear is followed by a row-parallel one with only element-wise layers between; "
        "attention and mlp split every input projection on its outputs and the output projection on its inputs; "
        "an embedding table may be split on its vocabulary, and the output layer of a cross_entropy loss on its "
        "output features (vocab-parallel, with a parallel cross-entropy; in a pipeline too, the split logits "
        "staying on the last stage); a moe layer splits its experts (fc/proj or swiglu) and its shared experts on "
        "their hidden features, all together, or not at all (the router, the dispatch and shared_gate whole on "
        "every rank, the experts' partial sums all-reduced); a batch_norm keeps "
        "its slice of the channels and gathers them for use.",
        "Sequence parallelism (the sequence axis ruled to `tensor` in a repeated block) needs the block's layers "
        "to be per-position operators or tensor-parallel attention / mlp / moe (dropout keeps its positions' "
        "slice of the whole sequence's masks; a moe layer gathers the whole sequence, over which its capacity "
        "is filled), and is not combined with a pipeline.",
        "Expert parallelism: the `expert` axis splits exactly the experts of moe layers, on dimension 0, over "
        "`expert` or `expert` then `fsdp` (each rank its own experts; the same in every moe layer), their other "
        "dimensions whole or their hidden features over `tensor`; it combines with `data`, `fsdp`, `tensor` and "
        "`pipe`.",
        "Under fsdp, a parameter none of whose dimensions the fsdp axis divides stays whole on every rank (as "
        "planned: FSDP2 ignores it and the program averages its gradient); with a compute dtype other than the "
        "parameters' such a parameter is refused (FSDP2's MixedPrecisionPolicy casts only what it shards).",
        "A pipeline passes exactly one tensor from stage to stage; the model inputs go to the first stage, the "
        "loss targets (a model input) to the last; a linear layer tied to an embedding on another stage of the "
        "same pipe rank (interleaved) is refused; remat in a pipeline needs a repeated block.",
        *(f"`training.zero` with {what}: {why}." for what, why in ZERO_LIMITS),
        "Parameters split over `data` (FSDP2 over the data axis) need `data` among the batch axes and "
        "`training.zero: 0`, keep batch_norm's running statistics whole over `data`, and with a compute dtype "
        "other than the parameters', or gradient compression, every trainable parameter split over `data`.",
        *(f"Parameters split over `data` with {what}: {why}." for _, what, why in DATA_SPLIT_LIMITS),
        *(f"`precision.float8` (FP8 linear layers) with {what}: {why}." for _, what, why in FLOAT8_LIMITS),
        "`sharding.inputs` layouts other than rows of the batch (each rank reads its block, redistributed to its "
        "rows) are refused with a `pipe` axis, with mesh axes out of the mesh's order on one dimension (the "
        "batch rule's too), and where the layout's batch split does not divide a micro-batch.",
        CONTEXT_LIMIT,
    )


# Attribute and method names of torch.nn.Module: a layer with one of these names would be shadowed.
TORCH_MODULE_ATTRS = {
    "add_module", "apply", "bfloat16", "buffers", "children", "compile", "cpu", "cuda", "double", "dump_patches",
    "eval", "extra_repr", "float", "forward", "get_buffer", "get_extra_state", "get_parameter", "get_submodule",
    "half", "ipu", "load_state_dict", "modules", "mtia", "named_buffers", "named_children", "named_modules",
    "named_parameters", "parameters", "register_backward_hook", "register_buffer", "register_forward_hook",
    "register_forward_pre_hook", "register_full_backward_hook", "register_full_backward_pre_hook",
    "register_load_state_dict_post_hook", "register_load_state_dict_pre_hook", "register_module",
    "register_parameter", "register_state_dict_post_hook", "register_state_dict_pre_hook", "requires_grad_",
    "set_extra_state", "set_submodule", "share_memory", "state_dict", "to", "to_empty", "train", "training",
    "type", "xpu", "zero_grad", "call_super_init", "T_destination",
}  # fmt: skip


# Methods fully_shard adds to a module (FSDP2's FSDPModule): a layer of that name would be shadowed.
FSDP_MODULE_ATTRS = {
    "reshard", "unshard", "set_is_last_backward", "set_requires_gradient_sync", "set_requires_all_reduce",
    "set_reshard_after_forward", "set_reshard_after_backward", "set_modules_to_forward_prefetch",
    "set_modules_to_backward_prefetch", "set_all_reduce_hook", "set_post_optim_event",
    "set_reduce_scatter_divide_factor", "set_gradient_divide_factor", "set_force_sum_reduction_for_comms",
    "set_unshard_in_backward", "set_custom_all_gather", "set_custom_reduce_scatter", "share_comm_ctx",
    "set_allocate_memory_from_process_group_for_comm",
}  # fmt: skip
