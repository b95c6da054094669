"""Checkpoint manifests (docs/program.md "Checkpoints"): the manifest a checkpoint directory ends with, its
verification, and --resume's choice of the newest usable checkpoint.

Every checkpoint directory ends with its manifest, written last, once every process has written its files:
the spec's name and hash, the mesh, the step, every array of the train state (name: whole shape, dtype) and
every other file's size and sha256. --resume takes the newest checkpoint whose manifest agrees with its
files and with this program, and whose values are finite."""

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys

from .cli import existing_ancestor
from .errors import Refusal, require


class Manifests:
    """The manifests of one program's checkpoints: `name`, the manifest's file name in a checkpoint
    directory; `spec`, the spec's name; `spec_hash`, the spec less where and how it runs (mesh, sharding,
    pipeline, data, steps); `model_hash`, that less the optimizer `settings`, which a resumed run may change
    (a note says which changed); `mesh`, the mesh it runs on."""

    def __init__(self, name, spec, spec_hash, model_hash, settings, mesh):
        self.name, self.spec, self.spec_hash, self.model_hash = name, spec, spec_hash, model_hash
        self.settings, self.mesh = settings, mesh

    def files(self, path):
        """{name: {bytes, sha256}} of every file under the checkpoint directory `path` but its manifest."""
        names = sorted(
            os.path.relpath(os.path.join(d, n), path)
            for d, _, found in os.walk(path)
            for n in found
        )
        return {
            n.replace(os.sep, "/"): {
                "bytes": os.path.getsize(os.path.join(path, n)),
                "sha256": sha256(os.path.join(path, n)),
            }
            for n in names
            if n != self.name
        }

    def write(self, path, step, arrays, **extra):
        """Writes the manifest of the checkpoint directory `path`, its last file. `arrays`: name -> (whole
        shape, dtype) of the train state; `extra`: more to record."""
        manifest = {
            "spec": self.spec,
            "spec_hash": self.spec_hash,
            "model_hash": self.model_hash,
            "settings": self.settings,
            "mesh": self.mesh,
            "step": step,
            **extra,
            "arrays": {n: [list(shape), dtype] for n, (shape, dtype) in sorted(arrays.items())},
            "files": self.files(path),
        }
        with open(os.path.join(path, self.name + ".tmp"), "w") as f:
            json.dump(manifest, f, indent=1)
        os.replace(os.path.join(path, self.name + ".tmp"), os.path.join(path, self.name))

    def verify(self, path, step, arrays, more=lambda manifest: None):
        """Why this program cannot resume from the checkpoint directory `path`, or None: its manifest missing
        or of another spec, of another step than `step` (from the directory's name; None: not named by step),
        what `more(manifest)` finds wrong, other arrays than `arrays` (name -> (whole shape, dtype)), a file
        missing, truncated or corrupt."""
        name, spec = self.name, self.spec
        try:
            with open(os.path.join(path, name)) as f:
                m = json.load(f)
            want = {n: [list(shape), dtype] for n, (shape, dtype) in arrays.items()}
            wrong = [
                f"{n} ({m['arrays'].get(n, 'none')} there, {want.get(n, 'none')} here)"
                for n in sorted({*want, *m["arrays"]})
                if want.get(n) != m["arrays"].get(n)
            ]
            problems = (  # (wrong, why), cheapest first: the first that is wrong is the answer
                (
                    m["spec"] != spec,
                    f"it is a checkpoint of the spec {m['spec']!r}, not of {spec!r}"
                    + other_model(m["arrays"], want),
                ),
                # (only the optimizer settings differ: the same model hash; settings_note says which)
                (
                    m["spec_hash"] != self.spec_hash and m.get("model_hash") != self.model_hash,
                    f"it is a checkpoint of another version of the spec {spec!r} (spec "
                    f"hash {m['spec_hash']}, this program's {self.spec_hash}): its model or training settings differ"
                    + other_model(m["arrays"], want),
                ),
                (
                    step is not None and m["step"] != step,
                    f"the step in {name} ({m['step']}) and in the directory name ({step}) disagree",
                ),
                (bool(why := more(m)), why),
                (
                    bool(wrong),
                    f"its train state differs from this program's: {'; '.join(wrong[:3])}",
                ),
            )
            have = self.files(path) if not any(bad for bad, _ in problems) else {}
        except FileNotFoundError:
            return f"no {name}: an incomplete checkpoint (its writer stopped before the end?)"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"its {name} is unreadable ({type(e).__name__}: {e})"
        return next((why for bad, why in problems if bad), None) or next(
            (
                f"missing file {n}"
                if n not in have
                else f"{n} is {have[n]['bytes']} bytes, {f['bytes']} in {name} (truncated?)"
                if have[n]["bytes"] != f["bytes"]
                else f"{n}: checksum mismatch (the file is corrupt)"
                for n, f in sorted(m["files"].items())
                if have.get(n) != f
            ),
            None,
        )

    def settings_note(self, path):
        """The note of a resume with other optimizer settings than the checkpoint `path`'s, or None."""
        try:
            with open(os.path.join(path, self.name)) as f:
                saved = json.load(f).get("settings") or {}
        except (OSError, ValueError):
            return None
        changed = [
            f"{k} {saved[k]} -> {v}"
            for k, v in self.settings.items()
            if k in saved and saved[k] != v
        ]
        return (
            (
                f"note: {', '.join(changed)} (the checkpoint's -> this program's): the run continues with this "
                "program's optimizer settings"
            )
            if changed
            else None
        )


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def other_model(saved, want):
    """For a checkpoint of another spec: how its train state differs from this program's (the first names
    missing from it, unexpected in it, of other shapes), and how to start from its parameters instead."""

    def first(names):  # parameters before optimizer state
        return sorted(names, key=lambda n: (not n.startswith(("params/", "model/")), n))

    missing = first(set(want) - set(saved))
    unexpected = first(set(saved) - set(want))
    reshaped = first(n for n in set(want) & set(saved) if want[n] != saved[n])
    parts = [
        f"{what} {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
        for what, names in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("other shapes", reshaped),
        )
        if names
    ]
    return (
        (f" ({'; '.join(parts)})" if parts else "")
        + ". For a warm start from its parameters, export them "
        "with that spec's program (--resume DIR --export-params FILE) and pass --init-params FILE"
    )


def remove_partial(root):
    """Removes the partial checkpoint directories in `root` (`.tmp_step_*`: saves cut short, by a kill or a
    failure; a save in progress is never one when a new one begins), which would otherwise hold their space
    for good."""
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if name.startswith(".tmp_step_"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def unsaved(step, root, error, needed=0):
    """The Refusal (one line, exit 2) of the checkpoint of `step` that could not be written into `root` when
    the storage failed it: an OSError (a directory that cannot be made, a read-only or full filesystem) in
    `error`'s causes (DCP's CheckpointException: each rank's), or less space left there than the checkpoint's
    `needed` bytes (a full disk that the writer reported otherwise). None for any other failure (a peer
    process gone: a crash, which a restart continues). The checkpoints saved before it are complete."""
    causes, seen = [error], []
    while causes:
        e = causes.pop(0)
        if isinstance(e, BaseException) and all(e is not x for x in seen):
            seen.append(e)
            failures = getattr(e, "failures", None)
            causes += [e.__cause__, e.__context__, *(f[0] for f in (failures or {}).values())]
    try:
        free = shutil.disk_usage(existing_ancestor(root)).free
    except OSError:
        free = None
    storage = next((e for e in seen if isinstance(e, OSError)), None)
    if storage is None and (free is None or free >= needed):
        return None
    first = storage or seen[-1]
    why = next((line.strip() for line in str(first).splitlines() if line.strip()), "")
    full = storage is None or storage.errno == errno.ENOSPC
    space = f"; {free:,} bytes free on its filesystem" if full and free is not None else ""
    return Refusal(
        f"checkpoint: step {step} could not be saved in {root} ({type(first).__name__}: {why[:300]}{space}); "
        "the checkpoints saved before it are kept: continue from them with --resume auto once "
        + ("there is room" if full else "it can be written")
    )


@contextlib.contextmanager
def writing(step, root, needed, partial=None, errors=(Exception,)):
    """Around the writing of the checkpoint of `step` into `root`: where the storage fails it (unsaved: a
    full disk, a directory that cannot be made), its partial directory `partial` (if any) is removed and the
    program stops with one line, exit 2; any other failure (of `errors`) is raised as it is. `needed()`: the
    checkpoint's bytes on this process."""
    try:
        yield
    except errors as e:
        refusal = unsaved(step, root, e, needed())
        if refusal is None:
            raise
        if partial:
            shutil.rmtree(partial, ignore_errors=True)
        raise refusal from None


def checkpoint_dirs(path, step_of):
    """{step: directory} of the checkpoints --resume `path` names: those in `path` (`step_of(name)`: the
    step a directory's name gives, or None), or `path` itself when it is one."""
    names = os.listdir(path) if os.path.isdir(path) else []
    found = {step: os.path.join(path, n) for n in names if (step := step_of(n)) is not None}
    own = step_of(os.path.basename(os.path.abspath(path)))
    return found or ({own: path} if own is not None and names else {})


def resume_from(path, found, verify, restore, manifests, say=True):
    """(step, restored state) of the newest usable checkpoint of `found` ({step: directory}, what --resume
    `path` names). `verify(step, directory)` and then `restore(step, directory)` -> (state, why not) say
    whether one is usable (every process reaches the same verdict). A newer one that is not is skipped with
    a warning (printed where `say`, with the note of `manifests.settings_note`); when none is, exit 2
    naming why (once for the checkpoints refused alike)."""
    require(found, f"--resume {path}: no checkpoint there")
    skipped = []
    for step in sorted(found, reverse=True):
        state, why = (
            (None, why) if (why := verify(step, found[step])) else restore(step, found[step])
        )
        if not why:
            for where, why in skipped if say else ():
                print(
                    f"warning: skipping checkpoint {where}: {why}; resuming from {found[step]} (step {step})",
                    file=sys.stderr,
                    flush=True,
                )
            if say and (note := manifests.settings_note(found[step])):
                print(note, flush=True)
            return step, state
        skipped.append((found[step], why))
    alike = {}  # why -> the checkpoints it refuses (a directory of another spec's: every one, said once)
    for where, why in skipped:
        alike.setdefault(why, []).append(where)
    require(
        False,
        f"--resume {path}: no usable checkpoint: "
        + "; ".join(f"{', '.join(wheres)}: {why}" for why, wheres in alike.items()),
    )


def resolve_resume(args, say, step_of, most=None):
    """--resume auto: the checkpoint directory when it holds checkpoints (--resume then takes the newest
    usable one; `step_of(name)` reads a checkpoint directory's step), else a fresh start, which `say` prints
    in one line. `most(n)`: the largest of the processes' restart counts, on every process (torchrun counts
    a restart where a rank failed, not always on the other nodes, whose ranks would otherwise start afresh
    while the rest resume). A run that resumes does not read --init-params: `say` notes it."""
    # a restart (torchrun --max-restarts, launch.sh's MAX_RESTARTS) continues from the newest checkpoint
    restart = int(
        os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("MITHRIL_RESTART") or 0
    )
    restart = most(restart) if most else restart
    if restart and args.checkpoint_dir:
        say(f"restart {restart}: continuing as --resume auto")
        args.resume = "auto"
    if args.resume == "auto":
        where = args.checkpoint_dir
        require(where, "--resume auto: this spec saves no checkpoints; pass --checkpoint-dir DIR")
        found = checkpoint_dirs(where, step_of) if os.path.isdir(where) else {}
        args.resume = where if found else None
        if not found:  # (what it found is said once checked: `resumed from DIR at step N`)
            say(f"--resume auto: no checkpoint in {where}: starting fresh")
    # (a restart of a run that started from --init-params passes it again: not an error)
    if args.resume and getattr(args, "init_params", None):
        say(
            f"note: --init-params {args.init_params} not read: the run continues from the checkpoint of "
            f"--resume {args.resume}, which holds every parameter"
        )


def check_start(args, start, saved, spec_dir):
    """Before the first step: --resume must leave steps to run, and --checkpoint-dir must not hold later
    checkpoints (`saved`: the steps it holds) of another run. With --resume of that same directory, the
    later ones are those --resume found unusable: this run's saves replace them. `spec_dir`: the spec's
    checkpoint directory (the default of --checkpoint-dir)."""
    # (with nothing to train, a resumed run may still export what it restored)
    exports = any(getattr(args, flag, None) for flag in ("export_params", "export_hf", "logits"))
    require(
        not args.resume or args.steps > start or exports,
        f"--resume {args.resume}: the checkpoint is at "
        f"step {start}, --steps {args.steps} asks for nothing more: pass --steps above {start} (or "
        "--export-params FILE to write its parameters)",
    )
    later = sorted(s for s in saved if s > start)
    where = (
        f"--checkpoint-dir {args.checkpoint_dir}"
        if args.checkpoint_dir != spec_dir
        else f"the spec's checkpoint directory {args.checkpoint_dir} (checkpoint.dir)"
    )
    require(
        not later
        or (args.resume and os.path.realpath(args.resume) == os.path.realpath(args.checkpoint_dir)),
        f"{where} already holds checkpoints of steps after {start} ({later}): pass --resume auto to continue "
        "from them, or --checkpoint-dir DIR to save into another directory",
    )
