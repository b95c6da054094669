"""The `communication` section as the templates use it (spec/communication.py; what each target refuses is
E049 at validate time, lowering/communication.py): `comm` in the torch and jax contexts."""

from __future__ import annotations

from typing import Any

from ..planner.plan import Plan

NCCL_ALGO = {"ring": "Ring", "tree": "Tree"}  # communication.algorithm -> NCCL_ALGO (auto: NCCL's tuner)
MIB = 1 << 20


def torch_comm(plan: Plan) -> dict[str, Any]:
    """hook: the DDP communication hook (fp16 / bf16 / powersgd; None: DDP's plain all-reduce); reduce_dtype:
    FSDP2's reduce dtype under cast compression; bucket_mb (DDP's bucket_cap_mb), prefetch (FSDP2 blocks
    all-gathered ahead), nccl_algo (launch.sh's NCCL_ALGO): None where the framework's default runs."""
    comm = plan.spec.communication
    ps = comm.powersgd
    return {
        "hook": comm.compression_name if comm.compression_name != "none" else None,
        "dtype": comm.cast_dtype,
        "rank": ps.rank if ps else None,
        "start_step": ps.start_step if ps else None,
        "bucket_mb": comm.bucket_mb,
        "prefetch": comm.prefetch,
        "nccl_algo": NCCL_ALGO.get(comm.algorithm),
    }


def jax_comm(plan: Plan) -> dict[str, Any]:
    """xla_flags: the XLA flags the program adds before the backend starts (collective combining up to
    `bucket_mb`, the latency-hiding scheduler for `overlap`); nccl_algo: NCCL_ALGO for XLA's NCCL
    collectives. XLA:CPU ignores both (they steer XLA's GPU compiler and NCCL). compress: the dtype the
    replicas' gradients are reduced in (fp16 / bf16 compression over data-parallel ranks; None: XLA's own
    reduction, uncompressed); powersgd: its rank and start step (None: not PowerSGD)."""
    comm = plan.spec.communication
    flags = []
    if comm.bucket_mb is not None:
        threshold = int(comm.bucket_mb * MIB)
        flags += [f"--xla_gpu_{kind}_combine_threshold_bytes={threshold}"
                  for kind in ("all_reduce", "all_gather", "reduce_scatter")]
    if comm.overlap is not None:
        flags.append(f"--xla_gpu_enable_latency_hiding_scheduler={str(comm.overlap).lower()}")
    replicas = plan.dp_degree > 1
    compress = comm.cast_dtype if replicas else None
    ps = comm.powersgd if replicas else None
    return {"xla_flags": flags, "nccl_algo": NCCL_ALGO.get(comm.algorithm), "compress": compress,
            "powersgd": {"rank": ps.rank, "start_step": ps.start_step} if ps else None,
            # the replicas' gradients computed under a shard_map over `data` and reduced by the program
            "replicas": bool(compress or ps)}
