"""A build is atomic as a whole (mithril_spec/atomic.py): the output directory holds the old build or the new
one, never a mixture, whenever the build stops (an error, or a kill at any point); files of another target
never survive; what the program wrote there (checkpoints, metrics) is kept; output path problems are usage
errors (exit code 2) with one line."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from mithril_spec import atomic, cli
from mithril_spec.render.build import build_files

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "mlp-dp.yaml"

OLD = {"train.py": ("old train\n", 0o644), "launch.sh": ("old launch\n", 0o755),
       "launch.sbatch": ("old sbatch\n", 0o755), "README.md": ("old readme\n", 0o644),
       "plan.json": ("{\"old\": 1}\n", 0o644)}
NEW = {"train.py": ("new train\n", 0o644), "launch.sh": ("new launch\n", 0o755),
       "README.md": ("new readme\n", 0o644), "plan.json": ("{\"new\": 1}\n", 0o644)}
USER = {"metrics.jsonl": "1\n", "ckpt/step_1/params.bin": "weights\n"}


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err, err
    return rc, out, err


def tree(path: Path) -> dict[str, str]:
    """Every file under `path` (relative name -> text); hidden leftovers beside it are checked separately."""
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


def make_old(dest: Path) -> None:
    dest.mkdir(parents=True)
    for name, (text, mode) in OLD.items():
        (dest / name).write_text(text)
        os.chmod(dest / name, mode)
    for name, text in USER.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(text)


def expected(files: dict) -> dict[str, str]:
    return {**{name: text for name, (text, _mode) in files.items()}, **USER}


def leftovers(dest: Path) -> list[str]:
    return [n for n in os.listdir(dest.parent) if n.startswith(f".{dest.name}.mithril-")]


# ---------------------------------------------------------------- the swap


def test_new_build_replaces_the_old_one_and_keeps_user_files(tmp_path):
    dest = tmp_path / "out"
    make_old(dest)
    written = atomic.replace_directory(dest, NEW, build_files())
    assert written == [dest / n for n in NEW]
    assert tree(dest) == expected(NEW)  # launch.sbatch of the old (torch) build is gone
    assert os.stat(dest / "launch.sh").st_mode & 0o777 == 0o755
    assert os.stat(dest / "train.py").st_mode & 0o777 == 0o644
    assert not leftovers(dest)


def test_a_fresh_directory_and_missing_parents(tmp_path):
    dest = tmp_path / "a" / "b" / "out"
    atomic.replace_directory(dest, NEW, build_files())
    assert tree(dest) == {n: t for n, (t, _m) in NEW.items()}
    assert os.stat(dest).st_mode & 0o777 == 0o777 & ~atomic._umask()
    assert not leftovers(dest)


def test_a_failed_swap_leaves_the_old_build(tmp_path, monkeypatch):
    dest = tmp_path / "out"
    make_old(dest)

    def fail(a, b):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic, "_exchange", fail)
    with pytest.raises(atomic.OutputError, match="Input/output error"):
        atomic.replace_directory(dest, NEW, build_files())
    assert tree(dest) == expected(OLD)
    assert not leftovers(dest)


@pytest.mark.parametrize("failing_call", [1, 2, 3])
def test_a_failure_between_the_renames_leaves_the_old_build_or_the_new(tmp_path, monkeypatch, failing_call):
    """Where the system cannot exchange two names, the swap is renames: one failing leaves either build."""
    dest = tmp_path / "out"
    make_old(dest)
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    calls = []
    real = os.rename

    def rename(a, b):
        calls.append((a, b))
        # call 1 marks the new build complete; 2 moves the old aside, 3 puts the new in place, 4 renames the old
        if len(calls) == failing_call + 1:
            raise OSError(28, "No space left on device")
        return real(a, b)

    monkeypatch.setattr(os, "rename", rename)
    try:
        atomic.replace_directory(dest, NEW, build_files())
    except atomic.OutputError:
        pass
    monkeypatch.setattr(os, "rename", real)
    assert tree(dest) in (expected(OLD), expected(NEW))
    atomic._recover(dest.parent, dest.name, dest)  # what the next build does first
    assert tree(dest) in (expected(OLD), expected(NEW))
    assert not leftovers(dest)


HOOKS = ("rename", "fsync", "chmod", "link", "mkdir", "rmtree", "_exchange", "open")


def _kill_at(dest: Path, k: int, exchange: bool) -> int:
    """Runs replace_directory in a child process killed (os._exit) at its k-th file system call; returns how
    many calls there were when it was not killed."""
    pid = os.fork()
    if pid == 0:  # the child: count the calls, die at the k-th
        count = [0]

        def wrap(fn):
            def inner(*a, **kw):
                count[0] += 1
                if count[0] == k:
                    os._exit(137)
                return fn(*a, **kw)
            return inner

        os.rename, os.fsync, os.chmod, os.link, os.mkdir = (
            wrap(os.rename), wrap(os.fsync), wrap(os.chmod), wrap(os.link), wrap(os.mkdir))
        atomic.shutil.rmtree = wrap(shutil.rmtree)
        atomic._exchange = wrap(atomic._exchange if exchange else (lambda a, b: False))
        atomic.open = wrap(open)
        try:
            atomic.replace_directory(dest, NEW, build_files())
        except BaseException:  # noqa: BLE001
            os._exit(2)
        os._exit(min(count[0], 250))
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
# (where another test of the same worker imported jax, Python warns that its threads could hold a lock the
# child needs: the child only calls the file system and os._exit)
@pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")
@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "renames"])
def test_a_kill_at_any_point_leaves_the_old_build_or_the_new(tmp_path, exchange):
    if exchange and not atomic._exchange(tmp_path, tmp_path):
        pytest.skip("no atomic exchange on this system")
    dest = tmp_path / "probe"
    make_old(dest)
    calls = _kill_at(dest, 10**6, exchange)  # a run that is not killed: how many calls it makes
    assert tree(dest) == expected(NEW) and 5 < calls < 250
    for k in range(1, calls + 1):
        dest = tmp_path / f"out{k}"
        make_old(dest)
        assert _kill_at(dest, k, exchange) == 137
        if exchange:  # one atomic system call: at every moment, one build or the other
            assert tree(dest) in (expected(OLD), expected(NEW)), k
        else:  # two renames: a kill between them leaves the complete new build beside, put in place next time
            assert not dest.exists() or tree(dest) in (expected(OLD), expected(NEW)), k
        atomic._recover(dest.parent, dest.name, dest)  # what the next build does first
        assert tree(dest) in (expected(OLD), expected(NEW)), k
        assert not leftovers(dest), k


# ---------------------------------------------------------------- the command line


def test_jax_build_over_a_torch_build_keeps_no_torch_file(tmp_path, capsys):
    out = tmp_path / "out"
    assert run(capsys, "build", SPEC, "--target", "torch", "-o", out)[0] == 0
    assert (out / "launch.sbatch").is_file()
    (out / "metrics.jsonl").write_text("{}\n")  # written by the program
    rc, stdout, _ = run(capsys, "build", SPEC, "--target", "jax", "-o", out)
    assert rc == 0
    assert sorted(os.listdir(out)) == ["README.md", "build-manifest.json", "checkpoint.py", "config.py", "data.py",
                                       "launch.sbatch", "launch.sh", "metrics.jsonl", "model.py", "parallel.py",
                                       "plan.json", "runtime", "train.py"]
    assert "(JAX)" in (out / "README.md").read_text()
    assert "import jax" in (out / "launch.sbatch").read_text()  # jax's own, torch's replaced
    runtime = sorted(f"runtime/{p.name}" for p in (out / "runtime").glob("*.py"))
    runtime += sorted(f"runtime/jax/{p.name}" for p in (out / "runtime" / "jax").glob("*.py"))  # jax's own
    assert "runtime/console.py" in runtime and "runtime/jax/rows.py" in runtime
    assert stdout.splitlines() == [f"wrote {out / n}" for n in ("config.py", "model.py", "parallel.py", "data.py",
                                                                "checkpoint.py", "train.py", "launch.sh",
                                                                "launch.sbatch", "README.md", *runtime, "plan.json",
                                                                "build-manifest.json")]
    assert not leftovers(out)


def test_a_file_edited_since_the_build_is_not_overwritten_without_force(tmp_path, capsys):
    out = tmp_path / "out"
    assert run(capsys, "build", SPEC, "--target", "jax", "-o", out)[0] == 0
    manifest = json.loads((out / "build-manifest.json").read_text())["files"]
    assert sorted(n for n in manifest if not n.startswith("runtime/")) == [
        "README.md", "checkpoint.py", "config.py", "data.py", "launch.sbatch", "launch.sh", "model.py", "parallel.py",
        "plan.json", "train.py"]
    assert "runtime/checkpoints.py" in manifest
    assert run(capsys, "build", SPEC, "--target", "jax", "-o", out)[0] == 0  # unchanged: rebuilt
    edited = (out / "train.py").read_text().replace("\nLR = ", "\nLR = 2 * ", 1)
    (out / "train.py").write_text(edited)
    (out / "metrics.jsonl").write_text("{}\n")  # not a build file: never in the way
    rc, stdout, err = run(capsys, "build", SPEC, "--target", "torch", "-o", out)
    assert rc == 2 and stdout == ""
    assert "train.py changed since the build that wrote it" in err and "--force" in err and err.count("\n") == 1
    assert (out / "train.py").read_text() == edited  # nothing replaced
    rc, _stdout, _err = run(capsys, "build", SPEC, "--target", "torch", "-o", out, "--force")
    assert rc == 0 and (out / "launch.sbatch").is_file() and "LR = 2 * " not in (out / "train.py").read_text()
    (out / "build-manifest.json").write_text("{not json")
    rc, _stdout, err = run(capsys, "build", SPEC, "--target", "torch", "-o", out)
    assert rc == 2 and "build-manifest.json changed" in err


def test_a_failed_build_keeps_the_old_one(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert run(capsys, "build", SPEC, "--target", "torch", "-o", out)[0] == 0
    before = tree(out)

    def fail(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "_exchange", fail)
    rc, _, err = run(capsys, "build", SPEC, "--target", "jax", "-o", out)
    assert rc == 2 and err.count("\n") == 1 and "No space left on device" in err, err
    assert tree(out) == before and not leftovers(out)


@pytest.mark.parametrize("case", ["file", "under-file", "not-a-build", "dir-for-file", "unwritable"])
def test_output_path_errors_are_usage_errors(tmp_path, capsys, monkeypatch, case):
    out = tmp_path / "out"
    if case == "file":
        out.write_text("x")
    elif case == "under-file":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "out"
    elif case == "not-a-build":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case == "dir-for-file":
        (out / "train.py").mkdir(parents=True)
        (out / "plan.json").write_text("{}")
    else:
        class Denied:  # (as root, permissions cannot be taken away: the directory refuses new entries here)
            @staticmethod
            def mkdtemp(*a, **kw):
                raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(atomic, "tempfile", Denied)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rc, _, err = run(capsys, "build", SPEC, "--target", "jax", "-o", out)
    assert rc == 2, err
    assert err.startswith("mithril-spec: error: ") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written, nothing removed


def test_report_into_a_missing_directory_is_a_usage_error(tmp_path, capsys):
    missing = tmp_path / "nodir" / "r.html"
    rc, _, err = run(capsys, "plan", SPEC, "--report", missing)
    assert rc == 2 and "no such directory" in err and err.count("\n") == 1
    assert not (tmp_path / "nodir").exists()
    rc, _, err = run(capsys, "plan", SPEC, "--report", tmp_path)
    assert rc == 2 and "is a directory" in err
    (tmp_path / "f").write_text("x")
    rc, _, err = run(capsys, "plan", SPEC, "--report", tmp_path / "f" / "r.html")
    assert rc == 2 and "not a directory" in err
    rc, _, err = run(capsys, "plan", SPEC, "--report", tmp_path / "r.html")
    assert rc == 0 and (tmp_path / "r.html").is_file()


@pytest.mark.skipif(sys.platform == "win32", reason="posix paths")
def test_schema_output_under_a_file_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    rc, _, err = run(capsys, "schema", "-o", tmp_path / "f" / "s.json")
    assert rc == 2 and "not a directory" in err
