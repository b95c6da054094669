"""E049 for the `communication` settings (spec/communication.py) a target, or one build of it, cannot
realise: each setting either runs as the plan costs it, or validate says why not. A setting with nothing
to act on in a build (compression or a bucket size without data-parallel ranks, prefetch without an fsdp
axis, an algorithm on one device) changes nothing there, and is accepted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import codes
from ..diagnostics import Diagnostic

if TYPE_CHECKING:
    from ..planner.plan import Plan
    from ..source import Document
    from ..targets.base import Target

SECTION = "communication"


def communication_errors(target: Target, plan: Plan, doc: Document) -> list[Diagnostic]:
    """What the target's capabilities (compression, collective_algorithms, bucket_size, overlap,
    fsdp_prefetch) do not cover."""
    comm, cap = plan.spec.communication, target.capabilities
    out: list[Diagnostic] = []

    def refuse(field: str, what: str, help: str) -> None:
        out.append(Diagnostic(codes.E049, f"the {target.name} target does not support {what}",
                              doc.pos((SECTION, field)), help=cap.reason(field, help)))

    kind = comm.compression_name
    replicas = plan.dp_degree > 1  # data-parallel ranks: gradients to reduce
    if replicas and kind not in cap.compression:
        refuse("compression", f"`{kind}` gradient compression", f"supported: {', '.join(cap.compression)}")
    if plan.mesh.devices > 1 and comm.algorithm not in cap.collective_algorithms:
        refuse("algorithm", f"choosing the collective algorithm (`{comm.algorithm}`)", "leave `algorithm` out")
    if replicas and comm.bucket_mb is not None and not cap.bucket_size:
        refuse("bucket_mb", "`bucket_mb`", "leave `bucket_mb` out")
    if replicas and comm.overlap is not None and comm.overlap not in cap.overlap:
        refuse("overlap", f"`overlap: {str(comm.overlap).lower()}`", "leave `overlap` out")
    if plan.mesh.fsdp_enabled and comm.prefetch is not None and not cap.fsdp_prefetch:
        refuse("prefetch", "`prefetch`", "leave `prefetch` out")
    return out


def torch_communication_errors(plan: Plan, doc: Document, dp: str, axis: str = "fsdp") -> list[Diagnostic]:
    """The settings one torch build cannot realise, by how it replicates over the batch axes (`dp`:
    targets/torch.py data_parallel; `axis`: the one FSDP2 shards over, shard_axis): compression is a DDP
    communication hook or FSDP2's reduce dtype, `bucket_mb` DDP's bucket_cap_mb, `prefetch` FSDP2's explicit
    prefetching of the repeated blocks."""
    comm = plan.spec.communication
    out: list[Diagnostic] = []

    def refuse(field: str, msg: str, help: str) -> None:
        out.append(Diagnostic(codes.E049, f"the torch target cannot run {msg}", doc.pos((SECTION, field)), help=help))

    kind = comm.compression_name
    fsdp = dp in ("fsdp", "hsdp")
    if kind != "none":
        if dp == "zero2":
            refuse("compression", f"`{kind}` compression with `training.zero: 2`",
                   "ZeRO-2 reduce-scatters the gradients itself, with no communication hook to compress them; use "
                   "`training.zero: 0` or 1 (DDP)")
        elif dp == "zero1":
            refuse("compression", f"`{kind}` compression with `training.zero: 1` in a pipeline",
                   "the pipelined ZeRO program all-reduces the gradients itself, with no communication hook to "
                   "compress them; use `training.zero: 0`")
        elif plan.mesh.expert_enabled:
            refuse("compression", f"`{kind}` compression with an `expert` axis",
                   "the experts' gradients are reduced apart from DDP's (reduce_expert_grads), uncompressed; "
                   "leave `compression` out")
        elif fsdp and comm.powersgd is not None:
            refuse("compression", "PowerSGD compression in an FSDP2 build",
                   "PowerSGD is a DDP communication hook; FSDP2 reduce-scatters whole gradients (it can only "
                   "change their dtype): use `fp16` or `bf16`, or a mesh of `data` alone (DDP)")
        elif fsdp and plan.mesh.size(axis) > 1 and any(
                pp.param.trainable and not any(axis in d for d in pp.spec) for pp in plan.params):
            whole = next(pp.name for pp in plan.params if pp.param.trainable and not any(axis in d for d in pp.spec))
            refuse("compression", f"`{kind}` compression with `{whole}` whole over {axis}",
                   f"the parameters FSDP2 does not shard over {axis} are reduced apart from it "
                   f"(reduce_whole_grads), uncompressed; " + ("make every parameter divisible over fsdp"
                   if axis == "fsdp" else "split every trainable parameter over `data`, or none"))
    if comm.bucket_mb is not None and dp not in ("ddp", "none"):
        refuse("bucket_mb", f"`bucket_mb` in a{'n FSDP2' if fsdp else ' ZeRO' if dp in ('zero1', 'zero2') else ' one-replica'} "
               "build", "`bucket_mb` sets DDP's bucket_cap_mb, and this build does not reduce with DDP (FSDP2 "
               "reduces each block's gradients together); leave it out")
    return out


# the mesh axes besides `data` under which the jax program cannot compress, and why
JAX_AXES_UNCOMPRESSED = {
    "fsdp": "the fsdp axis's reduce-scatter of the gradients is XLA's, in their own dtype; use a `data` axis "
            "for the replicas",
    "pipe": "the pipeline's shard_map over `pipe` computes the gradients; leave `compression` out",
    "context": "ring attention's shard_map over `context` cannot nest in the replicas' shard_map here; leave "
               "`compression` out",
    "expert": "the experts' all-to-all splits the batch over `expert`; leave `compression` out",
}


def jax_communication_errors(plan: Plan, doc: Document) -> list[Diagnostic]:
    """The builds in which the jax program cannot compress its gradients. It computes each data-parallel
    replica's gradients under a jax.shard_map manual over `data` and reduces them itself, in the compression
    dtype (templates/jax/train_step.py.j2); everything else about the step stays XLA's, so the replicas must
    compute exactly what the whole batch computes, split by samples, with `data` the only batch axis."""
    from ..ops import OPS

    comm = plan.spec.communication
    kind = comm.compression_name
    if kind == "none" or plan.dp_degree <= 1:
        return []
    out: list[Diagnostic] = []
    where = doc.pos((SECTION, "compression"))

    def refuse(what: str, help: str) -> None:
        out.append(Diagnostic(codes.E049, f"the jax target cannot run `{kind}` compression with {what}", where,
                              help=help))

    mesh = plan.mesh
    for axis, why in JAX_AXES_UNCOMPRESSED.items():
        if mesh.size(axis) > 1:
            refuse(f"an `{axis}` axis", why)
    split = next((pp.name for pp in plan.params if any("data" in d for d in pp.spec)), None)
    if split is not None:
        refuse(f"`{split}` split over `data`", "each replica holds every parameter whole; split parameters over "
               "`fsdp` or `tensor` instead")
    for ip in plan.inputs if mesh.data_enabled else ():
        if "data" not in ip.spec[0] or any("data" in d for d in ip.spec[1:]):
            refuse(f"input `{ip.input.name}` not split over `data` by its samples",
                   "each replica reads whole samples: leave the input's batch dimension to the `data` axis")
    if comm.powersgd is not None:
        tr = plan.spec.training
        if tr.zero:
            refuse(f"`training.zero: {tr.zero}`", "PowerSGD all-reduces its factors whole, where ZeRO reduce-scatters "
                   "the gradients; use `training.zero: 0`, or `fp16` / `bf16` compression")
        if tr.precision.loss_scaling():
            refuse("loss scaling", "the error feedback would carry gradients scaled by another step's loss scale; "
                   "use bfloat16 compute (no loss scaling) or `fp16` / `bf16` compression")
    seen = set()
    for n_ in plan.graph.nodes():
        op = OPS[n_.op]
        why = ("draws random numbers (a replica would draw its own samples' masks, not the whole batch's)"
               if op.is_random(n_.attrs) else "keeps batch statistics (a replica's would cover its samples only)"
               if n_.buffers else "balances its experts over the whole batch" if op.has_aux_loss else None)
        if why and n_.op not in seen:
            seen.add(n_.op)
            refuse(f"{n_.op} layer `{n_.name}`", f"it {why}; leave `compression` out")
    return out
