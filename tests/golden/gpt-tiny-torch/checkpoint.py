"""gpt-tiny: parameters (initial values, --init-params, --export-params) and checkpoints
(torch.distributed.checkpoint, with a manifest of checksums beside each)."""

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import MESH, PARAMS, REPEATS, SPEC_NAME
from model import local_box, local_part
from parallel import all_ranks, is_first, log
from runtime.checkpoints import Manifests, checkpoint_dirs, resume_from
from runtime.param_files import read_params, write_params
from runtime.params import every_copy

# what the spec decided that only this file uses (the settings several files share: config.py)
# nn.Linear keeps its weight as [out, in]; the canonical layout is [in, out]: transposed at the boundary
# (initialisation, --init-params, --export-params).
TRANSPOSED = every_copy(
    set(),
    {
        "blocks": {
            "attn.q.weight",
            "attn.k.weight",
            "attn.v.weight",
            "attn.o.weight",
            "mlp.fc.weight",
            "mlp.proj.weight",
        },
    },
    REPEATS,
)


# ----------------------------------------------------------------------------
# Parameters: drawn on the host with numpy (the same values for every mesh and target), by canonical name
# in canonical layout, each rank only the slices it holds; the module FQNs are the canonical names.
# ----------------------------------------------------------------------------
def load_params(path, flag="--init-params"):
    """--init-params (`flag`: the option that names the file in messages): this model's PARAMS by canonical
    name in canonical layout: runtime/param_files.py's read_params."""
    return read_params(path, PARAMS, flag)


def save_params(path, arrays):
    """--export-params: canonical names and layout, float32 (runtime/param_files.py's write_params)."""
    write_params(path, arrays, SPEC_NAME)


def canonical(name, tensor):
    """A whole parameter as numpy in canonical layout: nn.Linear weights (TRANSPOSED) transposed back."""
    return (tensor.T if name in TRANSPOSED else tensor).detach().float().cpu().numpy()


@torch.no_grad()
def fill_model(model, source, seed):
    """Every parameter's local part (its shard on this rank, or the whole), in place, from `source`
    (canonical name -> a lazy tensor or an array, canonical layout): only the slices this rank holds are
    computed or read."""
    assert set(dict(model.named_parameters())) == set(PARAMS), "model parameters differ from PARAMS"
    for name, p in model.named_parameters():
        shape, offset = local_box(p)
        box = tuple(slice(o, o + n) for o, n in zip(offset, shape))  # torch layout
        if name in TRANSPOSED:  # the same block of the canonical [in, out] layout
            values = np.asarray(source[name][box[::-1]], dtype=np.float32).T
        else:
            values = np.asarray(source[name][box], dtype=np.float32)
        local_part(p).copy_(torch.from_numpy(np.ascontiguousarray(values)))


@torch.no_grad()
def export_params(model, path):
    """--export-params: every parameter, whole, in canonical layout, written by the first rank."""
    export_tensors(model.named_parameters(), path)


@torch.no_grad()
def export_grads(named, path):
    """--export-grads: the gradients an update steps on, whole, in canonical layout, written by the first rank.
    `named`: (canonical name, the tensor whose .grad the optimizer reads: the parameter or its ZeRO / master
    copy), in named_parameters order. A parameter nothing reached has no gradient: its zeros are written."""
    grads = ((n, p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in named)
    export_tensors(grads, path)


def export_tensors(named, path, save=save_params):
    """(canonical name, tensor) pairs in named_parameters order, whole, canonical layout, to `path`.
    Collective: every rank calls it, in the same (named_parameters) order; one tensor at a time,
    full_tensor() gathers its shards and the first rank keeps it."""
    wholes = ((n, p.full_tensor() if hasattr(p, "full_tensor") else p) for n, p in named)
    # every rank gathers each in turn (full_tensor is a collective); the first keeps them
    arrays = {n: canonical(n, whole) for n, whole in wholes if is_first()}
    if is_first():
        save(path, {name: arrays[name] for name in PARAMS})


# ----------------------------------------------------------------------------
# Checkpoints: torch.distributed.checkpoint (each rank writes its shards; loading reshards to this
# mesh), written to a temporary directory renamed when complete; rank 0 writes train_state.json and then
# the manifest (manifest.json) once every rank has written.
# ----------------------------------------------------------------------------
MANIFEST = "manifest.json"


SPEC_HASH = "a56ecb597ca91908"  # the spec less where and how it runs (mesh, sharding, pipeline, data, steps)
# SPEC_HASH less the optimizer settings below, which a resumed run may change (a note says which changed)
MODEL_HASH = "8df24454dbe6af15"
OPTIMIZER_SETTINGS = {
    "lr": 0.0003,
    "weight_decay": 0.1,
    "schedule.name": "cosine",
    "schedule.warmup_steps": 5,
    "schedule.min_lr_ratio": 0.0,
    "clip_grad_norm": 1.0,
}
MANIFESTS = Manifests(MANIFEST, SPEC_NAME, SPEC_HASH, MODEL_HASH, OPTIMIZER_SETTINGS, MESH)
KEEP_CHECKPOINTS = 2  # the newest ones are kept; older ones are deleted after each save

FLAT_OPTIMIZER_STATE = StateDictOptions(flatten_optimizer_state_dict=True)


def train_state(model, optimizer):
    """The model and optimizer state dicts DCP saves and loads, laid out for this mesh (DCP reshards from
    whatever mesh a checkpoint was saved on). Before the first step get_state_dict creates the optimizer
    state (a zero-lr step), so that a load has tensors to load into. The optimizer state is flat, one key per
    parameter and slot or setting: ranks that hold different parameters (pipeline stages) save different
    keys, where a nested `param_groups` list would be saved once, from rank 0, for every rank."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=FLAT_OPTIMIZER_STATE)
    return {"model": model_sd, "optim": optim_sd}


def tensors(tree, prefix=""):
    """name -> tensor of every tensor in a state dict tree (`model/<fqn>`, `optim/state.<fqn>.<slot>`)."""
    if isinstance(tree, torch.Tensor):
        return {prefix[:-1]: tree}
    tree = dict(enumerate(tree)) if isinstance(tree, list) else tree
    return {
        k: v
        for key, sub in (tree.items() if isinstance(tree, dict) else ())
        for k, v in tensors(sub, f"{prefix}{key}/").items()
    }


def state_arrays(state):
    """name -> (whole shape, dtype) of every tensor of the train state, over every rank (a collective)."""
    mine = {
        n: (tuple(x.shape), str(x.dtype).removeprefix("torch.")) for n, x in tensors(state).items()
    }
    return {n: v for part in all_ranks(mine) for n, v in part.items()}


PENDING_SAVES = []  # the asynchronous save still writing (--async-checkpoint), completed by finish_saves


def save_checkpoint(root, step, model, optimizer, scheduler, background=False):
    """Saves the train state after `step` as `root`/step_<step>; returns that directory. `background`
    (--async-checkpoint): DCP's async_save copies the state to host memory and writes it in a thread while
    training goes on; the save is completed (train_state.json, manifest, rename) by finish_saves, at the
    next save or at the end."""
    finish_saves()  # one save at a time
    began = time.perf_counter()
    final = os.path.join(root, f"step_{step:08d}")
    tmp = os.path.join(root, f".tmp_step_{step:08d}")
    if is_first():
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    state = train_state(model, optimizer)
    meta = {"step": step, "scheduler": scheduler.state_dict(), "spec": SPEC_NAME, "mesh": MESH}

    def finish(arrays):
        """Once every rank has written its shards: rank 0 writes train_state.json and the manifest, and
        renames the directory (a step_* directory exists only once it is complete)."""
        if is_first():
            Path(tmp, "train_state.json").write_text(json.dumps(meta))
            MANIFESTS.write(tmp, step, arrays)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            for old in saved_steps(root)[:-KEEP_CHECKPOINTS]:
                shutil.rmtree(os.path.join(root, f"step_{old:08d}"), ignore_errors=True)
        dist.barrier()

    if background:
        arrays = state_arrays(state)
        future = dcp.async_save(state, checkpoint_id=tmp, process_group=checkpoint_group())
        written = []  # when the thread has written this rank's shards
        future.add_done_callback(lambda _: written.append(time.perf_counter()))
        PENDING_SAVES.append(
            (
                future,
                lambda: finish(arrays),
                step,
                final,
                began,
                time.perf_counter() - began,
                written,
            )
        )
        return final
    dcp.save(state, checkpoint_id=tmp)
    finish(state_arrays(state))  # (a collective: once every rank has written its shards)
    log(f"checkpoint: step {step} saved in {final} ({time.perf_counter() - began:.1f} s)")
    return final


def finish_saves():
    """Waits for the asynchronous save still writing (every rank), and completes it."""
    while PENDING_SAVES:
        future, finish, step, final, began, blocked, written = PENDING_SAVES.pop()
        future.result()
        finish()
        took = (written[0] if written else time.perf_counter()) - began
        log(
            f"checkpoint: step {step} saved in {final} (asynchronous: training waited {blocked:.2f} s, the "
            f"save took {took:.2f} s)"
        )


def checkpoint_group():
    """The gloo process group of asynchronous saves: DCP's thread runs its collectives there, beside the
    training's (created at the first one, which every rank makes)."""
    if not PENDING_SAVES and "group" not in CHECKPOINT_GROUP:
        CHECKPOINT_GROUP["group"] = dist.new_group(backend="gloo")
    return CHECKPOINT_GROUP["group"]


CHECKPOINT_GROUP = {}


def step_of(name):
    """The step a checkpoint directory's name gives (step_00000010), or None."""
    return int(name[5:]) if name.startswith("step_") and name[5:].isdigit() else None


def saved_steps(root):
    """The steps of the complete checkpoints in `root`, in order."""
    return sorted(
        s for s in map(step_of, os.listdir(root) if os.path.isdir(root) else []) if s is not None
    )


def load_checkpoint(path, model, optimizer, scheduler):
    """--resume PATH: the newest usable checkpoint (resume_from) that PATH names (a checkpoint directory
    holding step_* checkpoints, or one of them), loaded into this rank's shards (DCP reshards). Rank 0
    verifies the manifest and tells the others. Returns the step to continue from."""
    state = train_state(model, optimizer)
    want = state_arrays(state)
    # this program's optimizer settings (weight decay, kernel, ...; the lr below), which a resume may change
    settings = [
        {k: v for k, v in group.items() if k not in ("params", "lr")}
        for group in optimizer.param_groups
    ]

    def verify(step, where):
        return all_ranks(MANIFESTS.verify(where, step, want) if is_first() else None)[0]

    def restore(step, where):
        dcp.load(state, checkpoint_id=where)
        meta = json.loads(Path(where, "train_state.json").read_text())
        mine = [
            n
            for n, x in tensors(state).items()
            if not torch.isfinite(x.to_local() if hasattr(x, "to_local") else x).all()
        ]
        bad = sorted({n for part in all_ranks(mine) for n in part})
        return meta, (
            f"it holds non-finite values ({', '.join(bad[:3])})"
            if bad
            else f"the step in train_state.json ({meta['step']}) and in the directory name ({step}) disagree"
            if meta["step"] != step
            else None
        )

    step, meta = resume_from(
        path, checkpoint_dirs(path, step_of), verify, restore, MANIFESTS, is_first()
    )
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=FLAT_OPTIMIZER_STATE,
    )
    # the scheduler's step; then this program's lr and schedule at that step
    scheduler.load_state_dict(meta["scheduler"])
    scheduler.base_lrs = [s["initial_lr"] for s in settings]
    for group, kept, base, lr_of in zip(
        optimizer.param_groups, settings, scheduler.base_lrs, scheduler.lr_lambdas
    ):
        group.update(kept)
        group["lr"] = base * lr_of(scheduler.last_epoch)  # (as LambdaLR computes it)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    return step
