"""Hand-written baseline: a GPT trained with one jax.jit step, written the way one would by hand, for
benchmarks/jax_gpt_vs_handwritten.py.

The model and run are the ones the spec's program trains (gpt-tiny, or the GPT-2 small shape with
--vocab 50257 --layers 12 --heads 12 --d 768 --ff 3072 --seq 256 --batch 4): token and position
embeddings, pre-LayerNorm blocks (eps 1e-5) with causal attention (q, k and v from one fused [d, 3d]
matmul, nanoGPT's c_attn; no bias in the attention projections) and a tanh-GELU MLP with biases, a final
LayerNorm, the lm_head tied to the token embedding; float32; AdamW (betas 0.9, 0.95, eps 1e-8, weight decay
0.1 on parameters of 2 or more dimensions) after clipping the global gradient norm to 1.0; the spec's
schedule (linear warmup `lr*(t+1)/W`, then cosine to 0 at `--lr-steps`). None of the generated program's
conventions: parameters from jax.random, a Python loop over the layers, no metrics file or checkpoints.

The loop is nanoGPT's train.py in JAX: the jitted step (state donated) is dispatched, the next batch is
drawn meanwhile (one vectorised numpy draw of synthetic token ids, placed on the devices), then
`float(loss)` every `--log-interval` iterations (nanoGPT's default: 1) and one printed line per
iteration, flushed, with its wall-clock time since the previous iteration's line (everything the loop
does: the batch, the step, the logging).

    python benchmarks/handwritten_jax_gpt.py --steps 20
    python benchmarks/handwritten_jax_gpt.py --mesh data=2,fsdp=2,tensor=2 --steps 20   # simulated CPU mesh
"""

import argparse
import json
import math
import time

ap = argparse.ArgumentParser()
ap.add_argument("--mesh", default="data=1", help="axis=size,... over data, fsdp, tensor (simulated on CPU)")
ap.add_argument("--steps", type=int, default=20, help="iterations to run (the first compiles)")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--vocab", type=int, default=256)
ap.add_argument("--seq", type=int, default=64)
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--heads", type=int, default=4)
ap.add_argument("--ff", type=int, default=512)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--lr", type=float, default=3e-4)
ap.add_argument("--warmup", type=int, default=5, help="warmup steps of the lr schedule")
ap.add_argument("--lr-steps", type=int, default=20, help="length of the lr schedule (the spec's training.steps)")
ap.add_argument("--log-interval", type=int, default=1, help="read the loss every N iterations (nanoGPT: 1)")
args = ap.parse_args()

AXES = ("data", "fsdp", "tensor")
sizes = dict.fromkeys(AXES, 1)
sizes.update({k: int(v) for k, v in (kv.split("=") for kv in args.mesh.split(","))})
shape = tuple(sizes[a] for a in AXES)

import jax

jax.config.update("jax_num_cpu_devices", math.prod(shape))  # simulate the mesh on CPU (before any device use)
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

V, T, D, H, F, L, B = args.vocab, args.seq, args.d, args.heads, args.ff, args.layers, args.batch
mesh = jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * 3)
BATCH, EMB = ("data", "fsdp"), "fsdp"


def S(*spec):
    return NamedSharding(mesh, P(*spec))


# name -> (shape, sharding); weights [in, out]
specs = {"wte": ((V, D), S("tensor", EMB)), "wpe": ((T, D), S(None, EMB)), "lnf_w": ((D,), S(EMB)),
         "lnf_b": ((D,), S(EMB))}
for i in range(L):
    specs.update({f"{i}.ln1_w": ((D,), S(EMB)), f"{i}.ln1_b": ((D,), S(EMB)),
                  f"{i}.c_attn": ((D, 3 * D), S(EMB, "tensor")), f"{i}.c_proj": ((D, D), S("tensor", EMB)),
                  f"{i}.ln2_w": ((D,), S(EMB)), f"{i}.ln2_b": ((D,), S(EMB)),
                  f"{i}.fc": ((D, F), S(EMB, "tensor")), f"{i}.fc_b": ((F,), S("tensor")),
                  f"{i}.proj": ((F, D), S("tensor", EMB)), f"{i}.proj_b": ((D,), S(EMB))})
shardings = {k: s for k, (_, s) in specs.items()}


def init(key):
    keys = iter(jax.random.split(key, len(specs)))
    p = {}
    for k, (shp, _) in specs.items():
        kk = next(keys)
        p[k] = (jnp.ones(shp) if k.endswith("_w") else jnp.zeros(shp) if k.endswith("_b")
                else 0.02 * jax.random.normal(kk, shp))
    return p


def ln(x, w, b):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b


def loss_fn(p, tok, tgt):
    x = jax.lax.with_sharding_constraint(p["wte"], S())[tok] + p["wpe"][None]
    mask = jnp.tril(jnp.ones((T, T), bool))
    for i in range(L):
        h = ln(x, p[f"{i}.ln1_w"], p[f"{i}.ln1_b"])
        q, k, v = (a.reshape(B, T, H, D // H) for a in jnp.split(h @ p[f"{i}.c_attn"], 3, axis=-1))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D // H)
        a = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), -1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(B, T, D) @ p[f"{i}.c_proj"]
        h = ln(x, p[f"{i}.ln2_w"], p[f"{i}.ln2_b"])
        h = jax.nn.gelu(h @ p[f"{i}.fc"] + p[f"{i}.fc_b"], approximate=True)
        x = jax.lax.with_sharding_constraint(x + h @ p[f"{i}.proj"] + p[f"{i}.proj_b"], S(BATCH, None, None))
    logits = ln(x, p["lnf_w"], p["lnf_b"]) @ p["wte"].T
    return optax.softmax_cross_entropy_with_integer_labels(logits, tgt).mean()


def lr_at(t):
    """The spec's schedule at 0-based step t."""
    t = jnp.asarray(t, jnp.float32)
    progress = jnp.minimum(1.0, (t - args.warmup) / max(1, args.lr_steps - args.warmup))
    return jnp.where(t < args.warmup, args.lr * (t + 1) / max(args.warmup, 1),
                     args.lr * 0.5 * (1 + jnp.cos(jnp.pi * progress)))


opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
    lr_at, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)))


def step(p, s, tok, tgt):
    loss, g = jax.value_and_grad(loss_fn)(p, tok, tgt)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s, loss


params = jax.jit(init, out_shardings=shardings)(jax.random.key(0))
# adam moments take their parameter's sharding (found by dict key in the path); counts replicated
opt_sh = jax.tree_util.tree_map_with_path(
    lambda path, x: next((shardings[k.key] for k in path if getattr(k, "key", None) in shardings), S()),
    jax.eval_shape(opt.init, params))
opt_state = jax.jit(opt.init, out_shardings=opt_sh)(params)
data = S(BATCH, None)
train = jax.jit(step, in_shardings=(shardings, opt_sh, data, data),
                out_shardings=(shardings, opt_sh, S()), donate_argnums=(0, 1))


def get_batch(it):
    """Iteration `it`'s synthetic batch: token ids and targets, one numpy draw, on the devices."""
    ids = np.random.default_rng([1, it]).integers(0, V, (2, B, T), dtype=np.int32)
    return jax.device_put(ids[0], data), jax.device_put(ids[1], data)


tok, tgt = get_batch(0)
step_ms = []
t0 = time.perf_counter()
for it in range(args.steps):
    params, opt_state, loss = train(params, opt_state, tok, tgt)  # returns at once: the device works
    tok, tgt = get_batch(it + 1)  # meanwhile, draw the next batch
    if it % args.log_interval == 0 or it == args.steps - 1:
        lossf = float(loss)  # waits for the step
    t1 = time.perf_counter()
    dt, t0 = t1 - t0, t1
    step_ms.append(dt * 1e3)
    print(f"iter {it + 1}: loss {lossf:.4f}, time {dt * 1e3:.2f}ms", flush=True)
print(json.dumps({"mesh": args.mesh, "devices": jax.device_count(), "step_ms": step_ms}), flush=True)
