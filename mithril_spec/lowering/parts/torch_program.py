"""The parts of torch's other templates (generate, optimizer, config, README, ...) (lowering/parts/__init__.py says what parts are)."""

from __future__ import annotations

from typing import Any


def generate(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """generate.py's slots (templates/torch/generate_parts.py.j2); empty where the program has no generate.py."""
    t, s = ctx["torch"], ctx["sampling"]
    if s is None:
        return {slot: [] for slot in GENERATE_SLOTS}
    pp, split = bool(s["stages"]), s["tensor"] > 1
    return {
        # the docstring's usage: torchrun on a mesh of several ranks, else plain python
        "usage": ["usage_torchrun" if t.distributed else "usage_python"],
        # the docstring's sentences on how the decode runs split: over pipeline stages, over `tensor`
        "decode_docstring": (["pipeline_sentence"] if pp else []) + (["tensor_sentence"] if split else []),
        # TOKENIZER's comment when the spec names none (the prompt's bytes are the tokens)
        "tokenizer_comment": [] if s["tokenizer"] else ["no_tokenizer"],
        # the layers that stay split over `tensor` while decoding, when the model is split over it
        "tensor_local": ["tensor_local"] if split else [],
        # a pipeline's load_model: its docstring on the stages' parallelisation, then the calls that build
        # each stage on the meta device as train.py does (its parameters stored apart, then parallelised)
        "stages_built": ["stages_parallelised"] if t.parallelized else [],
        "stages_read": ["stage_shards"] if t.parallelized else [],
        "stage_built": (["store_stage_params"] if t.store_params else [])
        + (["parallelize_stage"] if t.parallelized else []),
        # --resume's checkpoint load: with the Shards the optimizer steps on (ZeRO, master weights), or without
        "resume": ["load_checkpoint_shards" if t.shards else "load_checkpoint"],
        # the pipeline's full forward pass under autocast when the compute dtype is not the parameters'
        "stages_context": ["autocast" if t.autocast else "no_autocast"],
        # the same for the whole model (no pipeline): docstring, build calls, the forward pass of --check, its
        # sequence split over `context` (this rank's places in, every rank's logits gathered out)
        "model_built": ["model_parallelised"] if t.parallelized else [],
        "model_built_calls": (["store_model_params"] if t.store_params else [])
        + (["parallelize_model"] if t.parallelized else []),
        "full_tokens": ["context_places"] if t.context else [],
        "full_logits": ["forward_autocast" if t.autocast else "forward"],
        "full_gathered": ["context_gather"] if t.context else [],
        # main: the context ring joined (the full forward pass of --check needs it), the model (a pipeline's:
        # this rank's stages and its pipe rank), the decoder's split arguments, --check's forward pass
        "after_setup": ["join_context"] if t.context else [],
        "load_model": ["load_stages" if pp else "load_model"],
        "decode_weights_args": ["tensor_local_arg"] if split else [],
        "decoder_args": (["tensor_group_arg"] if split else []) + (["pipe_args"] if pp else []),
        "print_result": ["print_result_stages" if pp else "print_result"],
    }


GENERATE_SLOTS = (
    "usage",
    "decode_docstring",
    "tokenizer_comment",
    "tensor_local",
    "stages_built",
    "stages_read",
    "stage_built",
    "resume",
    "stages_context",
    "model_built",
    "model_built_calls",
    "full_tokens",
    "full_logits",
    "full_gathered",
    "after_setup",
    "load_model",
    "decode_weights_args",
    "decoder_args",
    "print_result",
)


def optimizer(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """optimizer.py's slots (templates/torch/optimizer_parts.py.j2): the Shards class (ZeRO's slices and / or
    float32 master copies; rendered only where the optimizer steps on Shards, t.shards) and make_optimizer."""
    t, name = ctx["torch"], ctx["training"]["optimizer"]["name"]
    zero, zero2, master = bool(t.zero), t.zero >= 2, t.master
    if zero2:  # the gradients reduce-scattered onto the slices (no DDP)
        take = "reduce_scatter_grads"
    elif t.zero_all_reduce:  # ZeRO-1 in a pipeline: all-reduced here
        take = "all_reduce_grads"
    else:  # ZeRO-1 under DDP (averaged already), or master weights alone
        take = "ddp_averaged_grads" if zero else "float32_grads"
    return {
        # Shards' docstring: a paragraph on ZeRO (the gradient split too from stage 2), one on master weights
        # (copies of the slices under ZeRO)
        "shards_docstring": (["zero_paragraph"] if zero else []) + (["master_paragraph"] if master else []),
        "zero_split": ["and_gradient"] if zero2 else [],  # (config.py's ZERO_DIMS comment renders it too)
        "master_copy_of": ["each_slice" if zero else "each_parameter"],
        # __init__: under ZeRO the data mesh and this rank's slice of each parameter (a float32 copy of it with
        # master weights), else a float32 copy of the whole parameter; from stage 2 the gradient slices kept
        "shards_mesh": ["data_mesh"] if zero else [],
        "shards_leaf": ["slice_leaf" if zero else "float32_leaf"],
        "master_slice": ["float32_slice"] if master else [],
        "shards_kept": ["kept_grads"] if zero2 else [],
        # take_grads: how the gradients reach the leaves (see `take` above), cast to float32 for master copies
        "float32_grad": ["as_float32"] if master else [],
        "take_grads_docstring": ["reduce_scatter_sentence"] if zero2 else [],
        "take_grads": [take],
        "float32_grads": ["to_float32"] if master else [],
        # write_back: the slices all-gathered (rounded to PARAM_DTYPE from master copies), else the copies
        # rounded; master weights free the float32 gradient there
        "write_back_docstring": [
            ("slices_gathered_rounded" if master else "slices_gathered") if zero else "copies_rounded"
        ],
        "write_back": [("gather_rounded" if master else "gather") if zero else "copy"]
        + (["free_float32_grad"] if master else []),
        # from ZeRO-2 the gradients held are the kept slices (the memory report), cleared by zero_grad
        "held_grads_docstring": ["its_slices"] if zero2 else [],
        "held_grads": ["kept_slices" if zero2 else "held_params_grads"],
        "zero_kept": ["clear_kept"] if zero2 else [],
        # state_dict: the master copy saved beside the moments; ZeRO's DTensors resharded by DCP
        "state_dict_docstring": (["master_state_doc"] if master else []) + (["zero_state_doc"] if zero else []),
        "master_state": ["master_state"] if master else [],
        # make_optimizer over the Shards (which need the mesh, and under ZeRO without master copies may be
        # strided views: the foreach kernels) or over the parameters; AdamW's two groups (weight decay on
        # matrices only), of the leaves or the parameters
        "mesh_param": ["mesh_param"] if t.shards else [],
        "optimizer_kernel": (["shards_kernel"] + (["strided_kernel"] if t.zero_views else []))
        if t.shards
        else ["parameters_kernel"],
        "optimizer": [name if name in ("adamw", "adam") else "sgd"],
        "named_params": ["named_leaves" if t.shards else "named_parameters"],
        "stepped": ["shard_leaves" if t.shards else "model_parameters"],  # what Adam and SGD step on
        "shards_returned": ["shards_returned"] if t.shards else [],
    }


def config(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """config.py's slots (templates/torch/config_parts.py.j2): the constants only some programs have."""
    t, tr = ctx["torch"], ctx["training"]
    o = tr["optimizer"]["name"]
    return {
        # MESH: every axis (an expert, context or pipe axis: its rank order told, with what its peers share)
        # or the data x fsdp x tensor of the other meshes
        "mesh": ["mesh_every_axis" if t.mesh_every_axis else "mesh3"],
        "mesh_peers": (["expert_batch"] if t.expert > 1 else []) + (["context_peers"] if t.context else []),
        # TRANSPOSED: the nn.Linear weights kept as [out, in], or none
        "transposed": ["transposed" if t.transposed else "nothing_transposed"],
        # FSDP_DIMS where FSDP2 shards parameters
        "fsdp_dims": ["fsdp_dims"] if t.sharded else [],
        "buffers": ["buffers" if ctx["buffers"] else "no_buffers"],
        # tensor parallelism's plan, and the dropout layers of its sequence-parallel blocks
        "tp_plan": (["tp_plan"] + (["sequence_dropout"] if t.sequence_dropout else [])) if t.tp_plan else [],
        "input_layouts": ["input_layouts"] if t.input_layouts else [],
        # a spec's pipeline built for one stage: its micro-batches run as more accumulation steps
        "grad_accum": ["pipeline_grad_accum" if t.chunks > 1 else "grad_accum"],
        # the optimizer's and the schedule's own hyperparameters
        "optimizer_constants": {"adamw": ["betas", "weight_decay"], "adam": ["betas"]}.get(o, ["momentum"]),
        "min_lr_ratio": ["min_lr_ratio"] if tr["schedule"]["name"] == "cosine" else [],
        # TF32 matters only to float32 compute; the loss scale only to a spec that scales its loss
        "tf32": ["tf32"] if tr["precision"]["compute"] == "float32" else [],
        "loss_scale": ["loss_scale"] if tr["loss_scaling"] else [],
        "checkpoint": ["checkpoint" if tr["checkpoint"] else "no_checkpoint"],
        "master_weights": ["master_weights"] if t.master else [],
        # ZeRO's split dimensions (what stage 2 splits too: optimizer's `zero_split`, which config renders too)
        "zero": ["zero"] if t.zero else [],
        # expert parallelism's layouts (the experts' hidden features over `tensor` too, with tp_experts)
        "expert_layouts": ["expert_layouts"] if t.ep else [],
        "expert_features": ["features_over_tensor"] if t.tp_experts else [],
        # the pipeline's constants (its virtual stages told when a pipe rank holds several)
        "pipeline": ["pipeline"] if t.pipeline else [],
        "virtual_stages": ["virtual_stages"] if t.pipeline and t.pipeline["virtual"] > 1 else [],
    }


def _data_parallelism(t: Any) -> str:
    """The README's words on the data parallelism (torch.dp, its mesh and ZeRO stage decide them)."""
    if t.dp == "ddp":
        return "ddp"
    if t.dp == "hsdp":
        return "hsdp_replicated" if t.mesh3["fsdp"] == 1 else "hsdp"
    if t.dp == "fsdp":
        if t.mesh3["fsdp"] == 1 and t.ep:
            return "fsdp_replicated_experts"
        return "fsdp_over_data" if t.shard_axis == "data" else "fsdp"
    return {"zero2": "zero2", "zero1": "zero1_all_reduce"}.get(t.dp, "no_data_parallelism")


def readme(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """README.md's slots (templates/torch/readme_parts.md.j2)."""
    t, ev, data, s = ctx["torch"], ctx["eval"], ctx["data"], ctx["sampling"]
    if not t.ep:
        experts = "experts_over_expert"
    else:
        experts = "experts_each_rank" if len(t.expert_group) > 1 else "experts_over_group"
    kinds = {"arrays": "data_arrays", "text": "data_text", "tokens": "data_tokens"}
    return {
        # the parallelism row: a pipeline's stages first, then the data parallelism, ZeRO-1's split state,
        # master weights, tensor parallelism (sequence parallel too) and the experts' split
        "parallelism": (["pipeline_stages"] if t.pipeline else [])
        + [_data_parallelism(t)]
        + (["zero1"] if t.zero == 1 else [])
        + (["master_weights"] if t.master else [])
        + ((["sequence_parallel"] if t.sp_repeats else ["tensor_parallel"]) if t.tp_plan else [])
        + ([experts] if t.expert > 1 else []),
        "batch_pipeline": ["pipeline_microbatches"] if ctx["pipeline"] else [],
        "precision_float8": ["float8"] if ctx["training"]["precision"]["float8"] else [],
        # Run: torchrun and the launcher on a mesh of several ranks (--profile through the launcher but for a
        # pipeline), else plain python; --dry-run lays out every rank's shards on such a mesh
        "run": (["run_distributed"] + ([] if t.pipeline else ["run_profile"]))
        if ctx["mesh"]["devices"] > 1
        else ["run_single"],
        "dry_run_sentence": ["dry_run_shards"] if ctx["mesh"]["devices"] > 1 else [],
        # the metrics of a model with a sequence (tokens/s) and of a spec that evaluates (its accuracy for a
        # loss over classes)
        "metrics_fields": (["tokens_per_s"] if ctx["seq_len"] else [])
        + ((["val_loss_field"] + (["val_accuracy_field"] if ev["accuracy"] else [])) if ev else []),
        "tensorboard_scalars": ["val_loss_scalar"] if ev else [],
        "hf_flags": ["hf_flags"] if ctx["hf"] else [],
        # --data: what the data kind reads (its default path), and the evaluation's held-out part of it
        "data_flag": [kinds.get(data["kind"], "data_synthetic")]
        + (["data_default"] if data["kind"] != "synthetic" else [])
        + (["eval_held_out"] if ev and ev["split"] else []),
        # --eval-only: on the eval file, held-out samples or drawn ones; every N steps in training
        "eval_only": ["eval_only"] if ev else [],
        "eval_samples": ["eval_file" if ev["path"] else "held_out_samples" if ev["split"] else "drawn_samples"]
        if ev
        else [],
        "eval_every": ["every_steps"] if ev and ev["every"] else [],
        "seed_eval": ["eval_seed"] if ev and data["kind"] == "synthetic" else [],
        "memory_pipeline": ["fullest_pipe_rank"] if t.pipeline else [],
        # the Sampling section of a language model (generate.py): split decode over `tensor`, the spec's
        # tokenizer, --check through the pipeline's stages or train.py's forward pass
        "sampling": ["sampling_section"] if s else [],
        "sampling_tensor": ["tensor_split_decode"] if s and s["tensor"] > 1 else [],
        "sampling_tokenizer": ["default_tokenizer"] if s and s["tokenizer"] else [],
        "sampling_check": ["check_stages" if t.pipeline else "check_forward"],
        # the Sampling commands run under torchrun on a mesh of several ranks
        "launcher": ["torchrun" if t.distributed else "python"],
    }


def memory(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """memory.py's slots (templates/torch/memory_parts.py.j2): dry_run."""
    t = ctx["torch"]
    return {
        # a pipeline's dry run takes the pipe ranks of every parameter (`pipe_of`), tells so, and counts on each
        # rank only what its stages own
        "dry_run_params": ["pipe_of_param"] if t.pipeline else [],
        "dry_run_docstring": ["pipe_of_doc"] if t.pipeline else [],
        "rank_owner": ["pipe_owner"] if t.pipeline else [],
        # on a mesh of several ranks one process stands in for every rank
        "dry_run_mesh": ["fake_group_sentence"] if t.distributed else [],
        # rank_bytes' optional arguments: the owner of a pipeline's parameters, the buffers split over the
        # tensor-parallel channels, and with Shards the optimizer state's element bytes (+ 4: the float32
        # master copy), ZeRO's split dimensions and ZeRO-2's split gradients
        "rank_bytes_args": (["owns_mine"] if t.pipeline else [])
        + (["split_buffers"] if t.tp_channels else [])
        + (
            (
                ["master_state_element" if t.master else "state_element"]
                + (["zero_dims"] if t.zero else [])
                + (["split_grads"] if t.zero >= 2 else [])
            )
            if t.shards
            else []
        ),
    }


def loss_scale(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """loss_scale.py's slots (templates/torch/loss_scale_parts.py.j2): the LossScaler of a float16 build."""
    t, ls = ctx["torch"], ctx["training"]["loss_scaling"]
    dynamic = bool(ls and ls["dynamic"])
    return {
        # a dynamic scale grows after a run of finite steps and backs off after a skipped one; a fixed one
        # only counts the skipped steps
        "good_steps_comment": ["since_scale_changed"] if dynamic else [],
        "scale_update": ["dynamic_update" if dynamic else "fixed_update"],
        # the skip decision taken over every rank
        "finite_where": ["on_every_rank"] if t.distributed else [],
        "found_inf_reduced": ["all_reduce_found_inf"] if t.distributed else [],
    }


def data(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """data.py's slots (templates/torch/data_parts.py.j2)."""
    t = ctx["torch"]
    # 16-bit parameters without autocast: the float inputs (not the loss targets) cast to the compute dtype
    cast = ctx["training"]["precision"]["params"] != "float32" and not t.mixed
    return {
        "to_tensors_docstring": ["compute_dtype_inputs"] if cast else [],
        # each input made a tensor: cast as above, and cut to this rank's places of the sequence (context)
        "to_tensor": (["cast_to_compute"] if cast else []) + (["context_places"] if t.context else []),
        # inputs laid out otherwise than by rows of the batch (sharding.inputs): read as laid out, relaid out
        "input_layouts_reading": ["read_batch_relayout"] if t.input_layouts else [],
    }


def communication(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """communication.py's slots (templates/torch/communication_parts.py.j2): DDP's gradient compression hook,
    PowerSGD's or a cast to 16 bits (bf16's under its own name: DDP refuses bf16_compress_hook without CUDA)."""
    hook = ctx["torch"].comm.get("hook")
    cast = ["cast_compression", "bf16_hook" if hook == "bf16" else "register_compress_hook"]
    return {"compress_hook": ["powersgd_hook"] if hook == "powersgd" else cast if hook else []}


def context(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """context.py's slots (templates/torch/context_parts.py.j2): the gathers of the whole sequence the model's
    layers call (torch.helpers: batch_norm's statistics over every place, a moe layer's tokens in order)."""
    helpers = ctx["torch"].helpers
    return {"sequence_gathers": [h for h in ("gather_places", "gather_sequence") if h in helpers]}


def launch(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """launch.sh's slots (templates/torch/launch_parts.sh.j2)."""
    # communication.algorithm: NCCL_ALGO exported for the ranks
    return {"nccl_algo": ["nccl_algo"] if ctx["torch"].comm.get("nccl_algo") else []}


def parts(ctx: dict[str, Any]) -> dict[str, list[str]]:
    return {
        **generate(ctx),
        **optimizer(ctx),
        **config(ctx),
        **readme(ctx),
        **memory(ctx),
        **loss_scale(ctx),
        **data(ctx),
        **communication(ctx),
        **context(ctx),
        **launch(ctx),
    }
