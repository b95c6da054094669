"""The MLX target (templates/mlx): Apple's array framework, one process per device. Data parallelism over
processes with `mx.distributed` (gradients averaged by `mlx.nn.average_gradients`), launched by
`mlx.launch`; mlx.optimizers, safetensors checkpoints. On Linux the CPU build (`mlx[cpu]`) runs the
same programs, which is how the tests run them."""

from __future__ import annotations

from ..ops import OPS
from .base import Capabilities, Target

# mx.distributed's ring backend (the one every MLX install has) cannot split its group into sub-groups, so
# a program has one communicator: every process is a data-parallel replica.
_ONE_GROUP = "MLX's distributed backends give a program one process group (the ring backend cannot split it)"

_REASONS = (
    ("fsdp", "MLX has no fully sharded data parallelism that keeps parameters sharded between steps"),
    ("tensor", _ONE_GROUP + ", and tensor parallelism is not in the mlx target yet"),
    ("pipe", "MLX has no pipeline schedules (no point-to-point autograd between processes)"),
    ("expert", _ONE_GROUP + ", and expert parallelism needs an all-to-all MLX does not have"),
    ("pipeline", "MLX has no pipeline schedules (no point-to-point autograd between processes)"),
    ("zero", "the mlx target keeps the optimizer state whole on every process"),
    ("master_weights", "the mlx target stores parameters in float32"),
    ("remat", "mx.checkpoint recomputes a whole block (no policy keeps the matmuls)"),
    ("float16", "the mlx target computes in float32 or bfloat16 (no loss scaling for float16)"),
    ("bfloat16", "the mlx target stores parameters in float32"),
    ("moe", "the mixture-of-experts operator is not in the mlx target yet"),
)


class MlxTarget(Target):
    name = "mlx"
    title = "MLX"
    capabilities = Capabilities(
        mesh_axes=("data",),
        zero_stages=(0,),
        master_weights=False,
        pipeline_schedules=(),
        explicit_stages=False,
        zero_with_pipeline=False,
        compute_dtypes=("float32", "bfloat16"),
        param_dtypes=("float32",),
        global_batch_statistics=False,
        ops=frozenset(k for k in OPS if not OPS[k].expert_dims),
        launchers=("launch.sh (mlx.launch: processes on one machine, or --hosts for several)",),
        reasons=_REASONS,
        remat=("none", "full"),
        default=False,
    )
    files = (("mlx/train.py.j2", "train.py"), ("mlx/launch.sh.j2", "launch.sh"), ("mlx/README.md.j2", "README.md"))
    adapter = "mlx_target"
    imports = "numpy, mlx"
    limits = (
        "Opt-in: a spec without `targets:` is checked for the default targets (jax, torch) only; list `mlx` "
        "to have `validate` check it too (`build --target mlx` always does).",
        "One process per device; every process holds the whole model and optimizer state (data parallelism).",
    )
