"""gpt-tiny: parameters (initial values, --init-params, --export-params) and checkpoints
(torch.distributed.checkpoint, with a manifest of checksums beside each)."""

import torch

# isort: split
# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files
from config import MESH, PARAMS, REPEATS, SPEC_NAME
from runtime.checkpoints import Manifests
from runtime.param_files import read_params, write_params
from runtime.params import every_copy
from runtime.torch.checkpoints import Checkpoints
from runtime.torch.params import export_tensors, fill_params, grads_of

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
def load_params(path, flag="--init-params"):
    """--init-params (`flag`: the option that names the file in messages): this model's PARAMS by canonical
    name in canonical layout: runtime/param_files.py's read_params."""
    return read_params(path, PARAMS, flag)


def save_params(path, arrays):
    """--export-params: canonical names and layout, float32 (runtime/param_files.py's write_params)."""
    write_params(path, arrays, SPEC_NAME)


@torch.no_grad()
def fill_model(model, source, seed):
    """Every parameter's local part (its shard on this rank, or the whole), in place, from `source`
    (canonical name -> a lazy tensor or an array, canonical layout: runtime/torch/params.py fill_params)."""
    assert set(dict(model.named_parameters())) == set(PARAMS), "model parameters differ from PARAMS"
    fill_params(model, source, MESH, TRANSPOSED)


def export_params(model, path, save=save_params):
    """--export-params: every parameter, whole, in canonical layout, written by the first rank
    (runtime/torch/params.py export_tensors)."""
    export_tensors(model.named_parameters(), path, PARAMS, TRANSPOSED, save)


def export_grads(named, path):
    """--export-grads: the gradients an update steps on, whole, in canonical layout, written by the first rank.
    `named`: (canonical name, the tensor whose .grad the optimizer reads: the parameter or its ZeRO / master
    copy), in named_parameters order. A parameter nothing reached has no gradient: its zeros are written."""
    export_tensors(grads_of(named), path, PARAMS, TRANSPOSED, save_params)


# ----------------------------------------------------------------------------
# Checkpoints: torch.distributed.checkpoint (each rank writes its shards; loading reshards to this
# mesh), written to a temporary directory renamed when complete; rank 0 writes train_state.json and then
# the manifest (manifest.json) once every rank has written.
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
# saved and loaded by runtime/torch/checkpoints.py (every rank calls its methods)
CHECKPOINTS = Checkpoints(MANIFESTS, KEEP_CHECKPOINTS, SPEC_NAME, MESH)
