"""The MLX target (templates/mlx): Apple's array framework, one process per device. Data parallelism over
processes with `mx.distributed` (gradients averaged by `mlx.nn.average_gradients`), launched by
`mlx.launch`; mlx.optimizers, safetensors checkpoints. On Linux the CPU build (`mlx[cpu]`) runs the
same programs, which is how the tests run them."""

from __future__ import annotations

from .base import Capabilities, Target

# mx.distributed's ring backend (the one every MLX install has) cannot split its group into sub-groups, so
# a program has one communicator: every process is a data-parallel replica.
_ONE_GROUP = "MLX's distributed backends give a program one process group (the ring backend cannot split it)"

_REASONS = (
    ("compression", "mlx.nn.average_gradients reduces the gradients in their own dtype"),
    ("algorithm", "MLX's distributed backends (ring, MPI) choose their own algorithms"),
    ("bucket_mb", "mlx.nn.average_gradients groups the gradients itself"),
    ("overlap", "the mlx program averages the gradients after the backward pass (no overlap switch)"),
    ("prefetch", "MLX has no fully sharded data parallelism"),
    ("fsdp", "MLX has no fully sharded data parallelism that keeps parameters sharded between steps"),
    ("pipe", "MLX has no pipeline schedules (no point-to-point autograd between processes)"),
    ("expert", _ONE_GROUP + ", and expert parallelism needs an all-to-all MLX does not have"),
    ("pipeline", "MLX has no pipeline schedules (no point-to-point autograd between processes)"),
    ("zero", "the mlx target keeps the optimizer state whole on every process"),
    ("master_weights", "the mlx target stores parameters in float32"),
    ("remat", "mx.checkpoint recomputes a whole block (no policy keeps the matmuls)"),
    ("float16", "the mlx target computes in float32 or bfloat16 (no loss scaling for float16)"),
    ("bfloat16", "the mlx target stores parameters in float32"),
    ("data_param_layouts", "over `data` every mlx process holds the whole model"),
    ("input_layouts", "the mlx target gives each process whole samples: its rows of the batch"),
    ("context", _ONE_GROUP + ", and ring attention needs point-to-point autograd between processes"),
    ("offload", "MLX has no hooks on the tensors saved for the backward pass (and Apple silicon's memory is "
     "one, shared by host and device)"),
)


class MlxTarget(Target):
    name = "mlx"
    title = "MLX"
    capabilities = Capabilities(
        mesh_axes=("data", "tensor"),
        zero_stages=(0,),
        master_weights=False,
        pipeline_schedules=(),
        explicit_stages=False,
        zero_with_pipeline=False,
        compute_dtypes=("float32", "bfloat16"),
        param_dtypes=("float32",),
        global_batch_statistics=False,
        data_param_layouts=False,
        input_layouts=False,
        ops=None,
        launchers=("launch.sh (mlx.launch: processes on one machine, or one per host with MLX_HOSTS)",
                   "launch.sbatch (SLURM, one node)"),
        reasons=_REASONS,
        remat=("none", "full"),
        default=False,
        # templates/mlx/generate.py.j2; a build over `tensor` leaves it out (lowering/mlx.py left_out)
        sampling="meshes without `tensor`, in one process: the forward pass over the tokens so far at each "
        "position (no key/value cache)",
    )
    files = (("mlx/train.py.j2", "train.py"), ("mlx/launch.sh.j2", "launch.sh"), ("mlx/launch.sbatch.j2", "launch.sbatch"),
             ("mlx/README.md.j2", "README.md"), ("mlx/generate.py.j2", "generate.py"))
    conditional_files = (("generate.py", "language_model"),)  # sampling from a language model
    imports = "numpy, mlx"
    limits = (
        "Tensor parallelism (Megatron's: a column-parallel linear, element-wise layers, a row-parallel linear; "
        "attention and mlp with their heads or hidden features split) on a mesh of `tensor` alone: "
        + _ONE_GROUP + ", so `tensor` does not combine with `data`; no dropout layers above rate 0 (attention "
        "dropout is fine: each process keeps its heads' mask) and no sequence split over `tensor` in such a build.",
        "Opt-in: a spec without `targets:` is checked for the default targets (jax, torch) only; list `mlx` "
        "to have `validate` check it too (`build --target mlx` always does).",
        "One process per device; over `data` every process holds the whole model and optimizer state.",
        "Mixture of experts (`moe`): capped and dropless routing (dropless as grouped matmuls, `mx.gather_mm`), "
        "swiglu and shared experts, the router z-loss; each process runs the whole layer (over `data`), not over "
        "`expert` (no all-to-all) nor with the experts split over `tensor`.",
    )
