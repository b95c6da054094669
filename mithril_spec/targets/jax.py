"""The JAX target (templates/jax): jit with NamedSharding over every mesh axis, optax, orbax checkpoints,
and a shard_map pipeline of the copies of repeated blocks over `pipe` (the planner's even split, or
`stage:` / `device:` placement, uneven stages padded to the largest; stages of several blocks, each
block's copies stacked apart)."""

from __future__ import annotations

from .base import CONTEXT_LIMIT, MESH_AXES, Capabilities, Target


class JaxTarget(Target):
    name = "jax"
    title = "JAX"
    capabilities = Capabilities(
        mesh_axes=MESH_AXES,
        zero_stages=(0, 1, 2),
        master_weights=True,
        pipeline_schedules=("gpipe", "1f1b", "interleaved"),
        explicit_stages=True,
        # the pipelined train state's optimizer state (ZeRO-2: its gradients too) split over `data` like any
        # other: zero_layout (templates/jax/optimizer.py.j2) on a dimension of each stacked copy
        zero_with_pipeline=True,
        # forward only through the circular pipeline (templates/jax/pipeline.py.j2 pipeline_eval)
        eval_with_pipeline=True,
        tied_across_stages="yes (the layers outside the pipelined block hold their parameters on every pipe rank)",
        profile="yes (jax.profiler: one trace per process)",
        profiled_devices=("H200", "H100", "A100", "TPU v5", "cpu"),
        sampling="every mesh; a pipeline of one repeat's copies in stages of as many (not padded), through its stages",
        compute_dtypes=("float32", "bfloat16", "float16"),
        param_dtypes=("float32", "bfloat16", "float16"),
        launchers=("launch.sh (jax.distributed, one process per host)", "launch.sbatch (SLURM)"),
        pipeline_outside_everywhere=True,
        # the stages of an uneven `stage:` / `device:` placement are padded to the largest one's copies
        pipeline_pads_stages=True,
        # each micro-batch's key travels with it through the schedule, and each stage's load-balancing loss
        # (moe) joins the loss; batch_norm's running statistics move once per micro-batch, in their order (the
        # layers before and after the block run micro-batch after micro-batch) (templates/jax/pipeline.py.j2)
        pipelined_ops=frozenset({"dropout", "attention", "moe", "batch_norm"}),
        # NCCL_ALGO and XLA's combine thresholds and latency-hiding scheduler, set by the program
        collective_algorithms=("auto", "ring", "tree"),
        # the replicas' gradients reduced by the program in 16 bits (lowering/communication.py: which builds)
        compression=("none", "fp16", "bf16", "powersgd"),
        bucket_size=True,
        overlap=(True, False),
        reasons=(
            ("prefetch", "XLA's scheduler decides how far ahead the fsdp all-gathers run"),
            ("offload", "XLA's host offload of saved values did not lower the device's memory: measured on an "
             "H200 (jax 0.11.2), an offload policy on a 4-layer MLP raised the peak from 0.82 to 1.14 GB and "
             "moved 2.3x the planned bytes, and the CPU backend compiles the transfers away"),
        ),
    )
    files = (("jax/train.py.j2", "train.py"), ("jax/launch.sh.j2", "launch.sh"), ("jax/launch.sbatch.j2", "launch.sbatch"),
             ("jax/README.md.j2", "README.md"),
             ("jax/generate.py.j2", "generate.py"))
    conditional_files = (("generate.py", "language_model"),)  # sampling from a language model
    imports = "numpy, jax, optax, orbax-checkpoint"
    pipeline_limit_field = ("op",)
    limits = (
        "A pipeline runs the copies of repeated blocks over the `pipe` axis: the planner's even split, or "
        "`stage:` / `device:` placement of one repeat or of consecutive repeats (each reading the one before; "
        "no other layer between them), possibly uneven: every stage is padded to the largest stage's copies, "
        "which the plan counts. Consecutive repeats of several blocks (heterogeneous stages, such as moe on "
        "some stages only) stack each block's copies apart, every stage holding as many rows of each block as "
        "the stage with the most copies of it, and each pipe rank runs its own stage's copies (lax.switch); "
        "not with batch_norm in the pipelined blocks.",
        "The pipelined block takes one input; the layers after it (and the loss) read only its output, later "
        "layers and the model inputs, never the layers before it (those run apart, on every pipe rank).",
        CONTEXT_LIMIT,
    )
