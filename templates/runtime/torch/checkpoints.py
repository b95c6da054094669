"""Checkpoints of a torch program: torch.distributed.checkpoint (DCP; each rank writes its shards, loading
reshards to this mesh) of the model and optimizer state dicts, written to a temporary directory renamed
when complete; rank 0 writes train_state.json (step, LR-scheduler state, spec, mesh) and then the manifest
(runtime/checkpoints.py) once every rank has written. docs/program.md "Checkpoints"."""

import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from runtime.checkpoints import checkpoint_dirs, remove_partial, resume_from, writing
from runtime.torch.ranks import all_ranks, is_first, log

STORAGE_ERRORS = (Exception, CheckpointException)  # (DCP's is no Exception)
FLAT_OPTIMIZER_STATE = StateDictOptions(flatten_optimizer_state_dict=True)


def step_of(name):
    """The step a checkpoint directory's name gives (step_00000010), or None."""
    return int(name[5:]) if name.startswith("step_") and name[5:].isdigit() else None


def saved_steps(root):
    """The steps of the complete checkpoints in `root`, in order."""
    return sorted(
        s for s in map(step_of, os.listdir(root) if os.path.isdir(root) else []) if s is not None
    )


def train_state(model, optimizer, shards=None):
    """The model and optimizer state dicts DCP saves and loads, laid out for this mesh (DCP reshards from
    whatever mesh a checkpoint was saved on). Before the first step get_state_dict creates the optimizer
    state (a zero-lr step), so that a load has tensors to load into. The optimizer state is flat, one key per
    parameter and slot or setting: ranks that hold different parameters (pipeline stages) save different
    keys, where a nested `param_groups` list would be saved once, from rank 0, for every rank. With
    `shards` (ZeRO or float32 master copies) the optimizer steps on the Shards, not on the model's
    parameters, so its state comes from them, by parameter name and flat (`state.<name>.<slot>`), as
    get_state_dict writes it: the same arrays as a build without them, which a checkpoint can move to."""
    if shards is not None:
        return {"model": get_model_state_dict(model), "optim": shards.state_dict(optimizer)}
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


def local_bytes(state):
    """The bytes of this rank's part of the train state `state` (None: not made yet, 0)."""
    return sum(
        x.numel() * x.element_size()
        for x in (
            t.to_local() if hasattr(t, "to_local") else t for t in tensors(state or {}).values()
        )
    )


class Checkpoints:
    """The checkpoints of this program: `manifests` (runtime/checkpoints.py Manifests) written and verified
    beside each, the newest `keep` kept, `spec` and `mesh` recorded in train_state.json. With a process
    group every rank calls each method (they are collectives); without one, DCP runs in this process."""

    def __init__(self, manifests, keep, spec, mesh):
        self.manifests, self.keep, self.spec, self.mesh = manifests, keep, spec, mesh
        self.pending = []  # the asynchronous save still writing (--async-checkpoint), completed by finish
        self.group = None  # the gloo process group of asynchronous saves (checkpoint_group)

    def save(
        self, root, step, model, optimizer, scheduler, shards=None, scaler=None, background=False
    ):
        """Saves the train state after `step` as `root`/step_<step>; returns that directory. `background`
        (--async-checkpoint): DCP's async_save copies the state to host memory and writes it in a thread
        while training goes on; the save is completed (train_state.json, manifest, rename) by finish, at the
        next save or at the end. `scaler`: the loss scale and its counters, saved beside the step."""
        self.finish()  # one save at a time
        distributed = dist.is_initialized()
        began = time.perf_counter()
        final = os.path.join(root, f"step_{step:08d}")
        tmp = os.path.join(root, f".tmp_step_{step:08d}")
        state = None
        # (a storage failure: one line; any rank's: CheckpointException)
        with writing(
            step, root, lambda: local_bytes(state), tmp if is_first() else None, STORAGE_ERRORS
        ):
            if is_first():
                os.makedirs(root, exist_ok=True)
                remove_partial(root)  # (this save's, and those of saves cut short: none is pending)
            if distributed:
                dist.barrier()
            state = train_state(model, optimizer, shards)
            meta = {
                "step": step,
                "scheduler": scheduler.state_dict(),
                "spec": self.spec,
                "mesh": self.mesh,
            }
            if scaler is not None:
                meta["scaler"] = scaler.state_dict()  # the loss scale and its counters

            def finish(arrays):
                """Once every rank has written its shards: rank 0 writes train_state.json and the manifest,
                and renames the directory (a step_* directory exists only once it is complete)."""
                if is_first():
                    Path(tmp, "train_state.json").write_text(json.dumps(meta))
                    self.manifests.write(tmp, step, arrays)
                    shutil.rmtree(final, ignore_errors=True)
                    os.replace(tmp, final)
                    for old in saved_steps(root)[: -self.keep]:
                        shutil.rmtree(os.path.join(root, f"step_{old:08d}"), ignore_errors=True)
                if distributed:
                    dist.barrier()

            no_dist = {} if distributed else {"no_dist": True}
            if background:
                arrays = state_arrays(state)
                group = {"process_group": self.checkpoint_group()} if distributed else no_dist
                future = dcp.async_save(state, checkpoint_id=tmp, **group)
                written = []  # when the thread has written this rank's shards
                future.add_done_callback(lambda _: written.append(time.perf_counter()))
                blocked = time.perf_counter() - began
                self.pending.append(
                    (
                        future,
                        lambda: finish(arrays),
                        step,
                        root,
                        tmp,
                        state,
                        began,
                        blocked,
                        written,
                    )
                )
                return final
            dcp.save(state, checkpoint_id=tmp, **no_dist)
            finish(state_arrays(state))  # (a collective: once every rank has written its shards)
            log(f"checkpoint: step {step} saved in {final} ({time.perf_counter() - began:.1f} s)")
            return final

    def finish(self):
        """Waits for the asynchronous save still writing (every rank), and completes it."""
        while self.pending:
            future, finish, step, root, tmp, state, began, blocked, written = self.pending.pop()
            with writing(
                step, root, lambda: local_bytes(state), tmp if is_first() else None, STORAGE_ERRORS
            ):
                future.result()
                finish()
            final = os.path.join(root, f"step_{step:08d}")
            took = (written[0] if written else time.perf_counter()) - began
            log(
                f"checkpoint: step {step} saved in {final} (asynchronous: training waited {blocked:.2f} s, "
                f"the save took {took:.2f} s)"
            )

    def checkpoint_group(self):
        """The gloo process group of asynchronous saves: DCP's thread runs its collectives there, beside the
        training's (created at the first save, which every rank makes)."""
        if self.group is None:
            self.group = dist.new_group(backend="gloo")
        return self.group

    def load(self, path, model, optimizer, scheduler, shards=None, scaler=None):
        """--resume PATH: the newest usable checkpoint (resume_from) that PATH names (a checkpoint directory
        holding step_* checkpoints, or one of them), loaded into this rank's shards (DCP reshards). Rank 0
        verifies the manifest and tells the others. Returns the step to continue from. `scaler` (None:
        generate.py, which loads the model only) takes the checkpoint's loss scale where it has one."""
        state = train_state(model, optimizer, shards)
        want = state_arrays(state)
        no_dist = {} if dist.is_initialized() else {"no_dist": True}
        # this program's optimizer settings (weight decay, kernel, ...; the lr below), which a resume may
        # change
        settings = [
            {k: v for k, v in group.items() if k not in ("params", "lr")}
            for group in optimizer.param_groups
        ]

        def verify(step, where):
            return all_ranks(self.manifests.verify(where, step, want) if is_first() else None)[0]

        def restore(step, where):
            dcp.load(state, checkpoint_id=where, **no_dist)
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
                else f"the step in train_state.json ({meta['step']}) and in the directory name ({step}) "
                "disagree"
                if meta["step"] != step
                else None
            )

        dirs = checkpoint_dirs(path, step_of)
        step, meta = resume_from(path, dirs, verify, restore, self.manifests, is_first())
        # (a checkpoint of a build without loss scaling leaves the scale fresh)
        if scaler is not None and "scaler" in meta:
            scaler.load_state_dict(meta["scaler"])
        if shards is not None:
            set_model_state_dict(model, state["model"])  # (the optimizer state was loaded in place)
        else:
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
