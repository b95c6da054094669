"""Parameter files (docs/program.md "Parameter files"): --init-params' reading (its checks, and Hugging
Face's names and layouts for imported specs), tensors of a safetensors file read only where they are
indexed, and --export-params' writing."""

import json
import os

import numpy as np

from .errors import require
from .params import slices


def swap(dims):
    """The last two of `dims` exchanged (a matrix transposed; a stack of matrices each transposed)."""
    dims = list(dims)
    return dims[:-2] + dims[-2:][::-1]


class FileTensor:
    """A stored tensor of a safetensors file, in canonical layout, read only where it is indexed: a process
    that holds a slice reads just that slice (`tensor[index]`). `transposed` (its last two dimensions) and
    `part` of `parts` (of the last dimension): how the stored tensor holds the canonical one (Hugging Face's
    layouts). `parts`: a count of equal parts, or the parts' relative sizes (Phi-3's fused q, k and v: the
    heads, then the key/value heads twice)."""

    def __init__(self, handle, key, transposed=False, part=0, parts=1, flag="--init-params"):
        stored = handle.get_slice(key)
        shape = list(swap(stored.get_shape()) if transposed else stored.get_shape())
        sizes = [1] * parts if isinstance(parts, int) else list(parts)
        unit = shape[-1] // sum(sizes) if shape else 0
        self.shape = tuple(shape[:-1] + [unit * sizes[part]] if shape else shape)
        self.stored, self.key, self.transposed, self.flag = stored, key, transposed, flag
        self.offset = unit * sum(sizes[:part])
        self.dtype = stored.get_dtype()  # safetensors' name: F32, BF16, I64, ...
        self.floating = self.dtype in FLOATS

    def __getitem__(self, index):
        box = slices(index if isinstance(index, tuple) else (index,), self.shape)
        if self.offset:  # part `part` of the stored last dimension
            box[-1] = slice(box[-1].start + self.offset, box[-1].stop + self.offset)
        x = np.asarray(self.stored[tuple(swap(box) if self.transposed else box)], dtype=np.float32)
        x = np.swapaxes(x, -1, -2) if self.transposed else x
        # (this process's slice: the verdict is its own)
        require(
            np.isfinite(x).all(),
            f"{self.flag}: `{self.key}` holds non-finite values (NaN or inf)",
            local=True,
        )
        return x

    def __array__(self, dtype=None, copy=None):
        return self[()].astype(dtype or np.float32)


# the floating-point tensors read (numpy's, and bfloat16: see below)
FLOATS = ("F16", "BF16", "F32", "F64")


class SafetensorsFile:
    """One safetensors file: its tensors' slices, those of safetensors' numpy reader or, for bfloat16 (the
    dtype of most released checkpoints, which numpy lacks), BFloat16Slice's."""

    def __init__(self, path):
        from safetensors import safe_open

        self.path, self.handle = path, safe_open(path, framework="numpy")
        self.names = self.handle.keys()
        self.header = None  # (its length, the tensors' entries): read at the first bfloat16 tensor

    def keys(self):
        return self.names

    def get_slice(self, key):
        stored = self.handle.get_slice(key)
        if stored.get_dtype() != "BF16":
            return stored
        if self.header is None:
            with open(self.path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                self.header = (n, json.loads(f.read(n)))
        n, entries = self.header
        return BFloat16Slice(self.path, 8 + n + entries[key]["data_offsets"][0], stored.get_shape())


class BFloat16Slice:
    """A bfloat16 tensor of a safetensors file (at byte `start`), mapped, not read: indexing it reads those
    entries, as float32 (a bfloat16 is the upper half of the float32 of the same value)."""

    def __init__(self, path, start, shape):
        self.shape, count = list(shape), int(np.prod(shape, dtype=np.int64))
        bits = (
            np.memmap(path, np.dtype("<u2"), "r", start, (count,))
            if count
            else np.zeros(0, np.uint16)
        )
        self.bits = bits.reshape(self.shape)

    def get_shape(self):
        return self.shape

    def get_dtype(self):
        return "BF16"

    def __getitem__(self, box):
        return (np.asarray(self.bits[box], np.uint32) << 16).view(np.float32)


class ExpertTensors:
    """A moe layer's experts parameter [E, ...] in canonical layout, stored one tensor per expert
    (transformers' checkpoints: `experts.0.w1.weight`, ...), each read only where it is indexed."""

    def __init__(self, each):
        self.each, self.key = each, each[0].key
        same = all(t.shape == each[0].shape for t in each)
        self.shape = (len(each), *each[0].shape) if same else ()
        self.floating = all(t.floating for t in each)

    def __getitem__(self, index):
        box = slices(index if isinstance(index, tuple) else (index,), self.shape)
        experts = range(box[0].start, box[0].stop, box[0].step)
        return np.stack([self.each[e][tuple(box[1:])] for e in experts])

    def __array__(self, dtype=None, copy=None):
        return self[()].astype(dtype or np.float32)


def hf_tensor(found, name, shape, key, transposed, part, parts, flag, prefix, alt):
    """(the checkpoint's names read, tensor or None) of parameter `name` of `shape` stored under `key`
    (a moe layer's experts: `*` for the expert index, one tensor per expert), or under `key` without
    `prefix` (a checkpoint of the base model), or else under its name in `alt` (transformers 5's layout:
    the experts of a layer fused in one tensor, gate and up joined)."""

    def at(k):
        return k if k in found or k.removeprefix(prefix) not in found else k.removeprefix(prefix)

    keys = [at(key.replace("*", str(e))) for e in range(shape[0])] if "*" in key else [at(key)]
    if not all(k in found for k in keys) and name in alt:
        key, transposed, part, parts = alt[name]
        keys = [at(key)] if at(key) in found else keys
    if not all(k in found for k in keys):
        return keys, None
    each = [
        FileTensor(*found[k], transposed, part, parts, flag=flag)
        if isinstance(found[k], tuple)
        else found[k]
        for k in keys
    ]
    return keys, ExpertTensors(each) if "*" in key else each[0]


def read_params(path, params, flag="--init-params", hf=None):
    """--init-params (`flag`: the option that names the file in messages): the parameters of `params`
    ({canonical name: (shape, ...)}) by canonical name in canonical layout, every one with its shape. A .npz
    is read whole (small models); a .safetensors file (or, with `hf`, a transformers model directory:
    model.safetensors, or shards listed in model.safetensors.index.json) lazily, each process reading only
    its slices. `hf`: (names, prefix, alt) of a spec imported from Hugging Face: canonical name ->
    (transformers name, transposed, part, parts), the prefix a checkpoint of the base model leaves out,
    and the names of transformers 5's layout read where the first are missing."""
    if hf:
        require(os.path.exists(path), f"{flag} {path}: no such file")
    else:
        why = "not a file" if os.path.exists(path) else "no such file"
        require(os.path.isfile(path), f"{flag} {path}: {why}")
    try:
        if path.endswith(".npz"):
            with np.load(path) as f:
                found = {k: f[k] for k in f.files}
        else:
            found = safetensors_tensors(path)
    except Exception as e:  # not such a file, truncated, unreadable, Python objects in a .npz
        kind = ".safetensors file or model directory" if hf else ".safetensors file"
        kind = ".npz archive" if path.endswith(".npz") else kind
        require(False, f"{flag} {path}: cannot read it as a {kind} ({' '.join(str(e).split())})")
    nonfinite = [
        k
        for k, a in found.items()
        if not isinstance(a, tuple) and a.dtype.kind == "f" and not np.isfinite(a).all()
    ]
    require(
        not nonfinite,
        f"{flag} {path}: non-finite values (NaN or inf) in {', '.join(nonfinite[:5])}",
    )
    out, wrong = {}, []
    names, prefix, alt = hf or ({}, "", {})
    canonical = not hf or all(name in found for name in params)  # else by the transformers names
    read = set()  # the checkpoint's names that were read
    for name, (shape, *_) in params.items():
        if canonical:
            key, t = name, found.get(name)
            read.add(key)
            if isinstance(t, tuple):  # (handle, key) of a safetensors tensor
                t = FileTensor(*t, flag=flag)
        else:  # by the transformers names (of the base model, or the model with its head)
            keys, t = hf_tensor(found, name, shape, *names[name], flag, prefix, alt)
            read.update(keys)
            key = keys[0]
        lazy = isinstance(t, FileTensor | ExpertTensors)
        why = (
            "(missing)"
            if t is None
            else f"of shape {list(t.shape)} (expected {list(shape)})"
            if tuple(t.shape) != tuple(shape)
            else None
            if (t.floating if lazy else t.dtype.kind == "f")
            else f"of dtype {t.dtype} (expected floating point: float16, bfloat16, float32 or float64)"
        )
        if why:
            wrong.append(f"{key} {why}")
        else:
            out[name] = t if lazy else np.asarray(t, np.float32)
    if not hf:
        wrong += [f"{key} (unknown)" for key in found if key not in params]
    else:
        # tensors of this model's kind left unread (another layer count: `layers.2.` where the model has
        # two): the checkpoint is of another model; other names (buffers, another task's head) are left alone
        def pattern(key):
            return ".".join("#" if p.isdigit() else p for p in key.removeprefix(prefix).split("."))

        kinds = {pattern(key) for key in read}
        wrong += [f"{key} (extra)" for key in found if key not in read and pattern(key) in kinds]
    more = f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""
    what = "checkpoint" if hf else "parameters"
    require(not wrong, f"{flag} {path}: not this model's {what}: {', '.join(wrong[:5])}{more}")
    return out


def safetensors_tensors(path):
    """name -> (open file, name) of every tensor in a safetensors file, a model directory, or its shards."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):  # shards: name -> file
        with open(index) as f:
            files = {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
    else:
        path = os.path.join(path, "model.safetensors") if os.path.isdir(path) else path
        require(os.path.isfile(path), f"--init-params {path}: no such file")
        handle = SafetensorsFile(path)
        return {key: (handle, key) for key in handle.keys()}
    handles = {file: SafetensorsFile(file) for file in set(files.values())}
    held = {file: set(handle.keys()) for file, handle in handles.items()}
    lacking = [
        f"{key} ({os.path.basename(file)})" for key, file in files.items() if key not in held[file]
    ]
    require(
        not lacking,
        f"model.safetensors.index.json names tensors their shards lack: {', '.join(lacking[:5])}",
    )
    return {key: (handles[file], key) for key, file in files.items()}


def write_params(path, arrays, spec):
    """--export-params: canonical names and layout, float32; .safetensors (its metadata naming the `spec`),
    or .npz for any other name. Written atomically: a temporary file beside the target, then a rename."""
    arrays = {k: np.ascontiguousarray(np.asarray(v, dtype=np.float32)) for k, v in arrays.items()}
    if path.endswith(".safetensors"):
        from safetensors.numpy import save_file

        tmp = f"{path}.tmp-{os.getpid()}"
        save_file(arrays, tmp, metadata={"format": "mithril-spec", "spec": spec})
    else:
        tmp = f"{path}.tmp-{os.getpid()}.npz"
        np.savez(tmp, **arrays)
    os.chmod(tmp, 0o644)  # (safetensors creates its files readable by their owner only)
    os.replace(tmp, path)
    print(f"wrote {path} ({len(arrays)} arrays)", flush=True)
