"""A JAX program's checkpoints (orbax): DIR/<step>/state, the whole train state, sharded (every process writes
its shards; orbax writes a temporary directory and renames it when complete), then DIR/<step>/manifest.json
(runtime/checkpoints.py's Manifests), written by the first process once every process is done; restored
straight into the train state's layout, verified first. Also the collectives they need: a global array
gathered to the host, the first process's verdict on every process, the non-finite arrays of a state.
orbax is imported lazily: most runs never checkpoint."""

import json
import os
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from runtime.checkpoints import check_start, checkpoint_dirs, resume_from, writing


def to_host(x):
    """A global jax.Array -> numpy. Several processes each hold only part of it: gathering is a
    collective that every process must call."""
    return np.asarray(
        x if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)
    )


def step_of(name):
    """The step an orbax checkpoint directory's name gives (10), or None."""
    return int(name) if name.isdigit() else None


def state_arrays(tree):
    """name -> (whole shape, dtype) of every array of a train state (or of its abstract target)."""
    return {
        jax.tree_util.keystr(k, simple=True, separator="/"): (a.shape, str(a.dtype))
        for k, a in jax.tree_util.tree_leaves_with_path(tree)
    }


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


def tree_bytes(state):
    """The bytes of the arrays of `state` (what a checkpoint of it needs; orbax removes a save's partial
    directory itself when it next opens the checkpoint directory)."""
    return sum(a.nbytes for a in jax.tree_util.tree_leaves(state))


class Checkpoints:
    """The checkpoints of one program: `manifests` (runtime/checkpoints.py's Manifests of its spec), the
    newest `keep` kept, `stack_order` ({repeat: the copy each row of its stacked arrays holds}, recorded in
    the manifests and checked on resume; None without repeated blocks) and the parts of the train state
    left `unsaved` (restarted afresh on resume)."""

    def __init__(self, manifests, keep, stack_order=None, unsaved=()):
        self.manifests, self.keep, self.stack_order, self.unsaved = (
            manifests,
            keep,
            stack_order,
            unsaved,
        )
        self.pending = []  # the asynchronous save still writing (--async-checkpoint): finish_saves

    def open(self, args, start, spec_dir):
        """The manager of --checkpoint-dir (None without one), once runtime/checkpoints.py's check_start
        agrees with a run from step `start` (`spec_dir`: the spec's checkpoint directory)."""
        manager = (
            self.manager(args.checkpoint_dir, args.async_checkpoint)
            if args.checkpoint_dir
            else None
        )
        check_start(args, start, manager.all_steps() if manager else [], spec_dir)
        return manager

    def manager(self, directory, background=False):
        """The orbax manager of `directory`. `background` (--async-checkpoint): orbax's asynchronous
        checkpointing (a save copies the state to host memory and returns; orbax writes it in a thread)."""
        import orbax.checkpoint as ocp

        options = ocp.CheckpointManagerOptions(
            max_to_keep=self.keep, create=True, enable_async_checkpointing=background
        )
        return ocp.CheckpointManager(os.path.abspath(directory), options=options)

    def save(self, manager, step, state, background=False):
        """DIR/<step>, replacing a checkpoint of that step (one that --resume of this directory found
        unusable); returns that directory. `background` (a manager(DIR, background=True)): training goes
        on while orbax writes; the manifest is written by finish_saves, at the next save or at the end."""
        import orbax.checkpoint as ocp

        self.finish_saves()  # one save at a time
        began = time.perf_counter()
        if step in manager.all_steps():
            manager.delete(step)
        state = {k: v for k, v in state.items() if k not in self.unsaved}
        with writing(step, str(manager.directory), lambda: tree_bytes(state)):
            manager.save(
                step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True
            )
        final, arrays = os.path.join(str(manager.directory), str(step)), state_arrays(state)
        extra = {} if self.stack_order is None else {"stack_order": self.stack_order}

        def finish():
            with writing(step, str(manager.directory), lambda: tree_bytes(state)):
                manager.wait_until_finished()
                if jax.process_count() > 1:
                    multihost_utils.sync_global_devices(f"checkpoint {step} written")
                if jax.process_index() == 0:
                    self.manifests.write(final, step, arrays, **extra)

        if background:
            self.pending.append((finish, step, final, began, time.perf_counter() - began))
            return final
        finish()
        if jax.process_index() == 0:
            print(
                f"checkpoint: step {step} saved in {final} ({time.perf_counter() - began:.1f} s)",
                flush=True,
            )
        return final

    def finish_saves(self):
        """Waits for the asynchronous save still writing (every process), and writes its manifest."""
        while self.pending:
            finish, step, final, began, blocked = self.pending.pop()
            finish()
            if jax.process_index() == 0:
                print(
                    f"checkpoint: step {step} saved in {final} (asynchronous: training waited {blocked:.2f} "
                    f"s, the save was complete {time.perf_counter() - began:.2f} s after it began)",
                    flush=True,
                )

    def other_stack_order(self, manifest):
        """Why a checkpoint's stacked arrays do not fit this program, or None."""
        if self.stack_order is not None and manifest.get("stack_order") != self.stack_order:
            return (
                f"its train state stacks the copies of the repeated blocks in the rows "
                f"{manifest.get('stack_order')}, this program in {self.stack_order}: resume it with a "
                "build of the same pipeline layout, or carry the parameters over with --export-params / "
                "--init-params"
            )
        return None

    def restore(self, directory, target):
        """The newest usable checkpoint that --resume `directory` names (resume_from: the directory of
        checkpoints, or one of them), restored into `target` (the train state's shapes, dtypes and
        shardings: each process reads only its shards; orbax reshards when the checkpoint was written on
        another mesh or by another number of processes). The first process verifies the manifest and tells
        the others."""
        import orbax.checkpoint as ocp

        want, first = state_arrays(target), jax.process_index() == 0

        def verify(step, where):
            why = (
                self.manifests.verify(where, step, want, self.other_stack_order) if first else None
            )
            return agree(why)

        def restore(step, where):
            with self.manager(os.path.dirname(where)) as manager:
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

        found = checkpoint_dirs(directory, step_of)
        return resume_from(directory, found, verify, restore, self.manifests, first)[1]
