"""Atomic output.

`write_atomic`: one file, written to a temporary file beside it and renamed over it.

`replace_directory`: a whole build directory. The new build is written into a fresh directory beside the
target and swapped in with one atomic exchange of the two names (`renameat2(RENAME_EXCHANGE)` on Linux,
`renamex_np(RENAME_SWAP)` on macOS), so that a reader, or a kill at any moment, sees either the old build or
the new one, complete, never a mixture. Elsewhere (or on a file system without exchange) the swap is two
renames, with the new build marked complete before the first: a build killed between the two is finished by
the next one. Nothing of the old build survives in the new output: the files a build writes (any target's)
come from the new build only. Whatever else the old directory held (checkpoints, metrics written by the
program) is carried over as hard links, so rebuilding never loses it. A non-empty directory that is not a
build (no `plan.json`) is refused rather than replaced.

Every problem with the output path (a file where a directory is wanted, a directory where a file is, a
parent that cannot be written) is an `OutputError`: the command line makes it a usage error (exit code 2)
with one line.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

BUILD_MARK = "plan.json"  # every build writes it: a directory holding it is a build


class OutputError(Exception):
    """An output path that cannot be written (a usage error, exit code 2)."""


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def write_atomic(path: Path, text: str, create_parents: bool = True) -> None:
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path}: is a directory")
    if create_parents:
        _make_parents(path.parent)
    elif not path.parent.is_dir():
        what = "not a directory" if path.parent.exists() else "no such directory"
        raise OutputError(f"{path}: {what}: {path.parent}")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OutputError(f"{path}: cannot write in {path.parent}: {_why(e)}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write: {_why(e)}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _make_parents(directory: Path) -> None:
    """`mkdir -p`, with a clear error when a file stands where a directory is wanted."""
    for p in [directory, *directory.parents]:
        if p.exists():
            if not p.is_dir():
                raise OutputError(f"{directory}: {p} is not a directory")
            break
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{directory}: cannot create the directory: {_why(e)}") from None


# ---------------------------------------------------------------- whole directories


def _resolve(out: Path) -> Path:
    dest = Path(os.path.realpath(out))
    if dest.parent == dest:
        raise OutputError(f"{out}: cannot build into the root directory")
    return dest


def check_directory(out: Path, owned: Iterable[str]) -> None:
    """Refuses (OutputError) an output directory that a build cannot replace: one that is a file or lies
    under a file, a non-empty directory that is not a build, a build whose file names are taken by
    directories. Called before anything is rendered."""
    out = Path(out)
    dest = _resolve(out)
    if dest.exists() or dest.is_symlink():
        if not dest.is_dir():
            raise OutputError(f"{out}: exists and is not a directory")
        try:
            names = sorted(os.listdir(dest))
        except OSError as e:
            raise OutputError(f"{out}: cannot read the directory: {_why(e)}") from None
        names = [n for n in names if not _ours(n, dest.name)]
        if names and BUILD_MARK not in names:
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise OutputError(f"{out}: exists and is not a mithril-spec build (it holds {shown}): build into a new "
                              "or empty directory")
        for name in sorted(set(owned) | {BUILD_MARK}):
            p = dest / name
            if (p.exists() or p.is_symlink()) and (p.is_dir() or not p.is_file()):
                raise OutputError(f"{out / name}: is a directory; the build writes a file there")
        return
    for p in dest.parents:
        if p.exists():
            if not p.is_dir():
                raise OutputError(f"{out}: {p} is not a directory")
            if not os.access(p, os.W_OK | os.X_OK):
                raise OutputError(f"{out}: cannot create it in {p}: permission denied")
            break


def _ours(name: str, base: str) -> bool:
    """A temporary directory of a build of `base` (never part of a build itself)."""
    return name.startswith(f".{base}.mithril-")


def replace_directory(out: Path, files: dict[str, tuple[str, int]], owned: Iterable[str]) -> list[Path]:
    """Makes `out` a directory holding exactly `files` ({name: (text, mode)}) plus whatever the old directory
    held that is not a build file (`owned`, and plan.json), swapped in atomically. Returns the paths written."""
    out = Path(out)
    owned = set(owned) | set(files) | {BUILD_MARK}
    check_directory(out, owned)
    owned |= {name.split("/")[0] for name in owned}  # a build's folders (runtime/) are its own too
    dest = _resolve(out)
    parent, base = dest.parent, dest.name
    _make_parents(parent)
    _recover(parent, base, dest)
    try:
        new = Path(tempfile.mkdtemp(dir=parent, prefix=f".{base}.mithril-new-"))
    except OSError as e:
        raise OutputError(f"{out}: cannot write in {parent}: {_why(e)}") from None
    try:
        for name, (text, mode) in files.items():
            path = new / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(path, mode)
        old_exists = dest.is_dir()
        if old_exists:
            for name in sorted(os.listdir(dest)):
                if name not in owned and not _ours(name, base):
                    _link_tree(dest / name, new / name)
        os.chmod(new, (os.stat(dest).st_mode & 0o7777) if old_exists else 0o777 & ~_umask())
        _fsync_dir(new)
        ready = parent / new.name.replace("mithril-new-", "mithril-ready-")
        os.rename(new, ready)  # complete: a later build may finish a swap that was cut short
        new = ready
        if old_exists:
            _swap(ready, dest, parent, base)
            shutil.rmtree(ready, ignore_errors=True)  # (it holds the old build now)
        else:
            os.rename(ready, dest)
        _fsync_dir(parent)
    except OSError as e:
        shutil.rmtree(new, ignore_errors=True)
        raise OutputError(f"{out}: cannot write the build: {_why(e)}") from None
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    return [out / name for name in files]


def _swap(ready: Path, dest: Path, parent: Path, base: str) -> None:
    """Exchanges the names `ready` and `dest` atomically; or, where that cannot be done, renames `dest` aside
    and `ready` into place (a kill between the two leaves `ready` complete, for `_recover`)."""
    if _exchange(ready, dest):
        return
    aside = Path(tempfile.mkdtemp(dir=parent, prefix=f".{base}.mithril-old-"))
    os.rmdir(aside)
    os.rename(dest, aside)
    try:
        os.rename(ready, dest)
    except BaseException:
        os.rename(aside, dest)  # the old build back in place
        raise
    os.rename(aside, ready)  # so that the caller removes the old build under the name it knows


def _recover(parent: Path, base: str, dest: Path) -> None:
    """Leftovers of a build that was killed: a complete new build whose swap was cut short is put in place;
    everything else (half-written new builds, old builds already replaced) is removed."""
    try:
        names = sorted(n for n in os.listdir(parent) if _ours(n, base))
    except OSError:
        return
    if not (dest.exists() or dest.is_symlink()):
        ready = [n for n in names if n.startswith(f".{base}.mithril-ready-")]
        old = [n for n in names if n.startswith(f".{base}.mithril-old-")]
        for name in ready[:1] or old[:1]:
            try:
                os.rename(parent / name, dest)
                names.remove(name)
            except OSError:
                pass
    for name in names:
        shutil.rmtree(parent / name, ignore_errors=True)


def _link_tree(src: Path, dst: Path) -> None:
    """`src` recreated at `dst` with hard links (a copy where a link cannot be made): no data is copied."""
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        os.mkdir(dst)
        for name in os.listdir(src):
            _link_tree(src / name, dst / name)
        shutil.copystat(src, dst)
    else:
        try:
            os.link(src, dst)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            shutil.copy2(src, dst)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_libc = None


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchanges two paths; False where the system or the file system cannot."""
    global _libc
    if sys.platform not in ("linux", "darwin"):
        return False
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        except OSError:
            _libc = False
    if not _libc:
        return False
    fa, fb = os.fsencode(a), os.fsencode(b)
    if sys.platform == "linux":
        fn = getattr(_libc, "renameat2", None)
        if fn is None:
            return False
        at_fdcwd, rename_exchange = -100, 2
        rc = fn(at_fdcwd, fa, at_fdcwd, fb, rename_exchange)
    else:
        fn = getattr(_libc, "renamex_np", None)
        if fn is None:
            return False
        rename_swap = 2
        rc = fn(fa, fb, rename_swap)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))
