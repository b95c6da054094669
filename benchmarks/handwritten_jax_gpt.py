"""Baseline: the smallest hand-written jax.jit train step for gpt-tiny.

Same model and mesh flag as the generated JAX program (prototypes/jax/gpt_train.py),
none of its plumbing: no checkpointing, metrics or host data pipeline. One batch is
placed on the devices once and reused, so the number is pure step time.

    python benchmarks/handwritten_jax_gpt.py --mesh data=2,fsdp=2,tensor=2 --steps 20
prints  ms/step (mean over the timed steps, after --warmup untimed ones) and the median; every step
waits for its loss.
"""

import argparse
import math
import time

ap = argparse.ArgumentParser()
ap.add_argument("--mesh", default="data=1")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--batch", type=int, default=16)
args = ap.parse_args()

AXES = ("data", "fsdp", "tensor")
sizes = dict.fromkeys(AXES, 1)
sizes.update({k: int(v) for k, v in (kv.split("=") for kv in args.mesh.split(","))})
shape = tuple(sizes[a] for a in AXES)

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", math.prod(shape))  # simulate the mesh on CPU
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

V, T, D, H, F, L = 256, 64, 128, 4, 512, 4
mesh = jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * 3)
BATCH, EMB = ("data", "fsdp"), "fsdp"
S = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731

# name -> (shape, partition spec); weights [in, out]
specs = {"wte": ((V, D), S("tensor", EMB)), "wpe": ((T, D), S(None, EMB)),
         "lnf_w": ((D,), S(EMB)), "lnf_b": ((D,), S(EMB))}
for i in range(L):
    specs.update({f"{i}.ln1_w": ((D,), S(EMB)), f"{i}.ln1_b": ((D,), S(EMB)),
                  f"{i}.q": ((D, D), S(EMB, "tensor")), f"{i}.k": ((D, D), S(EMB, "tensor")),
                  f"{i}.v": ((D, D), S(EMB, "tensor")), f"{i}.o": ((D, D), S("tensor", EMB)),
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
    B = tok.shape[0]
    resid = S(BATCH, None, None)
    x = jax.lax.with_sharding_constraint(p["wte"], S())[tok] + p["wpe"][None]
    mask = jnp.tril(jnp.ones((T, T), bool))
    for i in range(L):
        h = ln(x, p[f"{i}.ln1_w"], p[f"{i}.ln1_b"])
        q, k, v = (jnp.reshape(h @ p[f"{i}.{n}"], (B, T, H, D // H)) for n in "qkv")
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D // H)
        a = jax.nn.softmax(jnp.where(mask, s, -1e30), -1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(B, T, D) @ p[f"{i}.o"]
        h = ln(x, p[f"{i}.ln2_w"], p[f"{i}.ln2_b"])
        h = jax.nn.gelu(h @ p[f"{i}.fc"] + p[f"{i}.fc_b"], approximate=True)
        x = jax.lax.with_sharding_constraint(x + h @ p[f"{i}.proj"] + p[f"{i}.proj_b"], resid)
    logits = ln(x, p["lnf_w"], p["lnf_b"]) @ p["wte"].T
    return optax.softmax_cross_entropy_with_integer_labels(logits, tgt).mean()


opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
    optax.warmup_cosine_decay_schedule(0.0, 3e-4, 5, 20), b1=0.9, b2=0.95, weight_decay=0.1,
    mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)))


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
tok = jax.device_put(jax.random.randint(jax.random.key(1), (args.batch, T), 0, V), data)
tgt = jax.device_put(jax.random.randint(jax.random.key(2), (args.batch, T), 0, V), data)
train = jax.jit(step, in_shardings=(shardings, opt_sh, data, data),
                out_shardings=(shardings, opt_sh, S()), donate_argnums=(0, 1))

for _ in range(args.warmup):
    params, opt_state, loss = train(params, opt_state, tok, tgt)
loss.block_until_ready()
times = []
for _ in range(args.steps):  # each step waits for its loss, as a training loop that logs it does
    t0 = time.perf_counter()
    params, opt_state, loss = train(params, opt_state, tok, tgt)
    float(loss)
    times.append(time.perf_counter() - t0)
ms, median = sum(times) / len(times) * 1e3, sorted(times)[len(times) // 2] * 1e3
print(f"mesh={args.mesh} devices={jax.device_count()} batch={args.batch} loss={float(loss):.4f} ms/step={ms:.2f} "
      f"median_ms/step={median:.2f}")
