"""gpt-tiny: a hand-written JAX training program that follows docs/program.md.

This is the reference the compiler's JAX template is modelled on: a GPT decoder
(learned positions, pre-LN blocks, tied lm_head) trained with AdamW on a
(data, fsdp, tensor) device mesh. Everything a spec would decide lives in the
CONFIG block below; everything else is plain functions.

Usage (single process, simulated 8-device CPU mesh):
    python gpt_train.py --mesh data=2,fsdp=2,tensor=2 --steps 20 --metrics m.jsonl

Multi-process (one process per host, or several on one machine). Set, for every
process, before starting it (flags of the same name override):
    MITHRIL_COORDINATOR=127.0.0.1:12345   address of process 0's coordinator
    MITHRIL_NUM_PROCESSES=2               total number of processes
    MITHRIL_PROCESS_ID=0                  this process's rank (0 .. N-1)
On CPU each process then gets mesh_size / N simulated devices and uses gloo
collectives. On CPU, JAX_NUM_CPU_DEVICES (or XLA_FLAGS
--xla_force_host_platform_device_count) overrides the number of local devices.
"""

import argparse
import json
import math
import os
import sys
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

# ----------------------------------------------------------------------------
# CONFIG (what the compiler fills in from the spec)
# ----------------------------------------------------------------------------
MODEL = dict(vocab=256, seq=64, d_model=128, n_heads=4, d_ff=512, n_layers=4, ln_eps=1e-5)
INPUTS = [  # model inputs in spec order: (name, shape without batch, dtype, high)
    ("tokens", (64,), "int32", 256),
    ("targets", (64,), "int32", 256),
]
TRAIN = dict(
    global_batch=16, steps=20, seed=0, grad_accum=1,
    lr=3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1,
    schedule="cosine", warmup=5, min_lr_ratio=0.0, clip_norm=1.0,
    param_dtype="float32", compute_dtype="float32", remat="none",
)
MESH_AXES = ("data", "fsdp", "tensor")  # canonical order; missing axes have size 1
DEFAULT_MESH = "data=1"
# logical axis -> mesh axes. A logical axis missing here is replicated.
AXIS_RULES = {
    "batch": ("data", "fsdp"),
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "mlp": "tensor",
}

# ----------------------------------------------------------------------------
# Command line and process set-up. Importing jax is fine, but setup_jax must run
# before anything touches a device: the CPU device count and the distributed
# runtime can only be configured before the backend initialises.
# ----------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=TRAIN["steps"])
    p.add_argument("--resume", metavar="DIR")
    p.add_argument("--data", metavar="PATH", help="directory of .npy per input, or a text file")
    p.add_argument("--metrics", metavar="FILE")
    p.add_argument("--init-params", metavar="FILE.npz")
    p.add_argument("--export-params", metavar="FILE.npz")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--checkpoint-dir", metavar="DIR")
    p.add_argument("--checkpoint-every", type=int, default=0, help="0: only at the end")
    p.add_argument("--seed", type=int, default=TRAIN["seed"])
    p.add_argument("--mesh", default=DEFAULT_MESH, help="e.g. data=2,fsdp=2,tensor=2")
    p.add_argument("--grad-accum", type=int, default=TRAIN["grad_accum"])
    p.add_argument("--compute-dtype", default=TRAIN["compute_dtype"], choices=["float32", "bfloat16"])
    p.add_argument("--remat", default=TRAIN["remat"], choices=["none", "selective", "full"])
    p.add_argument("--coordinator", default=os.environ.get("MITHRIL_COORDINATOR"))
    p.add_argument("--num-processes", type=int, default=int(os.environ.get("MITHRIL_NUM_PROCESSES", "1")))
    p.add_argument("--process-id", type=int, default=int(os.environ.get("MITHRIL_PROCESS_ID", "0")))
    return p.parse_args(argv)


def die(msg):
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def parse_mesh(text):
    """'data=2,tensor=2' -> (2, 1, 2) in canonical axis order."""
    sizes = dict.fromkeys(MESH_AXES, 1)
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        if name.strip() not in sizes or not value.strip().isdigit() or int(value) < 1:
            die(f"bad --mesh entry {part!r}; expected axis=size with axis in {MESH_AXES}")
        sizes[name.strip()] = int(value)
    return tuple(sizes[a] for a in MESH_AXES)


def setup_jax(mesh_shape, num_processes, process_id, coordinator):
    """Configure devices / distributed runtime; must run before any JAX computation."""
    mesh_size = math.prod(mesh_shape)
    if mesh_size % num_processes:
        die(f"mesh size {mesh_size} is not divisible by {num_processes} processes")
    # Without an accelerator, simulate the mesh with CPU devices: each process
    # contributes mesh_size / num_processes of them. The setting only affects the
    # CPU backend, so it is harmless when a GPU/TPU is present. Respect an
    # explicit user setting (this is how a wrong device count can be provoked).
    user_set = "JAX_NUM_CPU_DEVICES" in os.environ or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    if not user_set:
        jax.config.update("jax_num_cpu_devices", mesh_size // num_processes)
    if num_processes > 1:
        if not coordinator:
            die("multi-process run needs MITHRIL_COORDINATOR (host:port) or --coordinator")
        # CPU collectives across processes need gloo (the default 'none' fails at the first psum).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id)
    if jax.device_count() != mesh_size:
        die(f"--mesh needs {mesh_size} devices ({num_processes} process(es) x {mesh_size // num_processes}), "
            f"but {jax.device_count()} are visible ({jax.process_count()} process(es) x {jax.local_device_count()})")


# ----------------------------------------------------------------------------
# Parameters: canonical names, shapes, logical axes, init. One table drives
# init, sharding, export and the dry-run, so they cannot disagree.
# ----------------------------------------------------------------------------


def param_table(cfg=MODEL):
    """name -> (canonical shape, logical axes, init). init is ('normal', std) | 'zeros' | 'ones'."""
    d, f, V, T = cfg["d_model"], cfg["d_ff"], cfg["vocab"], cfg["seq"]
    normal = ("normal", 0.02)
    t = {
        "wte.weight": ((V, d), ("vocab", "embed"), normal),
        "wpe.weight": ((T, d), (None, "embed"), normal),
    }
    for i in range(cfg["n_layers"]):
        b = f"blocks.{i}."
        t[b + "ln1.weight"] = ((d,), ("embed",), "ones")
        t[b + "ln1.bias"] = ((d,), ("embed",), "zeros")
        for proj in "qkv":  # canonical [in, out]; out = heads*head_dim is the sharded "heads" axis
            t[b + f"attn.{proj}.weight"] = ((d, d), ("embed", "heads"), normal)
        t[b + "attn.o.weight"] = ((d, d), ("heads", "embed"), normal)
        t[b + "ln2.weight"] = ((d,), ("embed",), "ones")
        t[b + "ln2.bias"] = ((d,), ("embed",), "zeros")
        t[b + "mlp.fc.weight"] = ((d, f), ("embed", "mlp"), normal)
        t[b + "mlp.fc.bias"] = ((f,), ("mlp",), "zeros")
        t[b + "mlp.proj.weight"] = ((f, d), ("mlp", "embed"), normal)
        t[b + "mlp.proj.bias"] = ((d,), ("embed",), "zeros")
    t["ln_f.weight"] = ((d,), ("embed",), "ones")
    t["ln_f.bias"] = ((d,), ("embed",), "zeros")
    return t


def init_param_numpy(name, shape, init, seed):
    """docs/program.md: values depend only on (seed, name), never on the mesh."""
    if init == "zeros":
        return np.zeros(shape, np.float32)
    if init == "ones":
        return np.ones(shape, np.float32)
    kind, std = init
    assert kind == "normal"
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)


def logical_to_spec(axes, mesh):
    """Logical axes -> PartitionSpec. Mesh axes of size 1 are dropped (keeps specs readable),
    and a mesh axis is used at most once per array."""
    used, spec = set(), []
    for ax in axes:
        rule = AXIS_RULES.get(ax) if ax else None
        rule = (rule,) if isinstance(rule, str) else (rule or ())
        mesh_axes = tuple(m for m in rule if mesh.shape[m] > 1 and m not in used)
        used.update(mesh_axes)
        spec.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return P(*spec)


def make_param_shardings(mesh, table):
    shardings = {}
    for name, (shape, axes, _) in table.items():
        spec = logical_to_spec(axes, mesh)
        for dim, s in zip(shape, spec):  # a dim must split evenly over its mesh axes
            n = math.prod(mesh.shape[a] for a in ((s,) if isinstance(s, str) else (s or ())))
            if dim % n:
                die(f"{name}: dim {dim} is not divisible by {n} ({spec})")
        shardings[name] = NamedSharding(mesh, spec)
    return shardings


def init_params(table, shardings, seed, param_dtype, init_file=None):
    """Host numpy values -> global jax.Arrays. make_array_from_callback lets every
    process fill only its own shards (works single- and multi-process)."""
    loaded = dict(np.load(init_file)) if init_file else None
    params = {}
    for name, (shape, _, init) in table.items():
        if loaded is not None:
            if name not in loaded or loaded[name].shape != shape:
                die(f"--init-params: missing or mis-shaped {name} (want {shape})")
            host = np.asarray(loaded[name], np.float32)
        else:
            host = init_param_numpy(name, shape, init, seed)
        host = host.astype(param_dtype)
        params[name] = jax.make_array_from_callback(shape, shardings[name], lambda idx, h=host: h[idx])
    return params


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------


def layer_norm(x, w, b, eps):
    # Statistics in float32 even under bf16 compute: the mean/var of 128 values in
    # bf16 loses most of its mantissa.
    x32 = x.astype(jnp.float32)
    mu = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mu).mean(-1, keepdims=True)
    y = (x32 - mu) * jax.lax.rsqrt(var + eps)
    return (y * w.astype(jnp.float32) + b.astype(jnp.float32)).astype(x.dtype)


def attention(x, p, pre, n_heads):
    B, T, D = x.shape
    hd = D // n_heads
    dt = x.dtype
    q = (x @ p[pre + "q.weight"].astype(dt)).reshape(B, T, n_heads, hd)
    k = (x @ p[pre + "k.weight"].astype(dt)).reshape(B, T, n_heads, hd)
    v = (x @ p[pre + "v.weight"].astype(dt)).reshape(B, T, n_heads, hd)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(hd)
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)  # softmax in float32
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, T, D)
    return out @ p[pre + "o.weight"].astype(dt)


def mlp(x, p, pre):
    dt = x.dtype
    h = x @ p[pre + "fc.weight"].astype(dt) + p[pre + "fc.bias"].astype(dt)
    h = jax.nn.gelu(h, approximate=True)
    return h @ p[pre + "proj.weight"].astype(dt) + p[pre + "proj.bias"].astype(dt)


def decoder_block(x, p, i, cfg):
    pre = f"blocks.{i}."
    eps = cfg["ln_eps"]
    h = layer_norm(x, p[pre + "ln1.weight"], p[pre + "ln1.bias"], eps)
    x = x + attention(h, p, pre + "attn.", cfg["n_heads"])  # res1
    h = layer_norm(x, p[pre + "ln2.weight"], p[pre + "ln2.bias"], eps)
    return x + mlp(h, p, pre + "mlp.")  # res2


REMAT_POLICIES = {
    "selective": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep weight matmuls, recompute the rest
    "full": jax.checkpoint_policies.nothing_saveable,  # keep only the block input
}


def forward(params, tokens, cfg, compute_dtype, remat, residual_sharding):
    """tokens [B, T] int -> logits [B, T, vocab] in compute dtype."""
    T = tokens.shape[1]
    wte = params["wte.weight"].astype(compute_dtype)
    # The lookup reads a replicated copy of the (vocab x embed)-sharded table, so the gather's
    # output follows the batch sharding of `tokens`; otherwise the SPMD partitioner shards the
    # output along embed and warns about an "involuntary full rematerialization".
    table = jax.lax.with_sharding_constraint(wte, NamedSharding(residual_sharding.mesh, P()))
    x = table[tokens] + params["wpe.weight"][:T].astype(compute_dtype)[None]
    x = jax.lax.with_sharding_constraint(x, residual_sharding)
    block = decoder_block
    if remat != "none":
        # Per-block checkpoint: the backward pass recomputes inside one block at a time.
        block = jax.checkpoint(decoder_block, policy=REMAT_POLICIES[remat], static_argnums=(2, 3))
    for i in range(cfg["n_layers"]):
        x = block(x, params, i, cfg)
        # Pin the residual stream between blocks: batch over (data, fsdp), rest replicated.
        # Without this XLA may keep it sharded along embed after an fsdp weight and add collectives.
        x = jax.lax.with_sharding_constraint(x, residual_sharding)
    x = layer_norm(x, params["ln_f.weight"], params["ln_f.bias"], cfg["ln_eps"])
    return x @ wte.T  # lm_head tied to wte


def loss_fn(params, batch, cfg, compute_dtype, remat, residual_sharding):
    logits = forward(params, batch["tokens"], cfg, compute_dtype, remat, residual_sharding)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["targets"])
    return losses.mean()


# ----------------------------------------------------------------------------
# Optimizer: documented schedule, torch-style clipping, AdamW with a decay mask
# ----------------------------------------------------------------------------


def make_schedule(tc, total_steps):
    """lr at 0-based step t exactly as docs/program.md writes it (an optax-compatible callable).
    Written out rather than composed from optax.join_schedules/cosine_decay_schedule because
    optax's linear warmup starts at 0 (doc: lr*(t+1)/W) and its cosine clamps at T."""
    lr, W, m, kind = tc["lr"], tc["warmup"], tc["min_lr_ratio"], tc["schedule"]

    def schedule(t):
        t = jnp.asarray(t, jnp.float32)
        warm = lr * (t + 1) / max(W, 1)
        if kind == "constant":
            after = jnp.float32(lr)
        elif kind == "cosine":
            after = lr * (m + (1 - m) * 0.5 * (1 + jnp.cos(jnp.pi * (t - W) / max(1, total_steps - W))))
        else:
            raise ValueError(kind)
        return jnp.where(t < W, warm, after) if W > 0 else after

    return schedule


def clip_by_global_norm_torch(max_norm):
    """scale = min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_ does.
    (optax.clip_by_global_norm divides by norm without the 1e-6, a 1e-6 relative difference.)"""

    def update(updates, state, params=None):
        del params
        scale = jnp.minimum(1.0, max_norm / (optax.global_norm(updates) + 1e-6))
        return jax.tree.map(lambda g: g * scale, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(tc, params_shapes, total_steps):
    decay_mask = {name: len(s.shape) >= 2 for name, s in params_shapes.items()}
    return optax.chain(
        clip_by_global_norm_torch(tc["clip_norm"]),
        optax.adamw(make_schedule(tc, total_steps), b1=tc["b1"], b2=tc["b2"], eps=tc["eps"],
                    weight_decay=tc["weight_decay"], mask=decay_mask),
    )


def opt_state_shardings(optimizer, params_abstract, param_shardings, mesh):
    """Optimizer-state leaves keyed by a parameter name (adam mu/nu) take that parameter's
    sharding; everything else (the step count) is replicated. Needed because opt.init on
    sharded params leaves `count` on one device and jit then rejects it."""
    abstract = jax.eval_shape(optimizer.init, params_abstract)

    def pick(path, leaf):
        for key in reversed(path):
            name = getattr(key, "key", None)
            if name in param_shardings and leaf.shape == params_abstract[name].shape:
                return param_shardings[name]
        return NamedSharding(mesh, P())

    return jax.tree_util.tree_map_with_path(pick, abstract)


# ----------------------------------------------------------------------------
# Data: by global sample index, so every mesh sees the same batches in the same order.
# A batch is laid out [A, B/A, ...] (A = grad-accum micro-batches) so that each
# device's rows of every micro-batch are local and the scan needs no data movement.
# ----------------------------------------------------------------------------


class DataSource:
    def __init__(self, path, data_seed):
        self.data_seed = data_seed
        self.kind, self.arrays, self.text = "synthetic", None, None
        if path and os.path.isdir(path):
            self.kind = "arrays"
            self.arrays = {n: np.load(os.path.join(path, n + ".npy"), mmap_mode="r") for n, *_ in INPUTS}
        elif path:
            self.kind = "text"
            self.text = np.memmap(path, dtype=np.uint8, mode="r")
            if len(self.text) < MODEL["seq"] + 2:
                die(f"--data {path}: text shorter than seq+2 bytes")

    def samples(self, indices):
        """Global sample indices -> {input name: np.ndarray [len(indices), ...]}."""
        out = {n: np.empty((len(indices),) + shape, dtype) for n, shape, dtype, _ in INPUTS}
        for j, i in enumerate(indices):
            if self.kind == "arrays":
                for n, *_ in INPUTS:
                    a = self.arrays[n]
                    out[n][j] = a[i % a.shape[0]]
            elif self.kind == "text":
                T = MODEL["seq"]
                o = (i * 7919) % (len(self.text) - T - 1)
                out["tokens"][j] = self.text[o:o + T]
                out["targets"][j] = self.text[o + 1:o + T + 1]
            else:
                rng = np.random.default_rng([self.data_seed, i])
                for n, shape, dtype, high in INPUTS:
                    if np.issubdtype(np.dtype(dtype), np.integer):
                        out[n][j] = rng.integers(0, high, size=shape, dtype=np.int64).astype(dtype)
                    else:
                        out[n][j] = rng.standard_normal(shape, dtype=np.float32)
        return out


def local_rows(sharding, global_shape):
    """The contiguous range of micro-batch rows (axis 1) this process's devices hold."""
    idx = sharding.addressable_devices_indices_map(global_shape).values()
    rows = sorted({r for s in idx for r in range(*s[1].indices(global_shape[1]))})
    if rows != list(range(rows[0], rows[-1] + 1)):
        die("this process's batch rows are not contiguous; reorder the mesh")
    return rows[0], rows[-1] + 1


def global_batch(source, step, B, A, batch_shardings):
    """Each process reads only its rows, then the global [A, B/A, ...] arrays are assembled."""
    mb = B // A
    out = {}
    for name, shape, dtype, _ in INPUTS:
        gshape = (A, mb) + shape
        lo, hi = local_rows(batch_shardings[name], gshape)
        idx = [step * B + k * mb + r for k in range(A) for r in range(lo, hi)]
        local = source.samples(idx)[name].reshape((A, hi - lo) + shape)
        out[name] = jax.make_array_from_process_local_data(batch_shardings[name], local, gshape)
    return out


# ----------------------------------------------------------------------------
# Train step
# ----------------------------------------------------------------------------


def make_train_step(optimizer, schedule, cfg, A, compute_dtype, remat, residual_sharding):
    def micro_loss(params, mb):
        # docs: with accumulation each micro-batch's mean loss is divided by A
        return loss_fn(params, mb, cfg, compute_dtype, remat, residual_sharding) / A

    grad_fn = jax.value_and_grad(micro_loss)

    def train_step(params, opt_state, batch):
        if A == 1:
            loss, grads = grad_fn(params, jax.tree.map(lambda x: x[0], batch))
        else:
            def body(carry, mb):
                loss_acc, g_acc = carry
                loss, g = grad_fn(params, mb)
                return (loss_acc + loss, jax.tree.map(jnp.add, g_acc, g)), None

            zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
            (loss, grads), _ = jax.lax.scan(body, zero, batch)
        grad_norm = optax.global_norm(grads)  # before clipping, for the metrics
        # lr of this update = schedule(count of updates so far), read from the schedule's own counter
        lr = schedule(optax.tree_utils.tree_get(
            opt_state, "count", filtering=lambda path, _: path[-1].tuple_name == "ScaleByScheduleState"))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": grad_norm, "lr": lr}

    return train_step


# ----------------------------------------------------------------------------
# Checkpoints (orbax): params + optimizer state + step, written atomically
# (orbax writes to a temporary directory and renames it when complete).
# orbax is imported lazily: it adds ~0.3 s to start-up and most runs never checkpoint.
# ----------------------------------------------------------------------------


def checkpoint_manager(directory, max_to_keep=2):
    import orbax.checkpoint as ocp
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=False)
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save_checkpoint(mngr, step, params, opt_state):
    import orbax.checkpoint as ocp
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
        meta=ocp.args.JsonSave({"step": step, "model": "gpt-tiny"})))
    mngr.wait_until_finished()


def restore_checkpoint(directory, params, opt_state):
    """Restore the latest checkpoint into the shardings of (params, opt_state)."""
    import orbax.checkpoint as ocp
    mngr = checkpoint_manager(directory)
    step = mngr.latest_step()
    if step is None:
        die(f"--resume {directory}: no checkpoint found")
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          {"params": params, "opt_state": opt_state})
    got = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                     meta=ocp.args.JsonRestore()))
    mngr.close()
    return got["state"]["params"], got["state"]["opt_state"], int(got["meta"]["step"])


# ----------------------------------------------------------------------------
# Reporting helpers
# ----------------------------------------------------------------------------


def to_host(x):
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def device0_bytes(abstract_tree, shardings_tree):
    """Bytes of the shards that jax.devices()[0] holds (per-device shape x itemsize)."""
    total = 0
    for a, s in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings_tree)):
        total += math.prod(s.shard_shape(a.shape)) * np.dtype(a.dtype).itemsize
    return total


def dry_run(mesh, table, param_shardings, params_abstract, opt_abstract, opt_shardings):
    print(f"mesh: {dict(mesh.shape)} devices={mesh.devices.size} processes={jax.process_count()} "
          f"platform={jax.devices()[0].platform}")
    print(f"{'parameter':32s} {'canonical':>12s} {'logical axes':24s} {'spec':28s} per-device")
    for name, (shape, axes, _) in table.items():
        s = param_shardings[name]
        print(f"{name:32s} {str(list(shape)):>12s} {str(axes):24s} {str(tuple(s.spec)):28s} "
              f"{list(s.shard_shape(shape))}")
    pb = device0_bytes(params_abstract, param_shardings)
    ob = device0_bytes(opt_abstract, opt_shardings)
    n = sum(math.prod(s[0]) for s in table.values())
    print(f"parameters: {n} ({n * 4} bytes fp32 total)")
    print(f"device 0 bytes: params {pb} + optimizer state {ob} = {pb + ob}")


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------


def main(args):
    mesh_shape = parse_mesh(args.mesh)
    setup_jax(mesh_shape, args.num_processes, args.process_id, args.coordinator)  # before any device use
    cfg, tc = MODEL, dict(TRAIN)
    B, A = tc["global_batch"], args.grad_accum
    is_main = jax.process_index() == 0
    # Auto axes: GSPMD propagates shardings from in_shardings and the constraints below.
    # (jax.make_mesh defaults to Explicit axes in jax 0.10, which this program is not written for.)
    mesh = jax.make_mesh(mesh_shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    if B % A or (B // A) % dp:
        die(f"global batch {B} / grad_accum {A} must be divisible by data*fsdp = {dp}")

    table = param_table(cfg)
    param_dtype = jnp.dtype(tc["param_dtype"])
    compute_dtype = jnp.dtype(args.compute_dtype)
    param_shardings = make_param_shardings(mesh, table)
    params_abstract = {n: jax.ShapeDtypeStruct(shape, param_dtype) for n, (shape, _, _) in table.items()}
    optimizer = make_optimizer(tc, params_abstract, tc["steps"])  # T comes from the spec, not --steps
    opt_shardings = opt_state_shardings(optimizer, params_abstract, param_shardings, mesh)

    if args.dry_run:
        if is_main:
            dry_run(mesh, table, param_shardings, params_abstract,
                    jax.eval_shape(optimizer.init, params_abstract), opt_shardings)
        return

    batch_spec = logical_to_spec((None, "batch"), mesh)  # [A, B/A, ...]: rows over (data, fsdp)
    batch_shardings = {n: NamedSharding(mesh, batch_spec) for n, *_ in INPUTS}
    residual_sharding = NamedSharding(mesh, logical_to_spec(("batch", None, None), mesh))
    replicated = NamedSharding(mesh, P())

    params = init_params(table, param_shardings, args.seed, param_dtype, args.init_params)
    opt_state = jax.jit(optimizer.init, out_shardings=opt_shardings)(params)
    start = 0
    if args.resume:
        params, opt_state, start = restore_checkpoint(args.resume, params, opt_state)
        if is_main:
            print(f"resumed from {args.resume} at step {start}", flush=True)

    schedule = make_schedule(tc, tc["steps"])
    step_fn = jax.jit(
        make_train_step(optimizer, schedule, cfg, A, compute_dtype, args.remat, residual_sharding),
        in_shardings=(param_shardings, opt_shardings, batch_shardings),
        out_shardings=(param_shardings, opt_shardings, replicated),
        donate_argnums=(0, 1),  # params/opt state are updated in place
    )
    source = DataSource(args.data, args.seed + 1)
    mngr = checkpoint_manager(args.checkpoint_dir) if args.checkpoint_dir else None
    metrics_file = open(args.metrics, "a" if args.resume else "w") if (args.metrics and is_main) else None

    for step in range(start, args.steps):
        t0 = time.perf_counter()
        batch = global_batch(source, step, B, A, batch_shardings)
        params, opt_state, m = step_fn(params, opt_state, batch)
        m = {k: float(v) for k, v in m.items()}  # float() waits for the step: honest timing
        dt = time.perf_counter() - t0
        rec = {"step": step + 1, "loss": m["loss"], "lr": m["lr"], "grad_norm": m["grad_norm"],
               "step_time_s": dt, "samples_per_s": B / dt, "tokens_per_s": B * cfg["seq"] / dt}
        if metrics_file:
            metrics_file.write(json.dumps(rec) + "\n")
            metrics_file.flush()
        if is_main:
            print(f"step {step + 1:4d} loss {m['loss']:.6f} lr {m['lr']:.3e} gnorm {m['grad_norm']:.4f} "
                  f"{dt * 1e3:.1f} ms", flush=True)
        done = step + 1
        if mngr and ((args.checkpoint_every and done % args.checkpoint_every == 0) or done == args.steps):
            save_checkpoint(mngr, done, params, opt_state)

    if mngr:
        mngr.close()
    if metrics_file:
        metrics_file.close()
    if args.export_params:
        host = {n: to_host(p).astype(np.float32) for n, p in params.items()}  # collective: all processes
        if is_main:
            tmp = args.export_params + ".tmp.npz"
            np.savez(tmp, **host)
            os.replace(tmp, args.export_params)


if __name__ == "__main__":
    main(parse_args())
    if jax.process_count() > 1:
        jax.distributed.shutdown()
