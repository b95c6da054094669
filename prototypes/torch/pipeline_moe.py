"""Pipeline and expert parallelism: a hand-written reference for the torch templates (issue 5).

Two models of specs/ (gpt-pipe.yaml, moe-dp.yaml), written by hand, following docs/program.md (canonical names and layouts,
numpy initialisation, data by global sample index, the documented optimizer numerics):

  gpt-pipe  a small GPT whose repeated decoder blocks are split into pipeline stages
            (torch.distributed.pipelining: PipelineStage + ScheduleGPipe / Schedule1F1B /
            ScheduleInterleaved1F1B over the `pipe` mesh axis), combined with tensor parallelism
            inside each stage (parallelize_module on the `tensor` sub-mesh) and data parallelism
            over `data` (DDP; HSDP (FSDP2) when `tensor` or `fsdp` is split too).
  moe-dp    a small mixture-of-experts transformer: experts sharded over the `expert` axis, tokens
            dispatched to their experts' ranks with all-to-all and combined back; the rest is data
            parallel over data x expert.

    python pipeline_moe.py --model gpt-pipe                    # 1 process (stages run one after another)
    torchrun --nproc-per-node 8 pipeline_moe.py --model gpt-pipe --mesh pipe=2,data=2,tensor=2
    torchrun --nproc-per-node 8 pipeline_moe.py --model moe-dp --mesh data=2,expert=4

Flags: those of docs/program.md (--steps --metrics --init-params --export-params --seed --dry-run
--checkpoint-dir --resume) and, for experiments, --mesh, --schedule, --microbatches, --virtual-stages.

Mesh axes in canonical order pipe, data, fsdp, expert, tensor (rank = pipe-major, tensor innermost).
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

AXES = ("pipe", "data", "fsdp", "expert", "tensor")

CONFIGS = {
    "gpt-pipe": dict(
        vocab=256, seq=32, d=64, heads=4, ff=256, layers=4, tie=False, moe=None,
        batch=16, steps=10, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
        schedule="cosine", warmup=2, min_lr_ratio=0.0, clip=1.0, seed=0,
        pipeline=dict(microbatches=4, schedule="1f1b", virtual_stages=1),
        mesh=dict(pipe=2, data=2, tensor=2),
    ),
    "moe-dp": dict(
        vocab=128, seq=16, d=64, heads=4, ff=128, layers=2, tie=True,
        moe=dict(experts=4, top_k=2, hidden=128, capacity_factor=1.25, aux_loss_weight=0.01, activation="gelu"),
        batch=16, steps=10, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
        schedule="constant", warmup=0, min_lr_ratio=0.0, clip=None, seed=0,
        pipeline=None,
        mesh=dict(data=2, expert=4),
    ),
}
CFG = None  # the chosen config
INIT_STD = 0.02


# -----------------------------------------------------------------------------
# Operators


class PosEmbedding(nn.Module):
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
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.fc = nn.Linear(d, ff)
        self.proj = nn.Linear(ff, d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Weights(nn.Module):
    """Parameters in their canonical layout (no nn.Linear transpose): `weight` and optionally `bias`."""

    def __init__(self, wshape, bshape=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(wshape))
        if bshape is not None:
            self.bias = nn.Parameter(torch.empty(bshape))


def local(t):
    """This rank's part of a parameter: the expert shard of a DTensor (autograd flows back to it)."""
    return t.to_local() if hasattr(t, "to_local") else t


class MoE(nn.Module):
    """Mixture of experts with top-k routing (docs/program.md "Mixture of experts").

    Parameters (canonical layouts): router.weight [d, E]; experts.fc.weight [E, d, h], experts.fc.bias [E, h],
    experts.proj.weight [E, h, d], experts.proj.bias [E, d]. Under expert parallelism the experts.* parameters
    are DTensors sharded on dim 0 over the `expert` mesh axis: each rank holds E / X experts, and tokens
    travel to them (all-to-all) and back. Capacity is per sample, so what is dropped never depends on the mesh.
    After each forward, `aux_loss` holds the weighted load-balancing loss (mean over the samples).
    """

    def __init__(self, dim, experts, top_k, hidden, capacity_factor, aux_loss_weight, activation):
        super().__init__()
        self.E, self.k, self.cf, self.aux_w, self.act = experts, top_k, capacity_factor, aux_loss_weight, activation
        self.router = Weights((dim, experts))
        self.experts = nn.Module()
        self.experts.fc = Weights((experts, dim, hidden), (experts, hidden))
        self.experts.proj = Weights((experts, hidden, dim), (experts, dim))
        self.ep_group = None  # the `expert` process group under expert parallelism
        self.ep_size = 1
        self.aux_loss = None

    def forward(self, x):
        B, d, E, k = x.shape[0], x.shape[-1], self.E, self.k
        xs = x.reshape(B, -1, d)  # [B, T, d]: capacity is per sample
        T = xs.shape[1]
        C = math.ceil(self.cf * T * k / E)
        # 1. router in float32
        probs = torch.softmax(xs.float() @ self.router.weight.float(), dim=-1)  # [B, T, E]
        # 2. top-k, ties to the lower expert index (stable sort); gates not renormalised
        gates, choice = torch.sort(probs, dim=-1, descending=True, stable=True)
        gates, choice = gates[..., :k], choice[..., :k]  # [B, T, k]
        # 3. slots, choice-rank first: all first choices in token order, then all second choices, ...
        order = choice.transpose(1, 2).reshape(B, k * T)  # expert of (choice j, token t) at j * T + t
        onehot = F.one_hot(order, E)  # [B, kT, E]
        pos = (onehot.cumsum(1) * onehot).sum(-1) - 1  # [B, kT]: slot within its expert
        keep = pos < C
        b_idx = torch.arange(B, device=x.device)[:, None].expand(B, k * T)
        t_idx = torch.arange(T, device=x.device).repeat(k)[None].expand(B, k * T)
        slot = (b_idx * E + order) * C + pos  # flat index into [B, E, C]
        pad_slot = B * E * C  # where dropped choices point (a row of zeros)
        src = torch.full((B * E * C,), B * T, dtype=torch.long, device=x.device)  # empty slot: zero row
        src[slot[keep]] = (b_idx * T + t_idx)[keep]
        x_pad = torch.cat([xs.reshape(B * T, d), xs.new_zeros(1, d)])
        buf = x_pad[src].view(B, E, C, d).transpose(0, 1).contiguous()  # [E, B, C, d]: experts major
        # 4. experts, on the ranks that hold them
        out = self._experts(buf)  # [E, B, C, d]
        out = out.transpose(0, 1).reshape(B * E * C, d)
        out = torch.cat([out, out.new_zeros(1, d)])
        # 5. combine: sum over kept choices of gate * expert output (choice order)
        idx = torch.where(keep, slot, torch.full_like(slot, pad_slot))  # [B, kT]
        picked = out[idx].view(B, k, T, d).float()
        g = gates.transpose(1, 2)[..., None]  # [B, k, T, 1]
        y = picked[:, 0] * g[:, 0]
        for j in range(1, k):
            y = y + picked[:, j] * g[:, j]
        # 6. load balancing per sample: E * sum_e f_e P_e, f_e from first choices
        f = F.one_hot(choice[..., 0], E).float().mean(1)  # [B, E]
        p_mean = probs.mean(1)  # [B, E]
        self.aux_loss = self.aux_w * (E * (f * p_mean).sum(-1)).mean()
        return y.to(x.dtype).reshape(x.shape)

    def _experts(self, buf):
        E, B, C, d = buf.shape
        X = self.ep_size
        if X > 1:  # dispatch: the rows of rank r's experts go to rank r (equal splits)
            from torch.distributed._functional_collectives import all_to_all_single_autograd

            buf = all_to_all_single_autograd(buf.reshape(-1), None, None, self.ep_group)
            # [X source ranks, E/X local experts, B, C, d] -> [E/X, X*B*C, d]
            buf = buf.view(X, E // X, B * C, d).transpose(0, 1).reshape(E // X, X * B * C, d)
        else:
            buf = buf.view(E, B * C, d)
        fc, proj = self.experts.fc, self.experts.proj
        h = torch.baddbmm(local(fc.bias)[:, None], buf, local(fc.weight))
        if self.act == "gelu":
            h = F.gelu(h, approximate="tanh")
        elif self.act == "relu":
            h = F.relu(h)
        else:
            h = F.silu(h)
        o = torch.baddbmm(local(proj.bias)[:, None], h, local(proj.weight))  # [E/X, X*B*C, d]
        if X > 1:  # combine: back to the ranks the tokens came from
            from torch.distributed._functional_collectives import all_to_all_single_autograd

            o = o.view(E // X, X, B * C, d).transpose(0, 1).contiguous()
            o = all_to_all_single_autograd(o.reshape(-1), None, None, self.ep_group)
        return o.view(E, B, C, d)


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c["d"])
        self.attn = Attention(c["d"], c["heads"])
        self.ln2 = nn.LayerNorm(c["d"])
        if c["moe"]:
            m = c["moe"]
            self.moe = MoE(c["d"], m["experts"], m["top_k"], m["hidden"], m["capacity_factor"],
                           m["aux_loss_weight"], m["activation"])
        else:
            self.mlp = MLP(c["d"], c["ff"])

    def forward(self, x):
        res1 = x + self.attn(self.ln1(x))
        ffn = self.moe if hasattr(self, "moe") else self.mlp
        return res1 + ffn(self.ln2(res1))


class Stage(nn.Module):
    """The layers of one pipeline stage (the whole model for a single stage), canonical FQNs: the repeated
    blocks are a ModuleDict keyed by their global index, so blocks.2.attn.q.weight stays that name on
    whichever stage holds copy 2. forward(x): tokens on the first stage, the activation afterwards;
    returns the logits on the last stage (the loss is the schedule's loss_fn), the activation before."""

    def __init__(self, c, first, last, blocks):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.wte = nn.Embedding(c["vocab"], c["d"])
            self.wpe = PosEmbedding(c["seq"], c["d"])
        self.blocks = nn.ModuleDict({str(i): Decoder(c) for i in blocks})
        if last:
            self.ln_f = nn.LayerNorm(c["d"])
            if not c["tie"]:
                self.lm_head = nn.Linear(c["d"], c["vocab"], bias=False)

    def forward(self, x):
        if self.first:
            x = self.wpe(self.wte(x))
        for block in self.blocks.values():
            x = block(x)
        if self.last:
            x = self.ln_f(x)
            x = F.linear(x, self.wte.weight) if CFG["tie"] else self.lm_head(x)
        return x


def loss_fn(logits, targets):
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten().long())


def aux_loss(module):
    """The moe layers' load-balancing losses of the last forward (summed; 0 without moe)."""
    out = 0.0
    for m in module.modules():
        if isinstance(m, MoE) and m.aux_loss is not None:
            out = out + m.aux_loss
    return out


class Local(nn.Module):
    """Every module this rank holds, under canonical FQNs (the stages' children merged: one rank may hold
    several stages with the interleaved schedule). For the optimizer, checkpoints, export and dry run."""

    def __init__(self, stages):
        super().__init__()
        for st in stages:
            for name, child in st.named_children():
                if isinstance(child, nn.ModuleDict):
                    if name not in self._modules:
                        self.add_module(name, nn.ModuleDict())
                    for k, v in child.items():
                        self._modules[name][k] = v
                else:
                    self.add_module(name, child)


# -----------------------------------------------------------------------------
# Canonical parameters


def canonical_shapes(c):
    """name -> (canonical shape, init) of every parameter of the whole model, in spec order."""
    d, h, v = c["d"], c["ff"], c["vocab"]
    out = {"wte.weight": ((v, d), "normal"), "wpe.weight": ((c["seq"], d), "normal")}
    for i in range(c["layers"]):
        p = f"blocks.{i}."
        out.update({p + "ln1.weight": ((d,), "ones"), p + "ln1.bias": ((d,), "zeros")})
        for n in "qkvo":
            out[f"{p}attn.{n}.weight"] = ((d, d), "normal")
        out.update({p + "ln2.weight": ((d,), "ones"), p + "ln2.bias": ((d,), "zeros")})
        if c["moe"]:
            m = c["moe"]
            E, hh = m["experts"], m["hidden"]
            out.update({
                p + "moe.router.weight": ((d, E), "normal"),
                p + "moe.experts.fc.weight": ((E, d, hh), "normal"), p + "moe.experts.fc.bias": ((E, hh), "zeros"),
                p + "moe.experts.proj.weight": ((E, hh, d), "normal"), p + "moe.experts.proj.bias": ((E, d), "zeros"),
            })
        else:
            out.update({
                p + "mlp.fc.weight": ((d, h), "normal"), p + "mlp.fc.bias": ((h,), "zeros"),
                p + "mlp.proj.weight": ((h, d), "normal"), p + "mlp.proj.bias": ((d,), "zeros"),
            })
    out.update({"ln_f.weight": ((d,), "ones"), "ln_f.bias": ((d,), "zeros")})
    if not c["tie"]:
        out["lm_head.weight"] = ((d, v), "normal")
    return out


def transposed(name):
    """nn.Linear weights are [out, in] in torch, [in, out] canonically."""
    return name.endswith("weight") and (".attn." in name or ".mlp." in name or name == "lm_head.weight")


def init_params(shapes, seed):
    out = {}
    for name, (shape, kind) in shapes.items():
        if kind == "zeros":
            out[name] = np.zeros(shape, np.float32)
        elif kind == "ones":
            out[name] = np.ones(shape, np.float32)
        else:
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            out[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)).astype(np.float32)
    return out


@torch.no_grad()
def fill(module, arrays):
    for name, p in module.named_parameters():
        a = np.asarray(arrays[name], np.float32)
        t = torch.from_numpy(np.ascontiguousarray(a.T if transposed(name) else a))
        assert tuple(t.shape) == tuple(p.shape), (name, t.shape, p.shape)
        p.copy_(t)


@torch.no_grad()
def canonical_params(holder, shapes, pp_group):
    """Every parameter, whole and canonical, on every rank: DTensor shards gathered (full_tensor), stages
    gathered over the pipe axis. Collective."""
    mine = {}
    for name, p in holder.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
        a = t.float().cpu().numpy()
        mine[name] = np.ascontiguousarray(a.T if transposed(name) else a)
    if pp_group is not None:
        parts = [None] * dist.get_world_size(pp_group)
        dist.all_gather_object(parts, mine, group=pp_group)
        for part in parts:
            mine.update(part)
    return {n: mine[n] for n in shapes}


# -----------------------------------------------------------------------------
# Data and optimizer


def sample_batch(start, count, seed):
    seq, vocab = CFG["seq"], CFG["vocab"]
    toks, tgts = [], []
    for i in range(start, start + count):
        rng = np.random.default_rng([seed + 1, i])
        toks.append(rng.integers(0, vocab, size=(seq,), dtype=np.int64).astype(np.int32))
        tgts.append(rng.integers(0, vocab, size=(seq,), dtype=np.int64).astype(np.int32))
    return torch.from_numpy(np.stack(toks)).long(), torch.from_numpy(np.stack(tgts)).long()


def lr_at(t):
    c = CFG
    W, T, m = c["warmup"], c["steps"], c["min_lr_ratio"]
    if t < W:
        return c["lr"] * (t + 1) / W
    if c["schedule"] == "cosine":
        prog = min(1.0, (t - W) / max(1, T - W))
        return c["lr"] * (m + (1 - m) * 0.5 * (1 + math.cos(math.pi * prog)))
    return c["lr"]


@torch.no_grad()
def grad_norm_and_clip(params, max_norm, pp_group):
    """Global L2 norm over every gradient of every stage: per-mesh groups reduced to full scalars (DTensor
    gradients live on different meshes), squared and summed, then summed over the pipe axis."""
    groups = defaultdict(list)
    for p in params:
        if p.grad is not None:
            groups[p.grad.device_mesh if hasattr(p.grad, "device_mesh") else None].append(p)
    sq = torch.zeros((), dtype=torch.float32)
    for group in groups.values():
        n = torch.nn.utils.get_total_norm([p.grad for p in group], 2.0)
        n = n.full_tensor() if hasattr(n, "full_tensor") else n
        sq = sq + n.float() ** 2
    if pp_group is not None:
        dist.all_reduce(sq, group=pp_group)
    total = sq.sqrt()
    if max_norm is not None:
        for group in groups.values():  # one mesh at a time: foreach ops need a common mesh
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


# -----------------------------------------------------------------------------
# Parallelism


def parse_mesh(text):
    sizes = {a: 1 for a in AXES}
    if text:
        for part in text.split(","):
            k, _, v = part.partition("=")
            if k not in AXES:
                raise SystemExit(f"--mesh: unknown axis {k!r}")
            sizes[k] = int(v)
    else:
        sizes.update(CFG["mesh"])
    return sizes


def tensor_parallel(stage, tp_mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {}
    for i in stage.blocks:
        p = f"blocks.{i}."
        plan.update({p + "attn.q": ColwiseParallel(), p + "attn.k": ColwiseParallel(),
                     p + "attn.v": ColwiseParallel(), p + "attn.o": RowwiseParallel()})
        if hasattr(stage.blocks[i], "mlp"):
            plan.update({p + "mlp.fc": ColwiseParallel(), p + "mlp.proj": RowwiseParallel()})
    parallelize_module(stage, tp_mesh, plan)


def expert_parallel(module, mesh, sizes):
    """Experts sharded on dim 0 over `expert` (DTensor Shard(0)): each rank keeps its E/X experts."""
    from torch.distributed.tensor import Shard, distribute_tensor

    ep_mesh = mesh["expert"]
    for m in module.modules():
        if isinstance(m, MoE):
            m.ep_group, m.ep_size = ep_mesh.get_group(), sizes["expert"]
            for sub in (m.experts.fc, m.experts.proj):
                for pname, p in list(sub.named_parameters(recurse=False)):
                    # every rank holds the whole tensor already: keep the local slice (no scatter)
                    dt = distribute_tensor(p.data, ep_mesh, [Shard(0)], src_data_rank=None)
                    setattr(sub, pname, nn.Parameter(dt))


def data_parallel(stage, mesh, sizes):
    """DDP over the batch axes when only data (and expert) split the batch; HSDP (FSDP2 on (data, fsdp))
    when tensor or fsdp is split, so tensor-parallel DTensors stay DTensors."""
    D, Fs, T, X = sizes["data"], sizes["fsdp"], sizes["tensor"], sizes["expert"]
    if Fs > 1 or (T > 1 and D > 1):
        from torch.distributed.fsdp import fully_shard

        dp_mesh = mesh["data", "fsdp"] if D > 1 else mesh["fsdp"]
        for block in stage.blocks.values():
            fully_shard(block, mesh=dp_mesh)
        fully_shard(stage, mesh=dp_mesh)
        return stage
    if D * X > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        group = mesh["data", "expert"]._flatten().get_group() if X > 1 and D > 1 else (
            mesh.get_group("expert") if X > 1 else mesh.get_group("data"))
        # expert parameters are not replicated over this group: their gradients are reduced by hand
        if X > 1:
            ignore = [n for n, p in stage.named_parameters() if ".experts." in n]
            DDP._set_params_and_buffers_to_ignore_for_model(stage, ignore)
        return DDP(stage, process_group=group, gradient_as_bucket_view=True)
    return stage


@torch.no_grad()
def reduce_expert_grads(holder, mesh, sizes):
    """Expert gradients: each rank's already sums over the tokens of its whole expert group (they came in
    by all-to-all), so sum over `data` and divide by the data-parallel degree (data x expert)."""
    D, X = sizes["data"], sizes["expert"]
    if X == 1:
        return
    for name, p in holder.named_parameters():
        if ".experts." in name and p.grad is not None:
            g = p.grad.to_local()
            if D > 1:
                dist.all_reduce(g, group=mesh.get_group("data"))
            g.div_(D * X)


# -----------------------------------------------------------------------------
# Main


def main(argv=None):
    global CFG
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(CONFIGS), default="gpt-pipe")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--metrics", default=None)
    ap.add_argument("--init-params", default=None)
    ap.add_argument("--export-params", default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--mesh", default=None)
    ap.add_argument("--schedule", default=None, choices=["gpipe", "1f1b", "interleaved"])
    ap.add_argument("--microbatches", type=int, default=None)
    ap.add_argument("--virtual-stages", type=int, default=None)
    args = ap.parse_args(argv)
    CFG = dict(CONFIGS[args.model])
    c = CFG
    steps = c["steps"] if args.steps is None else args.steps
    seed = c["seed"] if args.seed is None else args.seed
    sizes = parse_mesh(args.mesh)
    P, D, Fs, X, T = (sizes[a] for a in AXES)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    need = math.prod(sizes.values())
    if need != world:
        if rank == 0:
            print(f"error: mesh {sizes} needs {need} ranks, WORLD_SIZE is {world}", file=sys.stderr)
        sys.exit(2)
    pc = dict(c["pipeline"] or dict(microbatches=1, schedule="gpipe", virtual_stages=1))
    if args.schedule:
        pc["schedule"] = args.schedule
    if args.microbatches:
        pc["microbatches"] = args.microbatches
    if args.virtual_stages:
        pc["virtual_stages"] = args.virtual_stages
    V = pc["virtual_stages"] if P > 1 else 1
    M = pc["microbatches"]
    n_stages = P * V
    dp = D * Fs * X  # data-parallel degree (the batch axes)
    B = c["batch"]
    b = B // M  # samples per pipeline micro-batch (all data-parallel ranks together)
    assert B % (M * dp) == 0, "batch does not split"
    if pc["schedule"] in ("1f1b", "interleaved") and P > 1 and M < P:
        raise SystemExit("1f1b needs micro-batches >= stages (the planner's E051)")

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device("cpu")
    distributed = "WORLD_SIZE" in os.environ
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    mesh = None
    if distributed:
        from torch.distributed.device_mesh import init_device_mesh

        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", tuple(sizes[a] for a in AXES), mesh_dim_names=AXES)
        p_rank, d, f, x, _ = mesh.get_coordinate()
        dp_rank = (d * Fs + f) * X + x
    else:
        p_rank, dp_rank = 0, 0
    pp_group = mesh.get_group("pipe") if P > 1 else None

    # --- stages: the repeat split evenly over P*V stages; embeddings first, head last
    L = c["layers"]
    assert L % n_stages == 0
    per = L // n_stages
    my_stage_ids = [p_rank + v * P for v in range(V)]  # stage s runs on pipe rank s % P
    shapes = canonical_shapes(c)
    host = init_params(shapes, seed)
    if args.init_params:
        with np.load(args.init_params) as z:
            host = {k: z[k] for k in z.files}
    stages = []
    for s in my_stage_ids:
        st = Stage(c, s == 0, s == n_stages - 1, range(s * per, (s + 1) * per))
        fill(st, host)
        stages.append(st)
    holder = Local(stages)  # canonical names of everything this rank holds
    runners = []
    for st in stages:
        if T > 1:
            tensor_parallel(st, mesh["tensor"])
        if X > 1:
            expert_parallel(st, mesh, sizes)
        runners.append(data_parallel(st, mesh, sizes) if distributed else st)

    named = list(holder.named_parameters())
    decay = [p for n, p in named if len(shapes[n][0]) >= 2]
    rest = [p for n, p in named if len(shapes[n][0]) < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=c["lr"], betas=c["betas"], eps=c["eps"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: lr_at(t) / c["lr"])

    n_local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for _, p in named)
    counts = [None] * world if distributed else [n_local]
    if distributed:
        dist.all_gather_object(counts, {"rank": rank, "stages": my_stage_ids, "params": n_local,
                                        "names": [n for n, _ in named]})
    if rank == 0:
        if distributed:
            total = len({n for cnt in counts for n in cnt["names"]})
            print("param tensors over all ranks:", total, "of", len(shapes))
        full = sum(math.prod(s) for s, _ in shapes.values())
        print(f"parameters: {full} (canonical); mesh {sizes}; stages {n_stages}; schedule {pc['schedule']}; "
              f"microbatches {M}", flush=True)
        if args.dry_run:
            print(json.dumps([{k: v for k, v in cnt.items() if k != "names"} for cnt in counts]
                             if distributed else counts))
    if args.dry_run:
        return shutdown(distributed)

    start = 0
    if args.resume:
        start = load_checkpoint(args.resume, holder, opt, sched, distributed)

    schedule = None
    if P > 1:
        from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                  ScheduleInterleaved1F1B)

        pstages = [PipelineStage(r, s, n_stages, device, group=pp_group) for r, s in zip(runners, my_stage_ids)]
        if pc["schedule"] == "interleaved":
            schedule = ScheduleInterleaved1F1B(pstages, n_microbatches=M, loss_fn=loss_fn)
        elif pc["schedule"] == "1f1b":
            schedule = Schedule1F1B(pstages[0], n_microbatches=M, loss_fn=loss_fn)
        else:
            schedule = ScheduleGPipe(pstages[0], n_microbatches=M, loss_fn=loss_fn)
    has_first = 0 in my_stage_ids
    has_last = n_stages - 1 in my_stage_ids

    metrics = open(args.metrics, "w") if (rank == 0 and args.metrics) else None
    per_rank = b // dp  # samples of each pipeline micro-batch this rank reads
    for step in range(start, steps):
        t0 = time.perf_counter()
        # micro-batch j: samples [j*b, (j+1)*b) of the step, rank dp_rank's slice of each
        parts = [sample_batch(step * B + j * b + dp_rank * per_rank, per_rank, seed) for j in range(M)]
        tokens = torch.cat([p[0] for p in parts])
        targets = torch.cat([p[1] for p in parts])
        if schedule is not None:
            losses = []
            if has_first and has_last:
                schedule.step(tokens, target=targets, losses=losses)
            elif has_first:
                schedule.step(tokens)
            elif has_last:
                schedule.step(target=targets, losses=losses)
            else:
                schedule.step()
            local_loss = torch.stack(losses).mean() if has_last else torch.zeros(())
        else:
            (runner,) = runners
            local_loss = torch.zeros(())
            for j in range(M):
                last = j == M - 1
                sync = contextlib.nullcontext()
                if isinstance(runner, torch.nn.parallel.DistributedDataParallel) and not last:
                    sync = runner.no_sync()
                if hasattr(runner, "set_requires_gradient_sync"):
                    runner.set_requires_gradient_sync(last)
                with sync:
                    sl = slice(j * per_rank, (j + 1) * per_rank)
                    out = runner(tokens[sl])
                    loss = (loss_fn(out, targets[sl]) + aux_loss(holder)) / M
                    loss.backward()
                local_loss += loss.detach()
        if distributed:
            reduce_expert_grads(holder, mesh, sizes)
        gnorm = grad_norm_and_clip([p for _, p in named], c["clip"], pp_group)
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if distributed:
            # last-stage ranks hold the loss (tensor peers the same one); the rest contribute 0
            dist.all_reduce(local_loss)
            local_loss /= world // P
        loss_val = local_loss.item()
        dt = time.perf_counter() - t0
        if rank == 0:
            rec = {"step": step + 1, "loss": loss_val, "lr": lr, "grad_norm": gnorm.item(), "step_time_s": dt}
            print(f"step {step + 1} loss {loss_val:.6f} norm {rec['grad_norm']:.5f} {dt * 1e3:.0f} ms", flush=True)
            if metrics:
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
        if args.checkpoint_dir and step + 1 == steps:
            save_checkpoint(args.checkpoint_dir, step + 1, holder, opt, sched, distributed, rank)
    if metrics:
        metrics.close()
    if args.export_params:
        arrays = canonical_params(holder, shapes, pp_group)
        if rank == 0:
            np.savez(args.export_params, **arrays)
    shutdown(distributed)


def save_checkpoint(root, step, holder, opt, sched, distributed, rank):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final, tmp = os.path.join(root, f"step_{step:08d}"), os.path.join(root, f".tmp_step_{step:08d}")
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if distributed:
        dist.barrier()
    msd, osd = get_state_dict(holder, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=tmp, no_dist=not distributed)
    if rank == 0:
        with open(os.path.join(tmp, "train_state.json"), "w") as f:
            json.dump({"step": step, "scheduler": sched.state_dict()}, f)
    if distributed:
        dist.barrier()
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    if distributed:
        dist.barrier()


def load_checkpoint(path, holder, opt, sched, distributed):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not os.path.exists(os.path.join(path, "train_state.json")):
        path = os.path.join(path, sorted(d for d in os.listdir(path) if d.startswith("step_"))[-1])
    msd, osd = get_state_dict(holder, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path, no_dist=not distributed)
    set_state_dict(holder, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    with open(os.path.join(path, "train_state.json")) as f:
        meta = json.load(f)
    sched.load_state_dict(meta["scheduler"])
    return meta["step"]


def shutdown(distributed):
    sys.stdout.flush()
    sys.stderr.flush()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
        os._exit(0)


if __name__ == "__main__":
    main()
