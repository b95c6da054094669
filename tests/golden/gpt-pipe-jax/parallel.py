"""gpt-pipe: the processes and devices, the mesh and how it is applied (the pipeline schedule): the train
state's names, the optimizer state and the shardings of all of it;
what each device holds (--dry-run)."""

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# isort: off
# fmt: off
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import (BUFFERS, COMPUTE_DTYPE, INPUT_LAYOUTS, MESH, MICROBATCHES, PARAMS, PARAM_DTYPE,
                    REPEATS, STATE_LAYOUTS)
from model import cross_entropy, decoder_stack, embedding, layer_norm
from runtime.jax.devices import mesh_of, start_devices
from runtime.jax.optimizers import shardings_by_param
from runtime.jax.placement import stack_of
# fmt: on
# isort: on


# what the spec decided that only this file uses (the settings several files share: config.py)
BUFFER_LAYOUTS = {}
TF32 = True  # on GPUs: float32 matmuls and convolutions in TensorFloat-32 (precision.tf32)


def pre_forward(p, batch):
    """The layers before the pipelined `blocks` (the plan's first stage), in the compute dtype: a
    micro-batch of inputs -> the input of `blocks`. They run outside the pipeline, on every pipe rank."""
    tokens = batch["tokens"]
    wte = embedding(tokens, p["wte.weight"])
    wte = jax.lax.with_sharding_constraint(wte, P("data", None, None))
    wpe = wte + p["wpe.weight"][: wte.shape[1]]
    return wpe


def post_loss(p, blocks, batch):
    """The layers after the pipelined `blocks` (the plan's last stage) and the loss: the output of
    `blocks` for a micro-batch -> its mean loss (float32)."""
    ln_f = layer_norm(blocks, p["ln_f.weight"], p["ln_f.bias"], eps=1e-05)
    lm_head = ln_f @ p["lm_head.weight"]
    targets = batch["targets"]
    return cross_entropy(lm_head, targets)


# ----------------------------------------------------------------------------
# Pipeline: the 4 copies of `blocks` in 2 stages of 2 over the `pipe` axis (2 ranks),
# schedule 1f1b, 4 micro-batches (docs/program.md "Pipeline stages").
# jax.shard_map is manual over `pipe` only: inside it the other mesh axes stay automatic, so the block
# runs as it does without a pipeline (tensor-parallel collectives and all). The layers before and after
# `blocks` are not pipelined: their parameters are replicated over `pipe` (an SPMD program cannot keep
# an array on some pipe ranks only), the layers before it run on every pipe rank, the head once per
# micro-batch.
# ----------------------------------------------------------------------------
PIPE = 2  # pipe ranks
VIRTUAL_STAGES = 1  # stages per pipe rank (stage v * PIPE + r on rank r)
PER_STAGE = 2  # copies of `blocks` per stage
PIPELINE_SCHEDULE = "1f1b"
STACKED = "blocks.*."  # the train state's names of the stacked copies start with it
# Row q of the stacked arrays holds copy STACK_ORDER[q]. Pipe rank r holds a contiguous block of rows: the
# copies of its stages r, r + PIPE, ... (stage s runs copies s * PER_STAGE ... (s + 1) * PER_STAGE - 1).
STACK_ORDER = tuple(
    (v * PIPE + r) * PER_STAGE + c
    for r in range(PIPE)
    for v in range(VIRTUAL_STAGES)
    for c in range(PER_STAGE)
)


def varying(tree):
    """Marks values as differing between pipe ranks: lax.scan carries and the branches of lax.cond must
    agree on it (and pcast of a value that already varies is an error)."""

    def cast(a):
        return (
            a
            if "pipe" in jax.typeof(a).manual_axis_type.varying
            else jax.lax.pcast(a, ("pipe",), to="varying")
        )

    return jax.tree.map(cast, tree)


def pipeline_stage(sp, chunk, x):
    """Stage `chunk` (0 .. VIRTUAL_STAGES - 1) of this pipe rank: PER_STAGE copies of the block, whose
    parameters are the rows chunk * PER_STAGE ... of this rank's stacked arrays `sp`."""
    rows = {
        name: jax.lax.dynamic_slice_in_dim(w, chunk * PER_STAGE, PER_STAGE)
        for name, w in sp.items()
    }
    return decoder_stack(rows, "blocks", x)


def circular_pipeline(sp, xs):
    """The forward pass of the evaluation and of generate.py --check (no backward to interleave: gpipe's order): a circular pipeline (gpipe is the case of one virtual stage), inside shard_map.
    xs: the input of `blocks` for every micro-batch, [MICROBATCHES, ...]. At tick t rank r works on
    iteration i = t - r: micro-batch i % MICROBATCHES through its stage chunk i // MICROBATCHES, and passes
    the result to rank r + 1 (the last rank to rank 0) with ppermute. Rank 0 keeps the micro-batches that
    come back for their next lap (`laps`) and the finished ones (`outs`). jax.grad differentiates the loop:
    the backward is the mirrored loop, with gradients sent back by the transposed ppermute. Idle ticks
    compute on clamped indices; their results are never stored."""
    M = MICROBATCHES
    r = jax.lax.axis_index("pipe")
    ring = [(k, (k + 1) % PIPE) for k in range(PIPE)]
    # xs comes in float32 and is marked as varying before the cast: the gradient of that mark is a sum over
    # `pipe`, which XLA:CPU fails on in bfloat16 ("Invalid binary instruction opcode copy")
    xs = varying(xs).astype(COMPUTE_DTYPE)
    zeros = jnp.zeros_like(xs)
    cur, laps, outs = varying((zeros[0], zeros, zeros))

    def store(laps, outs, cur, t):
        """Rank 0 files what the last rank sent at tick t - 1 (iteration t - PIPE)."""
        i = t - PIPE
        ok = (r == 0) & (i >= 0) & (i < VIRTUAL_STAGES * M)
        j, done = jnp.maximum(i, 0) % M, i // M == VIRTUAL_STAGES - 1
        laps = laps.at[j].set(jnp.where(ok & ~done, cur, laps[j]))
        outs = outs.at[j].set(jnp.where(ok & done, cur, outs[j]))
        return laps, outs

    def tick(carry, t):
        cur, laps, outs = carry
        laps, outs = store(laps, outs, cur, t)
        i = jnp.clip(t - r, 0, VIRTUAL_STAGES * M - 1)
        j, chunk = i % M, i // M
        x = jnp.where(r == 0, jnp.where(chunk == 0, xs[j], laps[j]), cur)
        y = pipeline_stage(sp, chunk, x)
        return (jax.lax.ppermute(y, "pipe", ring), laps, outs), None

    ticks = VIRTUAL_STAGES * M + PIPE - 1
    (cur, laps, outs), _ = jax.lax.scan(tick, (cur, laps, outs), jnp.arange(ticks))
    _, outs = store(laps, outs, cur, ticks)
    # Rank 0 shares the outputs: each rank gets MICROBATCHES / PIPE of them (and runs the head on those).
    # The sums over `pipe` are in float32, as above.
    outs = jnp.where(r == 0, outs, 0).astype(jnp.float32)
    return jax.lax.psum_scatter(outs, "pipe", scatter_dimension=0, tiled=True).astype(xs.dtype)


def pipeline_1f1b(sp, rest, xs, batch):
    """1f1b, inside shard_map. At tick t rank r runs the forward of micro-batch t - r and the backward of
    micro-batch t - (2 * PIPE - 2 - r). The last rank runs the head and the loss right after a
    micro-batch's forward, so its backward starts at once; the other ranks get their output gradients
    from the next rank one tick later. A backward recomputes its stage from the stashed stage input
    (jax.vjp), so a rank keeps only the inputs of the micro-batches in flight: at most 2 * (PIPE - r) - 1,
    in a ring of min(MICROBATCHES, 2 * PIPE - 1) slots, instead of all of them.
    Returns the loss, the gradients of the stacked copies and of the other parameters (the head's), and
    the gradients of the input xs."""
    M = MICROBATCHES
    r = jax.lax.axis_index("pipe")
    last = PIPE - 1
    slots = min(M, 2 * PIPE - 1)
    rest = varying(rest)
    zero = jnp.zeros_like(xs[0])
    carry = varying(
        {
            "fwd": zero,  # the stage input received from rank r - 1
            "bwd": zero,  # the output gradient received from rank r + 1
            "stash": jnp.zeros((slots, *xs.shape[1:]), xs.dtype),
            "g_stage": jax.tree.map(jnp.zeros_like, sp),
            "g_rest": jax.tree.map(jnp.zeros_like, rest),
            "dxs": jnp.zeros_like(xs),
            "loss": jnp.zeros((), jnp.float32),
        }
    )

    def head(rest, y, mb):
        loss, pullback = jax.vjp(lambda w, y: post_loss(w, y, mb), rest, y)
        g_rest, dy = pullback(jnp.ones_like(loss) / M)
        return loss / M, g_rest, dy

    def no_head(rest, y, mb):
        return varying(
            (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, rest), jnp.zeros_like(y))
        )

    def add_if(ok):
        return lambda acc, g: acc + jnp.where(ok, g, jnp.zeros_like(g))

    def tick(c, t):
        jf = t - r  # forward
        f_ok = (jf >= 0) & (jf < M)
        jf = jnp.clip(jf, 0, M - 1)
        x = jnp.where(r == 0, xs[jf], c["fwd"])
        stash = c["stash"].at[jf % slots].set(jnp.where(f_ok, x, c["stash"][jf % slots]))
        y = pipeline_stage(sp, 0, x)
        mb = jax.tree.map(lambda a: a[jf], batch)
        # the head on the last rank only: a real conditional, the other ranks skip it
        loss, g_head, dy_head = jax.lax.cond(r == last, head, no_head, rest, y, mb)
        jb = t - (2 * PIPE - 2 - r)  # backward
        b_ok = (jb >= 0) & (jb < M)
        jb = jnp.clip(jb, 0, M - 1)
        dy = jnp.where(r == last, dy_head, c["bwd"])
        _, pullback = jax.vjp(lambda w, x: pipeline_stage(w, 0, x), sp, stash[jb % slots])
        g_stage, dx = pullback(dy)
        new = {
            "fwd": jax.lax.ppermute(y, "pipe", [(k, k + 1) for k in range(PIPE - 1)]),
            "bwd": jax.lax.ppermute(dx, "pipe", [(k + 1, k) for k in range(PIPE - 1)]),
            "stash": stash,
            "g_stage": jax.tree.map(add_if(b_ok), c["g_stage"], g_stage),
            "g_rest": jax.tree.map(add_if(f_ok), c["g_rest"], g_head),
            "dxs": c["dxs"].at[jb].set(jnp.where(b_ok & (r == 0), dx, c["dxs"][jb])),
            "loss": c["loss"] + jnp.where(f_ok, loss, 0.0),
        }
        return new, None

    c, _ = jax.lax.scan(tick, carry, jnp.arange(M + 2 * PIPE - 2))
    # one rank holds each of these (the last rank the loss and the head's gradients, rank 0 dxs); summed in
    # float32: XLA:CPU fails on bfloat16 sums here ("Invalid binary instruction opcode copy")
    loss, g_rest, dxs = jax.tree.map(
        lambda a: jax.lax.psum(a.astype(jnp.float32), "pipe").astype(a.dtype),
        (c["loss"], c["g_rest"], c["dxs"]),
    )
    return loss, c["g_stage"], g_rest, dxs


def pipeline_value_and_grad(params, buffers, batch, key):
    """The mean loss of one micro-batch, [MICROBATCHES, CHUNK, ...], through the 1f1b pipeline, and its
    gradients: the pipeline returns those of the stacked copies, of the head, and of the input of
    `blocks`, which jax.vjp of the layers before it takes back to their parameters."""
    del key  # no dropout in this model
    p = {name: w.astype(COMPUTE_DTYPE) for name, w in params.items()}
    sp = {name: w for name, w in p.items() if name.startswith(STACKED)}
    rest = {name: w for name, w in p.items() if not name.startswith(STACKED)}
    xs, pre_pullback = jax.vjp(lambda w: jax.vmap(lambda mb: pre_forward(w, mb))(batch), rest)
    run = jax.shard_map(
        pipeline_1f1b,
        in_specs=(P("pipe"), P(), P(), P()),
        out_specs=(P(), P("pipe"), P(), P()),
        axis_names={"pipe"},
    )
    loss, g_stage, g_head, dxs = run(sp, rest, xs, batch)
    (g_pre,) = pre_pullback(dxs)
    grads = {**jax.tree.map(jnp.add, g_pre, g_head), **g_stage}
    return (loss, buffers), {name: g.astype(params[name].dtype) for name, g in grads.items()}


def post_predict(p, blocks, batch):
    """The layers after the pipelined `blocks` for one micro-batch: the model's output (float32)."""
    ln_f = layer_norm(blocks, p["ln_f.weight"], p["ln_f.bias"], eps=1e-05)
    lm_head = ln_f @ p["lm_head.weight"]
    return lm_head.astype(jnp.float32)


def pipeline_predict(params, batch):
    """generate.py --check: the model's output (float32) for a micro-batch of inputs, [MICROBATCHES, CHUNK, ...],
    forward only through the pipeline (the circular pipeline's loop, as the evaluation runs it)."""
    p = {name: w.astype(COMPUTE_DTYPE) for name, w in params.items()}
    sp = {name: w for name, w in p.items() if name.startswith(STACKED)}
    xs = jax.vmap(lambda mb: pre_forward(p, mb))(batch)
    run = jax.shard_map(
        circular_pipeline, in_specs=(P("pipe"), P()), out_specs=P("pipe"), axis_names={"pipe"}
    )
    ys = run(sp, xs.astype(jnp.float32))
    return jax.vmap(lambda y, mb: post_predict(p, y, mb), spmd_axis_name="pipe")(ys, batch)


def setup_devices(args):
    """The devices of MESH and the processes (runtime/jax/devices.py), before JAX touches a device."""
    start_devices(args, MESH, tf32=TF32)


def make_mesh():
    """The device mesh of MESH."""
    return mesh_of(MESH)


# ----------------------------------------------------------------------------
# The train state's names: a repeated block's parameters are stacked over its copies (stack_of).
def copy_name(name, i):
    """The canonical name of copy i of a stacked parameter (other names are returned as they are)."""
    repeat, local = stack_of(name)
    return name if repeat is None else f"{repeat}.{i}.{local}"


def copies(repeat):
    """The copy of `repeat` that each row of its stacked arrays holds (STACK_ORDER for the pipelined `blocks`)."""
    return STACK_ORDER if repeat == "blocks" else range(REPEATS[repeat])


def stacked_names(name):
    """The canonical names of a stacked parameter's rows (None: a padding row); None for others."""
    repeat, _ = stack_of(name)
    return repeat and [copy_name(name, i) if i >= 0 else None for i in copies(repeat)]


def state_shape(name, table):
    """The shape in the train state of `name`, from `table` (PARAMS or BUFFERS): a stacked
    one has its copies first."""
    repeat, _ = stack_of(name)
    shape = table[copy_name(name, 0)][0]
    return shape if repeat is None else (REPEATS[repeat], *shape)


# ----------------------------------------------------------------------------
# The optimizer state (of train.py's make_optimizer): what it holds, one update, its layout.
def init_optimizer(optimizer, params):
    """The optimizer state."""
    return optimizer.init(params)


def apply_optimizer(optimizer, grads, opt_state, params):
    """One update: (new parameters, new optimizer state)."""
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def opt_state_shardings(optimizer, abstract_params, param_shardings, replicated):
    """Each optimizer-state tensor found under a parameter's name (adam's mu and nu)
    takes that parameter's layout. The rest (step counters) is
    replicated (runtime/jax/optimizers.py)."""
    return shardings_by_param(
        lambda p: init_optimizer(optimizer, p), abstract_params, param_shardings, replicated
    )


# ----------------------------------------------------------------------------
# The train state's layouts
def layouts(mesh, optimizer):
    """Shardings of the train state and of a batch, and the state's shapes (nothing allocated)."""
    replicated = NamedSharding(mesh, P())
    params = {name: NamedSharding(mesh, spec) for name, spec in STATE_LAYOUTS.items()}
    abstract = {
        "params": {
            name: jax.ShapeDtypeStruct(state_shape(name, PARAMS), PARAM_DTYPE)
            for name in STATE_LAYOUTS
        },
        "buffers": {
            name: jax.ShapeDtypeStruct(state_shape(name, BUFFERS), jnp.float32)
            for name in BUFFER_LAYOUTS
        },
        "step": jax.ShapeDtypeStruct((), jnp.int32),
    }
    abstract["opt_state"] = jax.eval_shape(
        lambda p: init_optimizer(optimizer, p), abstract["params"]
    )
    state = {
        "params": params,
        "opt_state": opt_state_shardings(optimizer, abstract["params"], params, replicated),
        "buffers": {name: NamedSharding(mesh, spec) for name, spec in BUFFER_LAYOUTS.items()},
        "step": replicated,
    }
    # a batch is [CHUNKS, CHUNK, ...]: the chunk axis is not split
    batch = {name: NamedSharding(mesh, P(None, *spec)) for name, spec in INPUT_LAYOUTS.items()}
    return state, batch, abstract
