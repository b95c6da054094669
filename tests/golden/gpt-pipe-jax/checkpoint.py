"""gpt-pipe: parameters (initial values, --init-params, --export-params), checkpoints (orbax, with a
manifest of checksums beside each) and the train state at the run's first step, initial or restored."""

import functools

import jax

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import BUFFERS, MESH, PARAM_DTYPE, PARAMS, REPEATS, SPEC_NAME
from parallel import copies, init_optimizer, stacked_names
from runtime.checkpoints import Manifests
from runtime.jax.checkpoints import Checkpoints
from runtime.jax.placement import gather_arrays, initial_state, place_array, restore_targets
from runtime.param_files import read_params, write_params
from runtime.params import InitTensor, initial_params


# ----------------------------------------------------------------------------
# Parameters: each process computes (or reads) only the slices its devices hold, from lazy tensors by
# canonical name (the same values for every mesh and target), and the train state is laid out from them.
def load_params(path, flag="--init-params"):
    """--init-params (`flag`: the option that names the file in messages): this model's PARAMS by canonical
    name in canonical layout: runtime/param_files.py's read_params."""
    return read_params(path, PARAMS, flag)


def save_params(path, arrays):
    """--export-params: canonical names and layout, float32 (runtime/param_files.py's write_params)."""
    write_params(path, arrays, SPEC_NAME)


def place(src, name, shape, sharding, dtype):
    """The train state's `name` as a global jax.Array laid out by `sharding`, from `src` (lazy tensors or
    arrays by canonical name), each process computing or reading only its devices' slices (of a stacked
    parameter: its copies'): runtime/jax/placement.py's place_array."""
    return place_array(src, name, shape, sharding, dtype, stacked_names(name))


def gather_params(params):
    """The train state's parameters, gathered one at a time (a collective: every process calls it) ->
    numpy arrays by canonical name (a stacked parameter gives one per copy)."""
    return gather_arrays(params, stacked_names, PARAMS)  # (runtime/jax/placement.py)


def export(path, params, is_first):
    """--export-params, --export-grads: `params` (laid out as the train state's) gathered by every process,
    written by the first."""
    exported = gather_params(params)
    if is_first:
        save_params(path, exported)


# Checkpoints: runtime/jax/checkpoints.py's (orbax), with a manifest of this spec beside each.
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
# the copy each row of the stacked arrays holds, per repeated block (checkpoints record it)
STACK_ROWS = {r: list(copies(r)) for r in REPEATS}
CHECKPOINTS = Checkpoints(MANIFESTS, KEEP_CHECKPOINTS, STACK_ROWS)


# ----------------------------------------------------------------------------
# The train state at the run's first step: initial values, or the newest usable checkpoint (--resume)
def init_state(args, optimizer, shardings, abstract):
    """Parameters from the counter-based init (or --init-params), a fresh optimizer state, initial buffers,
    step 0, each process computing or reading only its devices' slices. With --resume, all of it from the
    newest usable checkpoint, restored straight into its sharded layout: nothing is drawn or placed first."""
    if args.resume:  # the restore targets: shapes, dtypes and shardings
        return CHECKPOINTS.restore(args.resume, restore_targets(abstract, shardings))
    src = load_params(args.init_params) if args.init_params else initial_params(PARAMS, args.seed)
    buffers = {
        name: InitTensor(name, shape, kind, 0.0, args.seed)
        for name, (shape, kind) in BUFFERS.items()
    }
    init = functools.partial(init_optimizer, optimizer)  # (initial_state: runtime/jax/placement.py)
    state = initial_state(src, buffers, abstract, shardings, place, init, PARAM_DTYPE)
    if args.init_params and jax.process_index() == 0:
        print(f"parameters: loaded from {args.init_params}", flush=True)
    return state
