"""cnn-dp: parameters (initial values drawn on the host with numpy, the same for every mesh and
target; --init-params, --export-params) and checkpoints (with a manifest of checksums beside each)."""

import os
import shutil
import time

import mlx.core as mx

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import BUFFERS, MESH, PARAMS, SPEC_NAME
from runtime.checkpoints import Manifests, checkpoint_dirs, remove_partial, resume_from, writing
from runtime.param_files import read_params, write_params


def load_params(path, flag="--init-params"):
    """--init-params (`flag`: the option that names the file in messages): this model's PARAMS by canonical
    name in canonical layout: runtime/param_files.py's read_params."""
    return read_params(path, PARAMS, flag)


def save_params(path, arrays):
    """--export-params: canonical names and layout, float32 (runtime/param_files.py's write_params)."""
    write_params(path, arrays, SPEC_NAME)


# ----------------------------------------------------------------------------
# Checkpoints: DIR/step_00000010/{state.safetensors, train_state.json}. Every process holds the same
# state, so the first one writes: into a temporary directory, the manifest (train_state.json: the spec,
# the step, every array's shape and dtype, the state file's sha256) last, then a rename. The last
# KEEP_CHECKPOINTS are kept.
MANIFEST = "train_state.json"  # the manifest (below), the last file of a checkpoint directory


SPEC_HASH = "99da9411074f3196"  # the spec less where and how it runs (mesh, sharding, pipeline, data, steps)
# SPEC_HASH less the optimizer settings below, which a resumed run may change (a note says which changed)
MODEL_HASH = "4ed52b6fabf18356"
OPTIMIZER_SETTINGS = {
    "lr": 0.01,
    "schedule.name": "constant",
    "schedule.warmup_steps": 0,
    "schedule.min_lr_ratio": 0.0,
    "clip_grad_norm": None,
}
MANIFESTS = Manifests(MANIFEST, SPEC_NAME, SPEC_HASH, MODEL_HASH, OPTIMIZER_SETTINGS, MESH)
KEEP_CHECKPOINTS = 2  # the newest ones are kept; older ones are deleted after each save


def step_of(name):
    """The step a checkpoint directory's name gives (step_00000010), or None."""
    return int(name[5:]) if name.startswith("step_") and name[5:].isdigit() else None


def step_dirs(directory):
    """{step: path} of the checkpoints in `directory` (None: none)."""
    names = os.listdir(directory) if directory and os.path.isdir(directory) else []
    return {step_of(n): os.path.join(directory, n) for n in names if step_of(n) is not None}


def dtype_name(a):
    return str(a.dtype).removeprefix("mlx.core.")


def save_checkpoint(directory, step, arrays):
    """Saves the train state `arrays` after `step` as DIR/step_<step>; returns that directory. Where the
    storage fails it (runtime/checkpoints.py unsaved: a full disk, a directory that cannot be made), its
    partial directory is removed and the program stops with one line, exit 2."""
    began = time.perf_counter()
    final = os.path.join(directory, f"step_{step:08d}")
    tmp = os.path.join(directory, f".tmp_step_{step:08d}")
    with writing(step, directory, lambda: sum(a.nbytes for a in arrays.values()), tmp):
        remove_partial(directory)  # (this save's, and those of saves cut short)
        os.makedirs(tmp)
        mx.save_safetensors(os.path.join(tmp, "state.safetensors"), arrays)
        MANIFESTS.write(tmp, step, {n: (a.shape, dtype_name(a)) for n, a in arrays.items()})
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in sorted(step_dirs(directory))[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(step_dirs(directory)[old], ignore_errors=True)
    took = time.perf_counter() - began
    print(f"checkpoint: step {step} saved in {final} ({took:.1f} s)", flush=True)
    return final


def state_arrays(params, buffers, optimizers):
    """The whole train state as flat arrays: params/<name>, buffers/<name>, optimizer/<group>/step and
    optimizer/<group>/<name>/<slot>."""
    out = {f"params/{n}": a for n, a in params.items()}
    out |= {f"buffers/{n}": a for n, a in buffers.items()}
    for group, (opt, names) in optimizers.items():
        out[f"optimizer/{group}/step"] = opt.state["step"]
        for n in names:
            out |= {f"optimizer/{group}/{n}/{slot}": a for slot, a in opt.state.get(n, {}).items()}
    return out


def load_state(arrays, optimizers):
    """The inverse of state_arrays: (parameters, buffers), and the optimizers' state set in place."""
    for group, (opt, names) in optimizers.items():
        for n in names:
            opt.state[n] = {s: arrays[f"optimizer/{group}/{n}/{s}"] for s in opt.state.get(n, {})}
        opt.state["step"] = arrays[f"optimizer/{group}/step"]
    return {n: arrays[f"params/{n}"] for n in PARAMS}, {n: arrays[f"buffers/{n}"] for n in BUFFERS}


def read_checkpoint(step, path):
    """(arrays, why not) of the verified checkpoint directory `path`: its values must be finite."""
    arrays = mx.load(os.path.join(path, "state.safetensors"))
    bad = sorted(n for n, a in arrays.items() if not mx.isfinite(a).all().item())
    return arrays, (f"it holds non-finite values ({', '.join(bad[:3])})" if bad else None)


def restore_checkpoint(path, want):
    """(step, arrays) of the newest usable checkpoint (resume_from): `path` is a checkpoint directory or one
    step_* directory; `want`: name -> (whole shape, dtype) of this program's train state. Every process
    holds the whole state, so every process verifies and reads the same files, reaching the same verdict."""

    def verify(step, where):
        return MANIFESTS.verify(where, step, want)

    return resume_from(path, checkpoint_dirs(path, step_of), verify, read_checkpoint, MANIFESTS)
