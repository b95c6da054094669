"""gpt-pipe: parameters (initial values, --init-params, --export-params), checkpoints (orbax, with a
manifest of checksums beside each) and the train state at the run's first step, initial or restored."""

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import BUFFERS, MESH, PARAM_DTYPE, PARAMS, REPEATS, SPEC_NAME
from parallel import copies, copy_name, init_optimizer, stack_of
from runtime.checkpoints import Manifests, checkpoint_dirs, resume_from
from runtime.param_files import read_params, write_params
from runtime.params import InitTensor, initial_params


# ----------------------------------------------------------------------------
# Parameters: each process computes (or reads) only the slices its devices hold, from lazy tensors by
# canonical name (the same values for every mesh and target), and the train state is laid out from them.
# ----------------------------------------------------------------------------
def load_params(path, flag="--init-params"):
    """--init-params (`flag`: the option that names the file in messages): this model's PARAMS by canonical
    name in canonical layout: runtime/param_files.py's read_params."""
    return read_params(path, PARAMS, flag)


def save_params(path, arrays):
    """--export-params: canonical names and layout, float32 (runtime/param_files.py's write_params)."""
    write_params(path, arrays, SPEC_NAME)


def place(src, name, shape, sharding, dtype):
    """The train state's `name` as a global jax.Array laid out by `sharding`, from `src`: lazy tensors (or
    arrays) by canonical name, indexed by slices. Each process computes or reads only the slices of its own
    devices, once each (of a stacked parameter: its copies' slices, stacked), so no
    process ever holds a whole parameter it does not own, and the same call serves one process and many."""
    dtype = jnp.dtype(dtype)
    done = {}

    def shard(index):
        at = tuple((s.start, s.stop) for s in index)
        if at not in done:
            repeat, local = stack_of(name)
            if repeat is None:
                done[at] = np.asarray(src[name][index]).astype(dtype)
            else:  # rows index[0]: those copies, each sliced by the rest of the index
                rows = [
                    np.asarray(src[f"{repeat}.{i}.{local}"][index[1:]])
                    for i in copies(repeat)[index[0]]
                ]
                done[at] = np.stack(rows).astype(dtype)
        return done[at]

    return jax.make_array_from_callback(tuple(shape), sharding, shard)


def to_host(x):
    """A global jax.Array -> numpy. Several processes each hold only part of it: gathering is a
    collective that every process must call."""
    return np.asarray(
        x if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)
    )


def gather_params(params):
    """The train state's parameters, gathered one at a time (a collective: every process calls it) ->
    numpy arrays by canonical name (a stacked parameter gives one per copy)."""
    out = {}
    for name, w in params.items():
        host, (repeat, _) = to_host(w), stack_of(name)
        out.update(
            {copy_name(name, i): host[q] for q, i in enumerate(copies(repeat))}
            if repeat
            else {name: host}
        )
    return {name: out[name] for name in PARAMS}


# ----------------------------------------------------------------------------
# Checkpoints (orbax): DIR/<step>/state, the whole train state, sharded (every process writes its shards;
# orbax writes a temporary directory and renames it when complete), then DIR/<step>/manifest.json, written
# by the first process once every process is done. Imported lazily: most runs never checkpoint.
# ----------------------------------------------------------------------------
MANIFEST = "manifest.json"


SPEC_HASH = "d8a676412d4b201f"  # the spec less where and how it runs (mesh, sharding, pipeline, data, steps)
# SPEC_HASH less the optimizer settings below, which a resumed run may change (a note says which changed)
MODEL_HASH = "709254903ab8e915"
OPTIMIZER_SETTINGS = {
    "lr": 0.001,
    "weight_decay": 0.1,
    "schedule.name": "cosine",
    "schedule.warmup_steps": 2,
    "schedule.min_lr_ratio": 0.0,
    "clip_grad_norm": 1.0,
}
MANIFESTS = Manifests(MANIFEST, SPEC_NAME, SPEC_HASH, MODEL_HASH, OPTIMIZER_SETTINGS, MESH)
KEEP_CHECKPOINTS = 2  # the newest ones are kept; older ones are deleted after each save


def checkpoint_manager(directory, background=False):
    """`background` (--async-checkpoint): orbax's asynchronous checkpointing (a save copies the state to
    host memory and returns; orbax writes it in a thread)."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(
        max_to_keep=KEEP_CHECKPOINTS, create=True, enable_async_checkpointing=background
    )
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def step_of(name):
    """The step an orbax checkpoint directory's name gives (10), or None."""
    return int(name) if name.isdigit() else None


def state_arrays(tree):
    """name -> (whole shape, dtype) of every array of a train state (or of its abstract target)."""
    return {
        jax.tree_util.keystr(k, simple=True, separator="/"): (a.shape, str(a.dtype))
        for k, a in jax.tree_util.tree_leaves_with_path(tree)
    }


PENDING_SAVES = []  # the asynchronous save still writing (--async-checkpoint), completed by finish_saves


def save_checkpoint(manager, step, state, background=False):
    """DIR/<step>, replacing a checkpoint of that step (one that --resume of this directory found unusable);
    returns that directory. `background` (a manager of checkpoint_manager(DIR, background=True)): training
    goes on while orbax writes; the manifest is written by finish_saves, at the next save or at the end."""
    import orbax.checkpoint as ocp

    finish_saves()  # one save at a time
    began = time.perf_counter()
    if step in manager.all_steps():
        manager.delete(step)
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True)
    final, arrays = os.path.join(str(manager.directory), str(step)), state_arrays(state)

    def finish():
        manager.wait_until_finished()
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"checkpoint {step} written")
        if jax.process_index() == 0:
            MANIFESTS.write(final, step, arrays, stack_order=stack_order())

    if background:
        PENDING_SAVES.append((finish, step, final, began, time.perf_counter() - began))
        return final
    finish()
    if jax.process_index() == 0:
        print(
            f"checkpoint: step {step} saved in {final} ({time.perf_counter() - began:.1f} s)",
            flush=True,
        )
    return final


def finish_saves():
    """Waits for the asynchronous save still writing (every process), and writes its manifest."""
    while PENDING_SAVES:
        finish, step, final, began, blocked = PENDING_SAVES.pop()
        finish()
        if jax.process_index() == 0:
            print(
                f"checkpoint: step {step} saved in {final} (asynchronous: training waited {blocked:.2f} s, the "
                f"save was complete {time.perf_counter() - began:.2f} s after it began)",
                flush=True,
            )


def stack_order():
    """The copy each row of the stacked arrays holds, per repeated block (checkpoints record it)."""
    return {r: list(copies(r)) for r in REPEATS}


def other_stack_order(manifest):
    """Why a checkpoint's stacked arrays do not fit this program, or None."""
    if manifest.get("stack_order") != stack_order():
        return (
            f"its train state stacks the copies of the repeated blocks in the rows {manifest.get('stack_order')}, "
            f"this program in {stack_order()}: resume it with a build of the same pipeline layout, or carry "
            "the parameters over with --export-params / --init-params"
        )
    return None


def agree(value):
    """The first process's `value` (JSON), on every process (a collective when there are several)."""
    if jax.process_count() == 1:
        return value
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
    data = multihost_utils.broadcast_one_to_all(
        data if jax.process_index() == 0 else np.zeros(size, np.uint8)
    )
    return json.loads(np.asarray(data).tobytes())


def nonfinite(state):
    """The names of the arrays of `state` holding a non-finite value in any process's shards (a collective
    when there are several processes)."""
    leaves = jax.tree_util.tree_leaves_with_path(state)
    bad = np.array(
        [
            any(not np.isfinite(np.asarray(s.data, np.float32)).all() for s in a.addressable_shards)
            for _, a in leaves
        ]
    )
    bad = multihost_utils.process_allgather(bad).any(axis=0) if jax.process_count() > 1 else bad
    return [
        jax.tree_util.keystr(k, simple=True, separator="/") for (k, _), b in zip(leaves, bad) if b
    ]


def restore_checkpoint(directory, target):
    """The newest usable checkpoint that --resume `directory` names (resume_from: the directory of
    checkpoints, or one of them), restored into `target` (the train state's shapes, dtypes and shardings:
    each process reads only its shards; orbax reshards when the checkpoint was written on another mesh or
    by another number of processes). The first process verifies the manifest and tells the others."""
    import orbax.checkpoint as ocp

    want = state_arrays(target)

    def verify(step, where):
        return agree(
            MANIFESTS.verify(where, step, want, other_stack_order)
            if jax.process_index() == 0
            else None
        )

    def restore(step, where):
        with checkpoint_manager(os.path.dirname(where)) as manager:
            state = manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
            )["state"]
        bad, saved = nonfinite(state), int(np.asarray(state["step"].addressable_shards[0].data))
        return state, (
            f"it holds non-finite values ({', '.join(bad[:3])})"
            if bad
            else f"the step in its train state ({saved}) and in its directory name ({step}) disagree"
            if saved != step
            else None
        )

    return resume_from(
        directory,
        checkpoint_dirs(directory, step_of),
        verify,
        restore,
        MANIFESTS,
        jax.process_index() == 0,
    )[1]


# ----------------------------------------------------------------------------
# The train state at the run's first step: initial values, or the newest usable checkpoint (--resume)
# ----------------------------------------------------------------------------
def init_state(args, optimizer, shardings, abstract):
    """Parameters from the counter-based init (or --init-params), a fresh optimizer state, initial buffers,
    step 0, each process computing or reading only its devices' slices. With --resume, all of it from the
    newest usable checkpoint, restored straight into its sharded layout: nothing is drawn or placed first."""
    if args.resume:  # the restore targets: shapes, dtypes and shardings
        return restore_checkpoint(
            args.resume,
            jax.tree.map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
            ),
        )
    src = load_params(args.init_params) if args.init_params else initial_params(PARAMS, args.seed)
    params = {
        name: place(src, name, a.shape, shardings["params"][name], PARAM_DTYPE)
        for name, a in abstract["params"].items()
    }
    if args.init_params and jax.process_index() == 0:
        print(f"parameters: loaded from {args.init_params}", flush=True)
    init_opt = jax.jit(lambda p: init_optimizer(optimizer, p), out_shardings=shardings["opt_state"])
    buffers = {
        name: InitTensor(name, shape, kind, 0.0, args.seed)
        for name, (shape, kind) in BUFFERS.items()
    }
    return {
        "params": params,
        "opt_state": init_opt(params),
        "buffers": {
            name: place(buffers, name, a.shape, shardings["buffers"][name], np.float32)
            for name, a in abstract["buffers"].items()
        },
        "step": place({"step": np.zeros((), np.int32)}, "step", (), shardings["step"], np.int32),
    }
