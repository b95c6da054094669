"""Pipeline and expert parallelism in JAX: a hand-written prototype for the JAX templates.

Two models, configured below as the compiler would fill them in from the staged example specs:

- gpt-pipe (prototypes/specs/gpt-pipe.yaml): a GPT whose repeated decoder blocks are split into pipeline
  stages over the `pipe` mesh axis (jax.shard_map, manual over `pipe` only, with lax.ppermute between
  stages), combined with data and tensor parallelism (left to GSPMD inside the shard_map).
  Schedules: gpipe, interleaved (circular, `virtual_stages` chunks per pipe rank) and 1f1b.
- moe-dp (prototypes/specs/moe-dp.yaml): a transformer whose feed-forward layers are mixtures of experts.
  The experts' weights are split over the `expert` mesh axis, the batch over (data, expert); the tokens
  travel to their experts' devices and back through all-to-all collectives that XLA derives from two
  sharding constraints (dispatch [B, E, C, d]: batch over data, experts over expert).

Numerics follow docs/program.md: parameters by canonical name drawn with numpy from (seed, name), samples
by global index, micro-batch j of a step holds samples [j*b, (j+1)*b), MoE with per-sample capacity,
choice-rank-first slot filling, un-renormalised gates, per-sample load-balancing loss.

    python pipeline_moe.py --model gpt-pipe --mesh pipe=2,data=2,tensor=2 --schedule 1f1b --steps 5
    python pipeline_moe.py --model moe-dp --mesh data=2,expert=4 --steps 5
    python pipeline_moe.py --verify            # every equivalence check below, as subprocesses

Design choices (see NOTES.md, "Pipeline and expert parallelism"):
- The layers before the repeated block (embeddings) and after it (final norm, head, loss) are not
  pipelined: their parameters are replicated over `pipe`. The embeddings run on every pipe rank (a
  gather: cheap); the head runs once per micro-batch, micro-batches split over the pipe ranks (gpipe,
  interleaved) or on the last rank inside the pipeline (1f1b, whose backward starts per micro-batch).
- The repeated block's parameters are stacked, [copies, ...], split over `pipe` on the copy dimension
  (each pipe rank holds its stages' copies). They are exported / imported by canonical name.
- gpipe and interleaved are one forward loop (a circular pipeline; gpipe is 1 virtual stage) that
  jax.grad differentiates: the backward is the mirrored loop. 1f1b is an explicit schedule: every tick
  each rank runs one forward and one backward (jax.vjp, recomputing the stage from its stashed input), so
  a rank keeps at most 2*(pipe - rank) - 1 stage inputs instead of all micro-batches.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
import zlib

import numpy as np

MODELS = {
    "gpt-pipe": dict(
        vocab=256, seq=32, d=64, heads=4, ff=256, layers=4, tie=False, moe=None,
        batch=16, steps=10, seed=0, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
        schedule="cosine", warmup=2, min_lr_ratio=0.0, clip=1.0,
        rules={"batch": ("data",), "heads": ("tensor",), "kv_heads": ("tensor",), "mlp": ("tensor",),
               "experts": ("expert",)},
        microbatches=4, pipeline_schedule="1f1b", virtual_stages=1, plan_param_count=233856,
    ),
    "moe-dp": dict(
        vocab=128, seq=16, d=64, heads=4, ff=128, layers=2, tie=True,
        moe=dict(experts=4, top_k=2, capacity_factor=1.25, aux_loss_weight=0.01, activation="gelu"),
        batch=16, steps=10, seed=0, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
        schedule="constant", warmup=0, min_lr_ratio=0.0, clip=None,
        rules={"experts": ("expert",)},  # batch: the default data axes (data, fsdp, expert)
        microbatches=1, pipeline_schedule=None, virtual_stages=1, plan_param_count=175744,
    ),
}
MESH_AXES = ("pipe", "data", "fsdp", "expert", "tensor")  # canonical order
DEFAULT_BATCH_AXES = ("data", "fsdp", "expert")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt-pipe")
    ap.add_argument("--mesh", default="data=1")
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved"])
    ap.add_argument("--virtual-stages", type=int)
    ap.add_argument("--microbatches", type=int)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--metrics")
    ap.add_argument("--hlo", action="store_true", help="print the collectives of the compiled step")
    ap.add_argument("--verify", action="store_true")
    return ap.parse_args(argv)


def parse_mesh(text):
    sizes = dict.fromkeys(MESH_AXES, 1)
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        sizes[k.strip()] = int(v)
    return {a: n for a, n in sizes.items() if n > 1}


# ---------------------------------------------------------------- parameters (canonical names)
def param_table(c):
    """name -> (shape, logical axes, init): the plan's parameters, in order."""
    d, f, V, T = c["d"], c["ff"], c["vocab"], c["seq"]
    t = {"wte.weight": ((V, d), ("vocab", "embed"), "normal"), "wpe.weight": ((T, d), (None, "embed"), "normal")}
    for i in range(c["layers"]):
        b = f"blocks.{i}."
        t[b + "ln1.weight"] = ((d,), ("embed",), "ones")
        t[b + "ln1.bias"] = ((d,), ("embed",), "zeros")
        t[b + "attn.q.weight"] = ((d, d), ("embed", "heads"), "normal")
        t[b + "attn.k.weight"] = ((d, d), ("embed", "kv_heads"), "normal")
        t[b + "attn.v.weight"] = ((d, d), ("embed", "kv_heads"), "normal")
        t[b + "attn.o.weight"] = ((d, d), ("heads", "embed"), "normal")
        t[b + "ln2.weight"] = ((d,), ("embed",), "ones")
        t[b + "ln2.bias"] = ((d,), ("embed",), "zeros")
        if c["moe"]:
            E, h = c["moe"]["experts"], c["ff"]
            t[b + "moe.router.weight"] = ((d, E), ("embed", None), "normal")
            t[b + "moe.experts.fc.weight"] = ((E, d, h), ("experts", "embed", "mlp"), "normal")
            t[b + "moe.experts.fc.bias"] = ((E, h), ("experts", "mlp"), "zeros")
            t[b + "moe.experts.proj.weight"] = ((E, h, d), ("experts", "mlp", "embed"), "normal")
            t[b + "moe.experts.proj.bias"] = ((E, d), ("experts", "embed"), "zeros")
        else:
            t[b + "mlp.fc.weight"] = ((d, f), ("embed", "mlp"), "normal")
            t[b + "mlp.fc.bias"] = ((f,), ("mlp",), "zeros")
            t[b + "mlp.proj.weight"] = ((f, d), ("mlp", "embed"), "normal")
            t[b + "mlp.proj.bias"] = ((d,), ("embed",), "zeros")
    t["ln_f.weight"] = ((d,), ("embed",), "ones")
    t["ln_f.bias"] = ((d,), ("embed",), "zeros")
    if not c["tie"]:
        t["lm_head.weight"] = ((d, V), ("embed", None), "normal")
    return t


def init_param(name, shape, kind, seed, std=0.02):
    if kind == "zeros":
        return np.zeros(shape, np.float32)
    if kind == "ones":
        return np.ones(shape, np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def sample(i, c, data_seed):
    rng = np.random.default_rng([data_seed, i])
    return {n: rng.integers(0, c["vocab"], size=(c["seq"],), dtype=np.int64).astype(np.int32)
            for n in ("tokens", "targets")}


# ---------------------------------------------------------------- verification driver (no jax import)
def run(model, mesh, steps=5, **kw):
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        path = f.name
    cmd = [sys.executable, __file__, "--model", model, "--mesh", mesh, "--steps", str(steps), "--metrics", path]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        print(p.stdout, p.stderr)
        raise SystemExit(f"failed: {' '.join(cmd)}")
    rows = [json.loads(line) for line in open(path)]
    os.unlink(path)
    info = [line for line in p.stdout.splitlines() if line.startswith(("params", "collectives", "memory"))]
    return [r["loss"] for r in rows], info, time.time() - t0


def verify():
    results = []

    def compare(title, model, ref_mesh, mesh, **kw):
        ref, _, _ = run(model, ref_mesh, **{k: v for k, v in kw.items() if k == "microbatches"})
        got, info, dt = run(model, mesh, **kw)
        diff = max(abs(a - b) for a, b in zip(ref, got))
        ok = diff < 1e-5 and len(got) == len(ref) == 5
        results.append((title, diff, ok))
        print(f"{'OK ' if ok else 'BAD'} {title}: max |dloss| {diff:.2e} over {len(got)} steps ({dt:.1f} s) "
              f"losses {[round(x, 5) for x in got]}")
        for line in info:
            print("    " + line)

    for sched in ("gpipe", "1f1b"):
        compare(f"gpt-pipe {sched} pipe=2,data=2,tensor=2", "gpt-pipe", "data=1", "pipe=2,data=2,tensor=2",
                schedule=sched)
        compare(f"gpt-pipe {sched} pipe=4", "gpt-pipe", "data=1", "pipe=4", schedule=sched)
    compare("gpt-pipe interleaved pipe=2 x 2 virtual, data=2,tensor=2", "gpt-pipe", "data=1",
            "pipe=2,data=2,tensor=2", schedule="interleaved", virtual_stages=2)
    compare("gpt-pipe gpipe pipe=2,fsdp=2,tensor=2, 2 micro-batches", "gpt-pipe", "data=1",
            "pipe=2,fsdp=2,tensor=2", schedule="gpipe", microbatches=2)
    compare("moe-dp data=2,expert=4", "moe-dp", "data=1", "data=2,expert=4")
    compare("moe-dp data=2,expert=2", "moe-dp", "data=1", "data=2,expert=2")
    compare("moe-dp expert=4,tensor=2", "moe-dp", "data=1", "expert=4,tensor=2")
    print("all OK" if all(ok for *_, ok in results) else "FAILURES")
    return all(ok for *_, ok in results)


# ---------------------------------------------------------------- the program
def main(args):
    c = dict(MODELS[args.model])
    mesh_sizes = parse_mesh(args.mesh)
    n_dev = math.prod(mesh_sizes.values())
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={n_dev}")
    import jax

    jax.config.update("jax_num_cpu_devices", n_dev)
    import jax.numpy as jnp
    import optax
    from jax import lax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    names = tuple(mesh_sizes) or ("data",)
    mesh = jax.make_mesh(tuple(mesh_sizes.values()) or (1,), names, axis_types=(AxisType.Auto,) * len(names))
    size = lambda a: mesh_sizes.get(a, 1)  # noqa: E731
    rules = dict(c["rules"])
    batch_axes = tuple(a for a in rules.get("batch", DEFAULT_BATCH_AXES) if size(a) > 1)
    dp = math.prod(size(a) for a in batch_axes)

    pipe = size("pipe")
    M = args.microbatches or c["microbatches"]
    sched = args.schedule or c["pipeline_schedule"]
    V = (args.virtual_stages or c["virtual_stages"]) if pipe > 1 else 1
    L = c["layers"]
    B = c["batch"]
    b = B // M  # samples per pipeline micro-batch (grad_accum 1 in both examples)
    assert B % M == 0 and b % dp == 0 and L % (pipe * V) == 0

    def spec_of(axes):
        used, out = set(), []
        for ax in axes:
            ms = tuple(m for m in rules.get(ax, ()) if size(m) > 1 and m not in used) if ax else ()
            used.update(ms)
            out.append(None if not ms else ms[0] if len(ms) == 1 else ms)
        return P(*out)

    table = param_table(c)
    layouts = {n: spec_of(axes) for n, (_, axes, _) in table.items()}
    bspec = batch_axes[0] if len(batch_axes) == 1 else (batch_axes or None)

    # -- the train state's parameters: canonical names, or with a pipeline the repeated block stacked
    stacked = pipe > 1
    block_suffixes = [n[len("blocks.0."):] for n in table if n.startswith("blocks.0.")]
    per = L // (pipe * V)  # block copies per stage

    def stack_order():
        """Stacked row q holds copy order[q]: pipe rank r's rows hold its stages r, r + pipe, ... (V chunks)."""
        order = []
        for r in range(pipe):
            for v in range(V):
                s = v * pipe + r
                order += list(range(s * per, (s + 1) * per))
        return order

    ORDER = stack_order() if stacked else list(range(L))

    def to_state(host):
        if not stacked:
            return dict(host)
        out = {n: a for n, a in host.items() if not n.startswith("blocks.")}
        for s in block_suffixes:
            out["blocks.*." + s] = np.stack([host[f"blocks.{i}.{s}"] for i in ORDER])
        return out

    def from_state(state):
        out = {n: a for n, a in state.items() if not n.startswith("blocks.*.")}
        for s in block_suffixes if stacked else ():
            for q, i in enumerate(ORDER):
                out[f"blocks.{i}.{s}"] = state["blocks.*." + s][q]
        return {n: out[n] for n in table}

    state_layouts = {n: lay for n, lay in layouts.items() if not (stacked and n.startswith("blocks."))}
    if stacked:
        for s in block_suffixes:
            state_layouts["blocks.*." + s] = P("pipe", *layouts["blocks.0." + s])

    host = to_state({n: init_param(n, shape, kind, c["seed"]) for n, (shape, _, kind) in table.items()})
    shardings = {n: NamedSharding(mesh, state_layouts[n]) for n in host}
    params = {n: jax.make_array_from_callback(a.shape, shardings[n], lambda i, a=a: a[i]) for n, a in host.items()}
    n_params = sum(int(np.prod(a.shape)) for a in params.values())
    print(f"params program {n_params} plan {c['plan_param_count']} equal {n_params == c['plan_param_count']}")

    # ------------------------------------------------------------ model ops (as templates/jax/ops.py.j2)
    def layer_norm(x, w, bias, eps=1e-5):
        xf = x.astype(jnp.float32)
        mean = xf.mean(-1, keepdims=True)
        var = jnp.square(xf - mean).mean(-1, keepdims=True)
        return ((xf - mean) * lax.rsqrt(var + eps) * w + bias).astype(x.dtype)

    def attention(x, p, pre, heads, head_dim):
        Bx, T, _ = x.shape
        q = (x @ p[pre + "q.weight"]).reshape(Bx, T, heads, head_dim)
        k = (x @ p[pre + "k.weight"]).reshape(Bx, T, heads, head_dim)
        v = (x @ p[pre + "v.weight"]).reshape(Bx, T, heads, head_dim)
        s = jnp.einsum("bthd,bshd->bhts", q, k).astype(jnp.float32) / math.sqrt(head_dim)
        s = jnp.where(jnp.tril(jnp.ones((T, T), dtype=bool)), s, -jnp.inf)
        pr = jax.nn.softmax(s, axis=-1).astype(x.dtype)
        return jnp.einsum("bhts,bshd->bthd", pr, v).reshape(Bx, T, heads * head_dim) @ p[pre + "o.weight"]

    def mlp(x, p, pre):
        h = jax.nn.gelu(x @ p[pre + "fc.weight"] + p[pre + "fc.bias"], approximate=True)
        return h @ p[pre + "proj.weight"] + p[pre + "proj.bias"]

    # -- moe: the layouts the program pins around the experts
    expert_axes = tuple(a for a in rules.get("experts", ()) if size(a) > 1)
    # dispatched tokens [B, E, C, d]: experts over the expert axes, the batch over the remaining batch axes
    rest = tuple(a for a in batch_axes if a not in expert_axes)
    ax = lambda t: None if not t else t[0] if len(t) == 1 else t  # noqa: E731
    DISPATCHED = P(ax(rest), ax(expert_axes), None, None)
    TOKENS = P(bspec, None, None, None)  # the same tensor laid out like the tokens: batch over the batch axes

    def moe(x, p, pre, experts, top_k, capacity, activation):
        """Mixture of experts over x [B, ..., d] (docs/program.md "Mixture of experts"): router softmax in
        float32, top-k choices (ties: lower expert first), gates not renormalised, capacity per sample with
        choice-rank-first slot filling; returns the output and the mean per-sample load-balancing loss.
        Tokens reach their experts through dense dispatch / combine tensors [B, T, E, C]: the einsum that
        builds the experts' inputs [B, E, C, d] and the pin that splits them over the expert axes (batch
        over the other batch axes) make XLA move tokens with all-to-all collectives over the expert axes."""
        shape = x.shape
        Bx, d = shape[0], shape[-1]
        x = x.reshape(Bx, -1, d)
        T, E, k, C = x.shape[1], experts, top_k, capacity
        probs = jax.nn.softmax(x.astype(jnp.float32) @ p[pre + "router.weight"].astype(jnp.float32), axis=-1)
        # top-k by repeated argmax (equal probabilities: the lower expert first). lax.top_k would do, but
        # XLA's partitioner gathers the whole batch for it.
        left, chosen, gate = probs, [], []
        for _ in range(k):
            one = jax.nn.one_hot(jnp.argmax(left, axis=-1), E, dtype=jnp.float32)
            chosen.append(one)
            gate.append((probs * one).sum(-1))
            left = jnp.where(one > 0, -1.0, left)
        chosen, gate = jnp.stack(chosen, 2), jnp.stack(gate, 2)  # [B, T, k, E], [B, T, k]
        # slot of each choice in its expert: the choices before it in (rank, token) order that chose it
        order = chosen.transpose(0, 2, 1, 3).reshape(Bx, k * T, E)
        slot = (jnp.cumsum(order, axis=1) - order).reshape(Bx, k, T, E).transpose(0, 2, 1, 3)
        slot = (slot * chosen).sum(-1)  # [B, T, k]
        kept = chosen * (slot < C)[..., None]  # a choice that finds its expert full is dropped
        place = jax.nn.one_hot(slot, C, dtype=jnp.float32)  # [B, T, k, C] (all zero past C)
        dispatch = jnp.einsum("btke,btkc->btec", kept, place)
        combine = jnp.einsum("btke,btkc,btk->btec", kept, place, gate)
        xe = jnp.einsum("btec,btd->becd", dispatch.astype(x.dtype), x)
        # pinned where it is computed (with the tokens), then where the experts are: all-to-all between
        xe = lax.with_sharding_constraint(lax.with_sharding_constraint(xe, TOKENS), DISPATCHED)
        act = {"gelu": lambda h: jax.nn.gelu(h, approximate=True), "relu": jax.nn.relu, "silu": jax.nn.silu}
        h = jnp.einsum("becd,edh->bech", xe, p[pre + "experts.fc.weight"]) + p[pre + "experts.fc.bias"][:, None]
        ye = jnp.einsum("bech,ehd->becd", act[activation](h), p[pre + "experts.proj.weight"])
        ye = ye + p[pre + "experts.proj.bias"][:, None]
        ye = lax.with_sharding_constraint(lax.with_sharding_constraint(ye, DISPATCHED), TOKENS)
        y = jnp.einsum("btec,becd->btd", combine.astype(x.dtype), ye)  # back to the tokens' devices
        f = chosen[:, :, 0, :].mean(1)  # [B, E]: share of the sample's tokens whose first choice is e
        aux = (E * (f * probs.mean(1)).sum(-1)).mean()  # per sample, then the mean over the batch
        return y.reshape(shape), aux

    RESID = P(bspec, None, None)
    mc = c["moe"]
    if mc:
        CAPACITY = math.ceil(mc["capacity_factor"] * c["seq"] * mc["top_k"] / mc["experts"])

    def block(p, pre, x):
        """The decoder block; returns its output and the sum of its moe layers' aux losses (weighted)."""
        h = layer_norm(x, p[pre + "ln1.weight"], p[pre + "ln1.bias"])
        x = x + attention(h, p, pre + "attn.", c["heads"], c["d"] // c["heads"])
        h = layer_norm(x, p[pre + "ln2.weight"], p[pre + "ln2.bias"])
        if mc:
            y, aux = moe(h, p, pre + "moe.", mc["experts"], mc["top_k"], CAPACITY, mc["activation"])
            return x + y, mc["aux_loss_weight"] * aux
        return x + mlp(h, p, pre + "mlp."), jnp.zeros((), jnp.float32)

    def pre_layers(p, batch):
        """Layers before the repeated block (pipeline stage 0 in the plan; here on every pipe rank)."""
        tokens = batch["tokens"]
        x = lax.with_sharding_constraint(p["wte.weight"], P())[tokens]
        x = lax.with_sharding_constraint(x, RESID)
        return x + p["wpe.weight"][: x.shape[1]]

    def post_loss(p, x, batch):
        """Layers after the repeated block and the loss (the last stage in the plan)."""
        x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
        logits = x @ (p["wte.weight"].T if c["tie"] else p["lm_head.weight"])
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["targets"]).mean()

    def loss_fn(params, batch):
        """One micro-batch, no pipeline: mean loss + aux losses."""
        x = pre_layers(params, batch)
        aux = jnp.zeros((), jnp.float32)
        for i in range(L):
            x, a = block(params, f"blocks.{i}.", x)
            x = lax.with_sharding_constraint(x, RESID)
            aux = aux + a
        return post_loss(params, x, batch) + aux

    # ------------------------------------------------------------ pipeline (only when pipe > 1)
    def stage(sp, chunk, x):
        """One stage: `per` block copies of local chunk `chunk` (0 .. V-1) of this rank's stacked rows."""
        for i in range(per):
            row = chunk * per + i
            pi = {s: lax.dynamic_index_in_dim(sp["blocks.*." + s], row, keepdims=False) for s in block_suffixes}
            x, _ = block(pi, "", x)  # (moe inside a pipeline: not in this prototype)
            x = lax.with_sharding_constraint(x, RESID)
        return x

    def varying(x):
        """Values that differ between pipe ranks (scan carries and cond branches must agree on it)."""
        return jax.tree.map(lambda a: a if "pipe" in jax.typeof(a).manual_axis_type.varying else lax.pcast(a, ("pipe",), to="varying"), x)

    ring = [(r, (r + 1) % pipe) for r in range(pipe)]
    down = [(r, r + 1) for r in range(pipe - 1)]
    up = [(r + 1, r) for r in range(pipe - 1)]

    def circular(sp, xs):
        """gpipe (V = 1) and interleaved (V > 1): micro-batch j enters rank 0 at tick j, runs chunk 0 on
        ranks 0 .. pipe-1, comes back to rank 0 over the ring for chunk 1, ... Rank r works on iteration
        i = t - r at tick t: micro-batch i % M, chunk i // M. Rank 0 keeps the micro-batches that come back
        until their next lap (`laps`) and the finished ones (`outs`). Returns the outputs, split over pipe
        on the micro-batch axis when it divides (the head then runs once per micro-batch), else summed."""
        r = lax.axis_index("pipe")
        zero = jnp.zeros_like(xs)
        cur, laps, outs = varying((zero[0], zero, zero))

        def file(laps, outs, cur, t):
            """Rank 0 stores what rank pipe-1 sent at tick t - 1 (iteration t - pipe)."""
            i = t - pipe
            ok = (r == 0) & (i >= 0) & (i < V * M)
            j, last = jnp.clip(i, 0) % M, i // M == V - 1
            laps = laps.at[j].set(jnp.where(ok & ~last, cur, laps[j]))
            outs = outs.at[j].set(jnp.where(ok & last, cur, outs[j]))
            return laps, outs

        def tick(carry, t):
            cur, laps, outs = carry
            laps, outs = file(laps, outs, cur, t)
            i = jnp.clip(t - r, 0, V * M - 1)  # idle ticks compute on clamped indices; never stored
            j, chunk = i % M, i // M
            x = jnp.where(r == 0, jnp.where(chunk == 0, xs[j], laps[j]), cur)
            y = stage(sp, chunk, x)
            return (lax.ppermute(y, "pipe", ring), laps, outs), None

        n_ticks = V * M + pipe - 1
        (cur, laps, outs), _ = lax.scan(tick, (cur, laps, outs), jnp.arange(n_ticks))
        _, outs = file(laps, outs, cur, n_ticks)
        outs = jnp.where(r == 0, outs, 0)
        if M % pipe == 0:
            return lax.psum_scatter(outs, "pipe", scatter_dimension=0, tiled=True)
        return lax.psum(outs, "pipe")

    def stage_specs():
        return {n: P("pipe") for n in params if n.startswith("blocks.*.")}

    def pipelined_loss(params, mbatch):
        """gpipe / interleaved: mbatch [M, b, ...] -> mean loss over the M micro-batches."""
        sp = {n: w for n, w in params.items() if n.startswith("blocks.*.")}
        xs = jax.vmap(lambda mb: pre_layers(params, mb))(mbatch)  # [M, b, T, d] on every pipe rank
        split = M % pipe == 0
        run = jax.shard_map(circular, in_specs=(stage_specs(), P()), out_specs=P("pipe") if split else P(),
                            axis_names={"pipe"})
        ys = run(sp, xs)
        if split:  # micro-batches over pipe: each rank computes the head for its share
            tg = lax.with_sharding_constraint(mbatch["targets"], P("pipe", bspec))
            ys = lax.with_sharding_constraint(ys, P("pipe", bspec))
        else:
            tg = mbatch["targets"]
        losses = jax.vmap(lambda y, t: post_loss(params, y, {"targets": t}))(ys, tg)
        return losses.mean()

    def onef1b(sp, rest, xs, targets):
        """1f1b: at tick t rank r runs the forward of micro-batch t - r and the backward of micro-batch
        t - (2*pipe - 2 - r). The last rank runs the head and loss right after a micro-batch's forward, so
        its backward starts at once; the other ranks get output gradients from the next rank one tick later.
        A stage's backward recomputes its forward from the stashed stage input (jax.vjp), so each rank keeps
        only the inputs of micro-batches in flight: a ring of K = min(M, 2 * pipe - 1) slots.
        Returns (loss, stage gradients, gradients of the other parameters (head), input gradients)."""
        r = lax.axis_index("pipe")
        K = min(M, 2 * pipe - 1)
        rest = varying(rest)
        zero_act = jnp.zeros_like(xs[0])
        carry = varying(dict(
            fwd=zero_act, bwd=zero_act, stash=jnp.zeros((K,) + xs.shape[1:], xs.dtype),
            g_stage=jax.tree.map(jnp.zeros_like, sp), g_rest=jax.tree.map(jnp.zeros_like, rest),
            dxs=jnp.zeros_like(xs), loss=jnp.zeros((), jnp.float32)))
        last = pipe - 1

        def head(rest, y, tgt):
            return post_loss(rest, y, {"targets": tgt})

        def head_grads(rest, y, tgt):
            loss, vjp = jax.vjp(lambda w, y: head(w, y, tgt), rest, y)
            g_rest, dy = vjp(jnp.ones_like(loss) / M)
            return loss / M, g_rest, dy

        def no_head(rest, y, tgt):
            return varying((jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, rest), jnp.zeros_like(y)))

        def tick(cr, t):
            jf = t - r
            f_ok = (jf >= 0) & (jf < M)
            jf = jnp.clip(jf, 0, M - 1)
            x = jnp.where(r == 0, xs[jf], cr["fwd"])
            stash = cr["stash"].at[jf % K].set(jnp.where(f_ok, x, cr["stash"][jf % K]))
            y = stage(sp, 0, x)
            # the head, on the last rank only (a real conditional: the other ranks skip it)
            loss, g_head, dy_head = lax.cond(r == last, head_grads, no_head, rest, y, targets[jf])
            jb = t - (2 * pipe - 2 - r)
            b_ok = (jb >= 0) & (jb < M)
            jb = jnp.clip(jb, 0, M - 1)
            dy = jnp.where(r == last, dy_head, cr["bwd"])
            _, vjp = jax.vjp(lambda w, xb: stage(w, 0, xb), sp, stash[jb % K])
            g_sp, dx = vjp(dy)
            keep = lambda ok: lambda acc, g: acc + jnp.where(ok, g, 0)  # noqa: E731
            new = dict(
                fwd=lax.ppermute(y, "pipe", down), bwd=lax.ppermute(dx, "pipe", up), stash=stash,
                g_stage=jax.tree.map(keep(b_ok), cr["g_stage"], g_sp),
                g_rest=jax.tree.map(keep(f_ok), cr["g_rest"], g_head),
                dxs=cr["dxs"].at[jb].set(jnp.where(b_ok & (r == 0), dx, cr["dxs"][jb])),
                loss=cr["loss"] + jnp.where(f_ok, loss, 0))
            return new, None

        cr, _ = lax.scan(tick, carry, jnp.arange(M + 2 * pipe - 2))
        psum = lambda a: lax.psum(a, "pipe")  # noqa: E731 (one rank holds each of these)
        return psum(cr["loss"]), cr["g_stage"], jax.tree.map(psum, cr["g_rest"]), psum(cr["dxs"])

    def onef1b_loss_and_grads(params, mbatch):
        sp = {n: w for n, w in params.items() if n.startswith("blocks.*.")}
        rest = {n: w for n, w in params.items() if not n.startswith("blocks.*.")}
        xs, pre_vjp = jax.vjp(lambda w: jax.vmap(lambda mb: pre_layers(w, mb))(mbatch), rest)
        run = jax.shard_map(onef1b, in_specs=(stage_specs(), P(), P(), P()),
                            out_specs=(P(), stage_specs(), P(), P()), axis_names={"pipe"})
        loss, g_sp, g_head, dxs = run(sp, rest, xs, mbatch["targets"])
        (g_pre,) = pre_vjp(dxs)
        grads = {**jax.tree.map(jnp.add, g_pre, g_head), **g_sp}
        return loss, grads

    # ------------------------------------------------------------ optimizer (as the template)
    def lr_schedule(t):
        t = jnp.asarray(t, jnp.float32)
        W, T = c["warmup"], c["steps"]
        if c["schedule"] == "cosine":
            prog = jnp.minimum(1.0, (t - W) / max(1, T - W))
            after = c["lr"] * (c["min_lr_ratio"] + (1 - c["min_lr_ratio"]) * 0.5 * (1 + jnp.cos(jnp.pi * prog)))
        else:
            after = jnp.float32(c["lr"])
        return jnp.where(t < W, c["lr"] * (t + 1) / max(W, 1), after)

    def clip(max_norm):
        def update(u, s, params=None):
            scale = jnp.minimum(1.0, max_norm / (optax.global_norm(u) + 1e-6))
            return jax.tree.map(lambda g: g * scale, u), s
        return optax.GradientTransformation(lambda p: optax.EmptyState(), update)

    decay = {n: len(table[n][0] if n in table else table["blocks.0." + n[9:]][0]) >= 2 for n in params}
    opt = optax.adamw(lr_schedule, b1=c["betas"][0], b2=c["betas"][1], eps=c["eps"],
                      weight_decay=c["weight_decay"], mask=decay)
    if c["clip"]:
        opt = optax.chain(clip(c["clip"]), opt)
    repl = NamedSharding(mesh, P())

    def pick(path, leaf):
        for key in reversed(path):
            if getattr(key, "key", None) in shardings:
                return shardings[key.key]
        return repl

    opt_sh = jax.tree_util.tree_map_with_path(pick, jax.eval_shape(opt.init, params))
    opt_state = jax.jit(opt.init, out_shardings=opt_sh)(params)

    # ------------------------------------------------------------ data and the step
    # the step's batch as [M, b, ...] (grad_accum 1): micro-batch j = samples [j*b, (j+1)*b)
    batch_sh = NamedSharding(mesh, P(None, bspec))

    def global_batch(step):
        s = [sample(step * B + q, c, c["seed"] + 1) for q in range(B)]
        return {n: jax.device_put(np.stack([x[n] for x in s]).reshape(M, b, -1), batch_sh) for n in ("tokens", "targets")}

    def train_step(params, opt_state, batch):
        if pipe > 1 and sched == "1f1b":
            loss, grads = onef1b_loss_and_grads(params, batch)
        elif pipe > 1:
            loss, grads = jax.value_and_grad(pipelined_loss)(params, batch)
        else:  # one stage: the micro-batches one after the other (as gradient accumulation)
            def acc(carry, mb):
                l, g = jax.value_and_grad(loss_fn)(params, mb)
                return (carry[0] + l / M, jax.tree.map(lambda a, b_: a + b_ / M, carry[1], g)), None
            zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
            (loss, grads), _ = lax.scan(acc, zero, batch)
        gnorm = optax.global_norm(grads)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, "grad_norm": gnorm}

    with jax.set_mesh(mesh):
        step_fn = jax.jit(train_step, in_shardings=(shardings, opt_sh, {"tokens": batch_sh, "targets": batch_sh}),
                          out_shardings=(shardings, opt_sh, repl), donate_argnums=(0, 1))
        batch0 = global_batch(0)
        if args.hlo:
            import re
            txt = step_fn.lower(params, opt_state, batch0).compile().as_text()
            kinds = ["all-to-all", "collective-permute", "all-reduce", "all-gather", "reduce-scatter"]
            counts = {k: len(re.findall(rf"\b{k}(-start)?\(", txt)) for k in kinds}
            print("collectives", json.dumps(counts))
            if os.environ.get("SHOW_HLO"):
                for x in txt.splitlines():
                    if re.search(r"\b(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(-start)?\(", x):
                        print("   ", x.strip()[:200] + " ".join(re.findall(r"op_name=\"[^\"]*\"|source_line=[0-9]+", x)))
            if counts["all-to-all"]:
                line = next(x for x in txt.splitlines() if re.search(r"\ball-to-all(-start)?\(", x))
                print("collectives example:", line.strip()[:240])
        d0 = jax.devices()[0]
        held = sum(s.data.nbytes for a in params.values() for s in a.addressable_shards if s.device == d0)
        print(f"memory device0 params {held} bytes")
        out = open(args.metrics, "w") if args.metrics else None
        for step in range(args.steps):
            t0 = time.perf_counter()
            params, opt_state, m = step_fn(params, opt_state, batch0 if step == 0 else global_batch(step))
            m = {k: float(v) for k, v in m.items()}
            dt = time.perf_counter() - t0
            print(f"step {step + 1} loss {m['loss']:.6f} grad norm {m['grad_norm']:.5f} {dt * 1e3:.0f} ms", flush=True)
            if out:
                out.write(json.dumps({"step": step + 1, **m}) + "\n")
        final = from_state({n: np.asarray(a) for n, a in params.items()})
        assert list(final) == list(table)


if __name__ == "__main__":
    a = parse_args()
    if a.verify:
        sys.exit(0 if verify() else 1)
    main(a)
