"""Train gpt-tiny: a hand-written reference for the program mithril-spec's torch target emits.

Follows docs/program.md: command line, canonical parameter names and layouts, numpy
initialisation, data order and numerics. One file, no project imports, runs with

    python gpt_train.py                                     # 1 process
    torchrun --nproc-per-node 8 gpt_train.py --mesh data=2,fsdp=2,tensor=2

Parallelism (mesh axes in canonical order data, fsdp, tensor; a missing axis has size 1):
  data only            -> DistributedDataParallel
  fsdp (+ data)        -> FSDP2 fully_shard over fsdp; with data too, HSDP on the 2-D (data, fsdp) mesh
  tensor               -> parallelize_module on every Decoder (q,k,v,fc colwise; o,proj rowwise),
                          then FSDP2/HSDP over the remaining data axes (data + tensor alone is HSDP
                          with an fsdp axis of size 1, i.e. pure replication, so that DTensor params
                          keep working with DCP and export)

Besides the flags of docs/program.md it takes overrides of the spec for experiments: --mesh,
--grad-accum, --compute bfloat16, --activation-checkpointing, --compile, --checkpoint-every, and
--memory-report FILE (measured per-rank bytes after the first step).
"""

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import sys
import time
import warnings
import zlib
from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# Configuration (the compiler writes these from the spec)

MODEL = dict(vocab=256, seq=64, d=128, heads=4, ff=512, layers=4, ln_eps=1e-5)
INIT_STD = 0.02  # normal init for linear / embedding weights
# model inputs in spec order: name, shape without batch, dtype, high (for synthetic integers)
INPUTS = [("tokens", (64,), "int64", 256), ("targets", (64,), "int64", 256)]
TRAIN = dict(global_batch=16, steps=20, grad_accum=1, seed=0)
OPTIM = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
SCHEDULE = dict(warmup=5, min_lr_ratio=0.0)  # cosine
CLIP_NORM = 1.0
PRECISION = dict(params="float32", compute="float32")
ACTIVATION_CHECKPOINTING = False
COMPILE = False
MESH = dict(data=1, fsdp=1, tensor=1)
CHECKPOINT_EVERY = 0  # 0: only at the end (when --checkpoint-dir is given)

MESH_AXES = ("data", "fsdp", "tensor")  # canonical order
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# -----------------------------------------------------------------------------
# Model


class PosEmbedding(nn.Module):
    """Learned position embedding, added to its input (canonical weight [max_len, dim])."""

    def __init__(self, max_len, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, dim))

    def forward(self, x):
        return x + self.weight[: x.shape[1]]


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.head_dim = d // heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        # -1 heads, not `heads`: under tensor parallelism q/k/v are column-sharded and each
        # rank holds heads/tp whole heads, so the local head count follows from the width.
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.o(y)  # row-sharded under TP: the all-reduce happens here


class MLP(nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.fc = nn.Linear(d, ff)
        self.proj = nn.Linear(ff, d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Decoder(nn.Module):
    def __init__(self, d, heads, ff, eps):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, eps=eps)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d, eps=eps)
        self.mlp = MLP(d, ff)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))  # res1
        x = x + self.mlp(self.ln2(x))  # res2
        return x


class GPT(nn.Module):
    def __init__(self, vocab, seq, d, heads, ff, layers, ln_eps):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = PosEmbedding(seq, d)
        self.blocks = nn.ModuleList(Decoder(d, heads, ff, ln_eps) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=ln_eps)
        self.activation_checkpointing = False

    def forward(self, tokens, targets):
        x = self.wpe(self.wte(tokens))
        for block in self.blocks:
            if self.activation_checkpointing:
                # checkpoint the call, not a wrapper module, so parameter names stay canonical
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.t()  # lm_head tied to wte: no parameter of its own
        # loss in float32 whatever the compute dtype
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


# -----------------------------------------------------------------------------
# Canonical parameters: names are the module FQNs; layouts differ only for nn.Linear weights


def param_plan(model):
    """name -> (canonical shape, init, transpose) for every parameter, in named_parameters order."""
    plan = {}
    for mod_name, mod in model.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            shape = tuple(p.shape)
            if isinstance(mod, nn.Linear) and p_name == "weight":
                plan[name] = (shape[::-1], "normal", True)  # torch [out, in] <-> canonical [in, out]
            elif isinstance(mod, (nn.Embedding, PosEmbedding)):
                plan[name] = (shape, "normal", False)
            elif isinstance(mod, nn.LayerNorm) and p_name == "weight":
                plan[name] = (shape, "ones", False)
            else:  # biases
                plan[name] = (shape, "zeros", False)
    order = [n for n, _ in model.named_parameters()]
    return {n: plan[n] for n in order}


def init_canonical(plan, seed):
    """The numpy rule of docs/program.md: values depend only on (seed, name), never on the mesh."""
    out = {}
    for name, (shape, init, _) in plan.items():
        if init == "normal":
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            out[name] = (rng.standard_normal(shape, dtype=np.float32) * INIT_STD).astype(np.float32)
        elif init == "ones":
            out[name] = np.ones(shape, np.float32)
        else:
            out[name] = np.zeros(shape, np.float32)
    return out


@torch.no_grad()
def load_canonical(model, plan, arrays):
    """Copy canonical arrays into the (still unsharded) model."""
    missing = [n for n in plan if n not in arrays]
    if missing:
        raise SystemExit(f"init params: missing {missing}")
    for name, p in model.named_parameters():
        shape, _, transpose = plan[name]
        a = np.asarray(arrays[name], dtype=np.float32)
        if tuple(a.shape) != shape:
            raise SystemExit(f"init params: {name} has shape {a.shape}, expected {shape}")
        t = torch.from_numpy(a.T.copy() if transpose else a)
        p.copy_(t.to(p.dtype))


@torch.no_grad()
def gather_canonical(model, plan):
    """Full canonical arrays of every parameter. Collective: every rank must call it."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        a = t.float().cpu().numpy()
        out[name] = np.ascontiguousarray(a.T if plan[name][2] else a)
    return out


# -----------------------------------------------------------------------------
# Data: samples by global index, so every mesh sees the same batches


class Data:
    def __init__(self, path, seed):
        self.seed = seed + 1  # data_seed
        self.arrays = None
        if path:
            self.arrays = {}
            for name, shape, _, _ in INPUTS:
                a = np.load(os.path.join(path, name + ".npy"), mmap_mode="r")  # read rows on demand
                if tuple(a.shape[1:]) != shape:
                    raise SystemExit(f"{path}/{name}.npy: rows of shape {a.shape[1:]}, expected {shape}")
                self.arrays[name] = a

    def get(self, start, count):
        """Samples start .. start+count-1, one array per input, in spec order."""
        idx = np.arange(start, start + count)
        if self.arrays is not None:
            return [np.asarray(self.arrays[n][idx % len(self.arrays[n])]).astype(dt) for n, _, dt, _ in INPUTS]
        cols = [[] for _ in INPUTS]
        for i in idx:
            rng = np.random.default_rng([self.seed, int(i)])
            for j, (_, shape, dt, high) in enumerate(INPUTS):
                if dt.startswith("int"):
                    cols[j].append(rng.integers(0, high, size=shape, dtype=np.int64).astype(dt))
                else:
                    cols[j].append(rng.standard_normal(shape, dtype=np.float32))
        return [np.stack(c) for c in cols]


# -----------------------------------------------------------------------------
# Optimizer pieces


def lr_factor(t):
    """Cosine with linear warmup, as a multiple of the peak lr (0-based step t)."""
    W, T, m = SCHEDULE["warmup"], TRAIN["steps"], SCHEDULE["min_lr_ratio"]
    if t < W:
        return (t + 1) / W
    return m + (1 - m) * 0.5 * (1 + math.cos(math.pi * (t - W) / max(1, T - W)))


@torch.no_grad()
def clip_grad_norm(params, max_norm):
    """Global L2 norm over all gradients, then scale by min(1, max_norm / (norm + 1e-6)).

    With tensor parallelism + FSDP the gradients are DTensors on *different* meshes (2-D for
    TP-sharded weights, 1-D fsdp for the rest, or plain tensors). torch's clip_grad_norm_ stacks
    all per-tensor norms and fails on mixed meshes, so reduce each mesh group to a full scalar
    first (full_tensor() does the cross-rank sum of the Partial norm) and combine plain scalars.
    """
    from torch.distributed.tensor import DTensor

    groups = defaultdict(list)
    for p in params:
        if p.grad is not None:
            groups[p.grad.device_mesh if isinstance(p.grad, DTensor) else None].append(p.grad)
    sq = []
    for grads in groups.values():  # fixed order: dicts keep insertion order, the same on every rank
        n = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(n, DTensor):
            # a norm Partial over 2 mesh dims becomes 2 scalar all-reduces; DTensor logs a perf
            # warning about it (silenced in main): negligible for one scalar per step
            n = n.full_tensor()
        sq.append(n.float() ** 2)
    total = torch.stack(sq).sum().sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


# -----------------------------------------------------------------------------
# Distributed setup


def parse_mesh(text):
    sizes = dict(MESH)
    if text:
        for part in text.split(","):
            k, _, v = part.partition("=")
            if k not in MESH_AXES:
                raise SystemExit(f"--mesh: unknown axis {k!r} (axes: {', '.join(MESH_AXES)})")
            sizes[k] = int(v)
    return sizes


def setup_parallel(model, sizes, device, compute_dtype):
    """Apply TP / FSDP2 / HSDP / DDP. Returns (model to call, device mesh or None, description)."""
    from torch.distributed.device_mesh import init_device_mesh

    D, Fs, Tp = sizes["data"], sizes["fsdp"], sizes["tensor"]
    mesh = init_device_mesh(device.type, (D, Fs, Tp), mesh_dim_names=MESH_AXES)
    fsdp_mp = None
    if Tp > 1:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        if MODEL["heads"] % Tp or MODEL["ff"] % Tp:
            raise SystemExit(f"tensor={Tp} must divide heads={MODEL['heads']} and ff={MODEL['ff']}")
        plan = {
            "attn.q": ColwiseParallel(),
            "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(),
            "mlp.fc": ColwiseParallel(),
            "mlp.proj": RowwiseParallel(),
        }
        for block in model.blocks:
            parallelize_module(block, mesh["tensor"], plan)
    if Fs > 1 or (Tp > 1 and D > 1):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # HSDP when data > 1: dim 0 of the 2-D mesh replicates, dim 1 shards
        dp_mesh = mesh["data", "fsdp"] if D > 1 else mesh["fsdp"]
        mp = MixedPrecisionPolicy()
        if compute_dtype != torch.float32:
            # cast params to the compute dtype for forward/backward, reduce gradients in fp32
            mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
            fsdp_mp = compute_dtype
        for block in model.blocks:  # one all-gather / reduce-scatter group per block
            fully_shard(block, mesh=dp_mesh, mp_policy=mp)
        fully_shard(model, mesh=dp_mesh, mp_policy=mp)  # root: wte, wpe, ln_f
        kind = "hsdp" if D > 1 else "fsdp"
        return model, mesh, kind + ("+tp" if Tp > 1 else ""), fsdp_mp
    if D > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        # process_group rather than device_mesh=mesh["data"]: a sliced mesh makes DDP run its
        # TP workaround (_pre_dp_module_transform), which we do not want here
        # gradient_as_bucket_view: grads live in the all-reduce buckets, not in a second copy
        ddp = DDP(model, process_group=mesh.get_group("data"), gradient_as_bucket_view=True)
        return ddp, mesh, "ddp", None
    return model, mesh, "tp" if Tp > 1 else "none", None


def describe_params(model, plan, replicated_label="whole", optimizer_states=2):
    """Rows for --dry-run, and this rank's bytes of params, grads and optimizer state."""
    from torch.distributed.tensor import DTensor

    rows, p_bytes = [], 0
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        placements = (
            f"{tuple(p.device_mesh.mesh_dim_names)}: {', '.join(str(pl) for pl in p.placements)}"
            if isinstance(p, DTensor)
            else replicated_label
        )
        rows.append((name, plan[name][0], tuple(p.shape), placements, tuple(local.shape)))
        p_bytes += local.numel() * local.element_size()
    n_params = len(rows)
    # AdamW keeps exp_avg and exp_avg_sq like the local param, plus a float32 step per param
    return rows, dict(params=p_bytes, grads=p_bytes, optimizer=optimizer_states * p_bytes + 4 * n_params)


def write_memory_report(path, model, optimizer, distributed, world, master):
    """Measured bytes this rank holds for params, grads and optimizer state (local shards)."""
    from torch.distributed.tensor import DTensor

    def nbytes(t):
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = list(model.parameters())
    mine = dict(
        params=sum(nbytes(p) for p in params),
        grads=sum(nbytes(p.grad) for p in params if p.grad is not None),
        optimizer=sum(nbytes(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)),
    )
    every = [None] * world
    if distributed:
        dist.all_gather_object(every, mine)
    else:
        every = [mine]
    if master:
        with open(path, "w") as f:
            json.dump(every, f)


# -----------------------------------------------------------------------------
# Checkpoints: torch.distributed.checkpoint, resharding on load


def save_checkpoint(root, step, model, optimizer, scheduler, distributed, rank):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = os.path.join(root, f"step_{step:08d}")
    tmp = os.path.join(root, f".tmp_step_{step:08d}")
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if distributed:
        dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp, no_dist=not distributed)
    if rank == 0:
        with open(os.path.join(tmp, "train_state.json"), "w") as f:
            json.dump({"step": step, "scheduler": scheduler.state_dict()}, f)
    if distributed:
        dist.barrier()  # every rank has written its shards
    if rank == 0:  # a checkpoint directory exists only once it is complete
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    if distributed:
        dist.barrier()


def find_checkpoint(path):
    """DIR is either one checkpoint or a --checkpoint-dir holding step_* checkpoints (take the last)."""
    if os.path.exists(os.path.join(path, "train_state.json")):
        return path
    steps = sorted(d for d in os.listdir(path) if d.startswith("step_"))
    if not steps:
        raise SystemExit(f"--resume {path}: no checkpoint found")
    return os.path.join(path, steps[-1])


def load_checkpoint(path, model, optimizer, scheduler, distributed):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = find_checkpoint(path)
    # get_state_dict creates the optimizer state (a zero-lr step) so DCP has tensors to load into,
    # laid out for *this* mesh: DCP reshards whatever mesh the checkpoint was saved on
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path, no_dist=not distributed)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    with open(os.path.join(path, "train_state.json")) as f:
        meta = json.load(f)
    scheduler.load_state_dict(meta["scheduler"])
    return meta["step"]


# -----------------------------------------------------------------------------
# Main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=TRAIN["steps"])
    ap.add_argument("--resume", default=None)
    ap.add_argument("--data", default=None)
    ap.add_argument("--metrics", default=None)
    ap.add_argument("--init-params", default=None)
    ap.add_argument("--export-params", default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY)
    ap.add_argument("--seed", type=int, default=TRAIN["seed"])
    # overrides of the spec, for experiments
    ap.add_argument("--mesh", default=None, help="e.g. data=2,fsdp=2,tensor=2")
    ap.add_argument("--grad-accum", type=int, default=TRAIN["grad_accum"])
    ap.add_argument("--compute", default=PRECISION["compute"], choices=sorted(DTYPES))
    ap.add_argument("--activation-checkpointing", action="store_true", default=ACTIVATION_CHECKPOINTING)
    ap.add_argument("--compile", action="store_true", default=COMPILE)
    ap.add_argument("--memory-report", default=None, help="JSON file: measured per-rank bytes after step 1")
    args = ap.parse_args(argv)

    # --- launch check: before touching the process group, so a wrong launch exits at once
    sizes = parse_mesh(args.mesh)
    need = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if need != world:
        if rank == 0:
            mesh_txt = ",".join(f"{a}={sizes[a]}" for a in MESH_AXES)
            print(
                f"error: mesh {mesh_txt} needs {need} ranks but WORLD_SIZE is {world}; "
                f"launch with: torchrun --nproc-per-node {need} {sys.argv[0]} ...",
                file=sys.stderr,
                flush=True,
            )
        sys.exit(2)
    B, A = TRAIN["global_batch"], args.grad_accum
    n_dp = sizes["data"] * sizes["fsdp"]
    if B % A or (B // A) % n_dp:
        if rank == 0:
            print(f"error: global batch {B} / grad_accum {A} is not divisible by data*fsdp={n_dp}", file=sys.stderr)
        sys.exit(2)

    # --- process group and device
    distributed = "WORLD_SIZE" in os.environ
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # ranks share the host's cores: oversubscribed threads make every rank slower
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None)
    master = rank == 0
    compute_dtype = DTYPES[args.compute]

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    # DCP warns on every single-process save/load even with no_dist=True
    warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

    # --- model: build whole, fill from the canonical init, then shard
    torch.manual_seed(args.seed)  # nothing random is drawn from torch; set for determinism anyway
    model = GPT(**MODEL).to(device=device, dtype=DTYPES[PRECISION["params"]])
    plan = param_plan(model)
    if args.init_params:
        with np.load(args.init_params) as z:
            load_canonical(model, plan, {k: z[k] for k in z.files})
    else:
        load_canonical(model, plan, init_canonical(plan, args.seed))
    model.activation_checkpointing = args.activation_checkpointing

    mesh, kind, fsdp_mp = None, "none", None
    if distributed:
        model, mesh, kind, fsdp_mp = setup_parallel(model, sizes, device, compute_dtype)
    is_ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    is_fsdp = hasattr(model, "set_requires_gradient_sync")  # FSDP2 (fully_shard) root
    raw = model.module if is_ddp else model  # unwrapped: canonical FQNs
    if args.compile:
        for block in raw.blocks:
            block.compile()  # in place: keeps FQNs (torch.compile(m) would add _orig_mod.)

    # which ranks hold which samples: all tensor-parallel peers share one data shard
    if mesh is not None:
        coord = mesh.get_coordinate()
        dp_rank = coord[0] * sizes["fsdp"] + coord[1]
    else:
        dp_rank = 0

    # --- optimizer: decay only on matrices (ndim >= 2), two param groups
    named = list(raw.named_parameters())
    decay = [p for _, p in named if p.ndim >= 2]
    no_decay = [p for _, p in named if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": OPTIM["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=OPTIM["lr"],
        betas=OPTIM["betas"],
        eps=OPTIM["eps"],
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)

    if args.dry_run:
        rows, nbytes = describe_params(raw, plan, "replicated (DDP)" if is_ddp else "whole")
        all_bytes = [None] * world
        if distributed:
            dist.all_gather_object(all_bytes, nbytes)
        else:
            all_bytes = [nbytes]
        if master:
            print(f"mesh: {', '.join(f'{a}={sizes[a]}' for a in MESH_AXES)} ({kind}), world {world}, device {device.type}")
            print(f"{'parameter':28s} {'canonical':12s} {'torch':12s} {'local':12s} placements")
            for name, canon, shape, placements, local in rows:
                print(f"{name:28s} {str(list(canon)):12s} {str(list(shape)):12s} {str(list(local)):12s} {placements}")
            for r, b in enumerate(all_bytes):
                print(f"rank {r}: params {b['params']} B, grads {b['grads']} B, optimizer {b['optimizer']} B")
        shutdown(distributed)

    start_step = 0
    if args.resume:
        start_step = load_checkpoint(args.resume, raw, optimizer, scheduler, distributed)
        if master:
            print(f"resumed from {args.resume} at step {start_step}")

    data = Data(args.data, args.seed)
    micro = B // A  # samples per micro-step, all ranks together
    per_rank = micro // n_dp
    autocast = (
        torch.autocast(device.type, dtype=compute_dtype)
        if compute_dtype != torch.float32 and fsdp_mp is None
        else contextlib.nullcontext()
    )
    metrics = open(args.metrics, "w") if (master and args.metrics) else None
    seq_len = INPUTS[0][1][0] if len(INPUTS[0][1]) else None

    for step in range(start_step, args.steps):
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        for k in range(A):
            last = k == A - 1
            first = step * B + k * micro + dp_rank * per_rank
            tokens, targets = (torch.from_numpy(a).to(device) for a in data.get(first, per_rank))
            # no gradient communication on non-final micro-steps: gradients accumulate locally
            if is_fsdp:
                model.set_requires_gradient_sync(last)
            sync = model.no_sync() if (is_ddp and not last) else contextlib.nullcontext()
            with sync:
                with autocast:
                    loss = model(tokens, targets) / A
                loss.backward()
            loss_sum += loss.detach()
        grad_norm = clip_grad_norm(raw.parameters(), CLIP_NORM)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        if args.memory_report and step == start_step:
            write_memory_report(args.memory_report, raw, optimizer, distributed, world, master)
        optimizer.zero_grad(set_to_none=True)
        if distributed:
            # each rank's mean over its equal share; TP peers hold identical copies
            dist.all_reduce(loss_sum)
            loss_sum /= world
        loss_val = loss_sum.item()  # also waits for the step to finish
        dt = time.perf_counter() - t0
        if master:
            rec = {"step": step + 1, "loss": loss_val, "lr": lr, "grad_norm": grad_norm.item(),
                   "step_time_s": dt, "samples_per_s": B / dt}
            if seq_len:
                rec["tokens_per_s"] = B * seq_len / dt
            print(f"step {step + 1:4d} | loss {loss_val:.6f} | lr {lr:.3e} | norm {rec['grad_norm']:.4f} | "
                  f"{dt * 1000:.1f} ms", flush=True)
            if metrics:
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
        done = step + 1
        if args.checkpoint_dir and (
            (args.checkpoint_every and done % args.checkpoint_every == 0) or done == args.steps
        ):
            save_checkpoint(args.checkpoint_dir, done, raw, optimizer, scheduler, distributed, rank)

    if metrics:
        metrics.close()
    if args.export_params:
        arrays = gather_canonical(raw, plan)  # collective: all ranks gather, rank 0 writes
        if master:
            tmp = args.export_params + ".tmp.npz"
            np.savez(tmp, **arrays)
            os.replace(tmp, args.export_params)
    shutdown(distributed)


def shutdown(distributed):
    sys.stdout.flush()
    sys.stderr.flush()
    if distributed:
        # under gloo, interpreter teardown after FSDP2 sometimes aborts (SIGABRT); a barrier,
        # destroy, then os._exit skips that teardown once everything is written
        dist.barrier()
        dist.destroy_process_group()
        os._exit(0)
    sys.exit(0)


if __name__ == "__main__":
    main()
