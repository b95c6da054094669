"""Verified checkpoints (docs/program.md "Checkpoints"), in every target, on the one-device MLP.

One run per target writes checkpoints at steps 2 and 4; every other case is a copy of them, damaged:
- a corrupt newest checkpoint (a flipped byte) is skipped with a one-line warning, and the run continues
  from step 2 on the uninterrupted run's trajectory;
- a checkpoint alone that is corrupt, truncated, missing a file or its manifest, of another spec or
  another version of it, whose manifest's step disagrees with its directory, or that holds NaN (the
  state re-saved by the program's own functions, with a valid manifest) is refused: exit 2, one line
  naming what is wrong, no traceback;
- --steps at or below the checkpoint's step is refused before any step.
JAX and PyTorch: the checkpointing run, the fallback and the --steps runs are real processes; the damaged
copies are tried in one more process per target that calls the program's main() once per copy (catching
its exit: the code, what it printed) - a process per copy would cost seconds each.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import shutil
import struct
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import pytest
import torch_runs as tr

MLP = jr.SPECS / "mlp-dp.yaml"
MANIFEST = {"jax": "manifest.json", "torch": "manifest.json", "mlx": "train_state.json"}

# Tries every damaged copy in one process: the program imported as a module, main() called per copy (its
# exit caught, with what it printed). Before that, the NaN copy: the checkpoint restored, one parameter
# set to NaN, saved again by the program's own functions (so its manifest is valid).
DRIVER = r'''
import contextlib, importlib.util, io, json, os, sys, traceback
program, target, source, nan_dir, cases, out = sys.argv[1:]
sys.path.insert(0, @TESTS@)
from program_import import load_program
m = load_program(program)
if target == "jax":
    import jax
    args = m.parse_args(["--resume", source])
    m.setup_devices(args)
    mesh = m.make_mesh()
    with jax.set_mesh(mesh):
        optimizer = m.make_optimizer()
        shardings, _, abstract = m.layouts(mesh, optimizer)
        state = m.init_state(args, optimizer, shardings, abstract)
        name = sorted(state["params"])[0]
        state["params"][name] = state["params"][name] * float("nan")
        manager = m.CHECKPOINTS.manager(nan_dir)
        m.CHECKPOINTS.save(manager, int(state["step"]), state)
        manager.close()
else:
    import torch
    device, _, _ = m.setup()
    with torch.device("meta"):
        model = m.Model()
    model.to_empty(device=device)
    optimizer, scheduler = m.make_optimizer(model)
    step = m.CHECKPOINTS.load(source, model, optimizer, scheduler)
    with torch.no_grad():
        dict(model.named_parameters())[sorted(dict(model.named_parameters()))[0]].fill_(float("nan"))
    m.CHECKPOINTS.save(nan_dir, step, model, optimizer, scheduler)
results = {}
for case, path in json.loads(cases).items():
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            m.cli(["--steps", "6", "--resume", path, "--checkpoint-dir", ""])
        code = 0
    except SystemExit as e:
        code = e.code
    except Exception:
        code = 1
        printed.write(traceback.format_exc())
    results[case] = {"code": code, "output": printed.getvalue()}
with open(out, "w") as f:
    json.dump(results, f)
'''
DRIVER = DRIVER.replace("@TESTS@", repr(str(Path(__file__).resolve().parent)))  # tests/program_import.py


def step_dir(target: str, root: Path, step: int) -> Path:
    return root / (str(step) if target == "jax" else f"step_{step:08d}")


def data_file(target: str, where: Path) -> Path:
    """The checkpoint's largest file but its manifest (the one holding the arrays' values)."""
    files = [p for p in where.rglob("*") if p.is_file() and p.name != MANIFEST[target]]
    return max(files, key=lambda p: (p.stat().st_size, str(p)))


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def manifest(target: str, where: Path, **changes) -> dict:
    path = where / MANIFEST[target]
    m = json.loads(path.read_text())
    if changes:
        m.update(changes)
        path.write_text(json.dumps(m))
    return m


def nan_into_safetensors(path: Path, name: str) -> None:
    """The first value of float32 array `name` of a safetensors file set to NaN."""
    data = bytearray(path.read_bytes())
    (size,) = struct.unpack("<Q", data[:8])
    entry = json.loads(data[8:8 + size])[name]
    assert entry["dtype"] == "F32"
    start = 8 + size + entry["data_offsets"][0]
    data[start:start + 4] = struct.pack("<f", float("nan"))
    path.write_bytes(bytes(data))


def rehash(target: str, where: Path) -> None:
    """The manifest's file table recomputed: a checkpoint re-saved by hand, consistent again."""
    import hashlib

    m = manifest(target, where)
    m["files"] = {n: {"bytes": (where / n).stat().st_size, "sha256": hashlib.sha256((where / n).read_bytes()).hexdigest()}
                  for n in m["files"]}
    (where / MANIFEST[target]).write_text(json.dumps(m))


def damaged(target: str, base: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """case -> (--resume directory, what the refusal must say): copies of `base`'s step-4 checkpoint, each
    damaged one way. The NaN case is filled in later (the driver, or nan_into_safetensors)."""
    out: dict[str, tuple[Path, str]] = {}
    for case in ("flip", "truncated", "deleted", "no_manifest", "foreign", "other_version", "step", "nan"):
        where = step_dir(target, root / case, 4)
        if case != "nan" or target == "mlx":
            shutil.copytree(step_dir(target, base, 4), where)
        else:
            (root / case).mkdir(parents=True)
        f = data_file(target, where) if where.exists() else None
        name = f.relative_to(where).as_posix() if f else ""
        mf = MANIFEST[target]
        if case == "flip":
            flip(f)
            why = f"{name}: checksum mismatch (the file is corrupt)"
        elif case == "truncated":
            size = f.stat().st_size
            f.write_bytes(f.read_bytes()[: size // 2])
            why = f"{name} is {size // 2} bytes, {size} in {mf} (truncated?)"
        elif case == "deleted":
            f.unlink()
            why = f"missing file {name}"
        elif case == "no_manifest":
            (where / mf).unlink()
            why = f"no {mf}: an incomplete checkpoint"
        elif case == "foreign":
            manifest(target, where, spec="cnn-dp")
            why = ("it is a checkpoint of the spec 'cnn-dp', not of 'mlp-dp'. For a warm start from its parameters, "
                   "export them with that spec's program (--resume DIR --export-params FILE) and pass --init-params")
        elif case == "other_version":
            # (another model: a checkpoint whose model_hash is this program's differs in optimizer settings only,
            # which resume: tests/test_preemption.py)
            manifest(target, where, spec_hash="0123456789abcdef", model_hash="fedcba9876543210")
            why = "it is a checkpoint of another version of the spec 'mlp-dp' (spec hash 0123456789abcdef"
        elif case == "step":
            manifest(target, where, step=6)
            why = f"the step in {mf} (6) and in the directory name (4) disagree"
        else:
            why = "it holds non-finite values (params/fc1.bias" if target != "torch" else \
                "it holds non-finite values (model/fc1.bias"
            if target == "mlx":
                nan_into_safetensors(where / "state.safetensors", "params/fc1.bias")
                rehash(target, where)
        out[case] = (root / case, why)
    return out


def build(target: str) -> Path:
    return {"jax": jr.build, "torch": tr.build, "mlx": mr.build}[target](MLP, "single")


def run(target: str, *args: str, **kw):
    return {"jax": jr.run, "torch": tr.run, "mlx": mr.run}[target](build(target), *args, **kw)


def try_damaged(target: str, cases: dict[str, tuple[Path, str]], base: Path, root: Path) -> dict:
    """The driver (one process) on every damaged copy: case -> {code, output}."""
    import subprocess

    driver, out = root / "driver.py", root / "results.json"
    driver.write_text(DRIVER)
    env = jr.env_for({"JAX_NUM_CPU_DEVICES": "1"}) if target == "jax" else tr.env_for()
    paths = {case: str(path) for case, (path, _) in cases.items()}
    cmd = [jr.PY, str(driver), str(build(target)), target, str(base), str(cases["nan"][0]), json.dumps(paths), str(out)]
    p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(out.read_text())


def one_error_line(output: str) -> str:
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    return errors[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Per target: the checkpointing run, the fallback and --steps runs, and what every damaged copy did."""
    def target_runs(target: str) -> dict:
        root = tmp_path_factory.mktemp(f"ckpt-{target}")
        base = root / "base"
        full = run(target, "--steps", "4", "--checkpoint-dir", str(base), "--checkpoint-every", "2")
        fallback = root / "fallback"
        shutil.copytree(base, fallback)
        flip(data_file(target, step_dir(target, fallback, 4)))
        cases = damaged(target, base, root / "damaged")
        got: dict = {"full": full, "base": base, "fallback_dir": fallback, "cases": cases}
        got["fallback"] = run(target, "--steps", "4", "--resume", str(fallback))
        got["below"] = run(target, "--steps", "2", "--resume", str(base), expect_rc=2, export=False)
        got["export_only"] = run(target, "--steps", "0", "--resume", str(base))  # (with --export-params)
        if target == "mlx":  # cheap processes: one per copy
            got["tried"] = {case: {"code": r.rc, "output": r.output} for case, (path, _) in cases.items()
                            for r in [run(target, "--steps", "6", "--resume", str(path), expect_rc=2)]}
        else:
            got["tried"] = try_damaged(target, cases, base, root)
        return got

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(zip(("jax", "torch", "mlx"), pool.map(target_runs, ("jax", "torch", "mlx"))))


TARGETS = ["jax", "torch", "mlx"]
CASES = ["flip", "truncated", "deleted", "no_manifest", "foreign", "other_version", "step", "nan"]


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_manifest_records_the_spec_the_step_the_arrays_and_every_file(runs, target):
    base = runs[target]["base"]
    assert sorted(p.name for p in base.iterdir()) == sorted(step_dir(target, base, s).name for s in (2, 4))
    where = step_dir(target, base, 4)
    m = manifest(target, where)
    assert m["spec"] == "mlp-dp" and m["step"] == 4 and len(m["spec_hash"]) == 16
    assert math.prod(m["mesh"].values()) == 1  # the mesh it was written on: one device
    files = {p.relative_to(where).as_posix() for p in where.rglob("*") if p.is_file() and p.name != MANIFEST[target]}
    assert set(m["files"]) == files
    params = {n: v for n, v in m["arrays"].items() if n.startswith(("params/", "model/"))}
    assert params and all(dtype == "float32" for _, dtype in params.values())
    assert [s for n, (s, _) in params.items() if n.endswith("fc1.weight")] in ([[64, 256]], [[256, 64]])
    # the spec's hash is the same in every target's checkpoints
    assert len({manifest(t, step_dir(t, runs[t]["base"], 4))["spec_hash"] for t in TARGETS}) == 1
    assert len({manifest(t, step_dir(t, runs[t]["base"], 4))["model_hash"] for t in TARGETS}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(runs, target):
    got, full = runs[target]["fallback"], runs[target]["full"]
    newest = step_dir(target, runs[target]["fallback_dir"], 4)
    warnings = [line for line in got.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "Traceback" not in got.output
    assert warnings[0].startswith(f"warning: skipping checkpoint {newest}: ")
    assert "checksum mismatch (the file is corrupt)" in warnings[0]
    assert warnings[0].endswith(f"resuming from {step_dir(target, runs[target]['fallback_dir'], 2)} (step 2)")
    assert [r["step"] for r in got.metrics] == [3, 4]
    assert jr.max_diff(got.losses, full.losses[2:]) <= 1e-6
    assert jr.max_param_diff(got.params, full.params) <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES)
def test_damaged_checkpoint_is_refused_in_one_line(runs, target, case):
    path, why = runs[target]["cases"][case]
    tried = runs[target]["tried"][case]
    assert tried["code"] == 2, tried["output"]
    line = one_error_line(tried["output"])
    assert line.startswith(f"error: --resume {path}: no usable checkpoint: {step_dir(target, path, 4)}: "), line
    assert why in line, line


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_steps_at_or_below_the_checkpoint_are_refused(runs, target):
    """A real process (exit code 2, nothing else printed), after the checkpoint was verified and restored."""
    got = runs[target]["below"]
    base = runs[target]["base"]
    assert one_error_line(got.output) == (f"error: --resume {base}: the checkpoint is at step 4, --steps 2 asks for "
                                          "nothing more: pass --steps above 4 (or --export-params FILE to write its "
                                          "parameters)")
    assert not got.metrics
    # with nothing to train, a resumed run still exports what it restored: the parameters of step 4
    exported, full = runs[target]["export_only"], runs[target]["full"]
    assert not exported.metrics and sorted(exported.params) == sorted(full.params)
    assert max(float(abs(exported.params[n] - full.params[n]).max()) for n in full.params) == 0.0


# train.py's cli with the checkpoint writer (torch: DCP's save, mlx: mx.save_safetensors) failing at the
# second save once it has written its files, as a disk that fills up does (ENOSPC)
FULL_DISK = r'''
import errno, sys
sys.path.insert(0, @TESTS@)
from program_import import load_program
target, program = sys.argv[1:3]
m = load_program(program)
if target == "torch":
    import torch.distributed.checkpoint as writer
    name = "save"
else:
    import mlx.core as writer
    name = "save_safetensors"
real, saves = getattr(writer, name), []
def write(*args, **kwargs):
    saves.append(real(*args, **kwargs))
    if len(saves) == 2:
        raise OSError(errno.ENOSPC, "No space left on device")
setattr(writer, name, write)
m.cli(sys.argv[3:])
'''.replace("@TESTS@", repr(str(Path(__file__).resolve().parent)))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["torch", "mlx"])
def test_a_save_the_disk_cannot_take_stops_in_one_line(tmp_path, target):
    """A save that the storage fails (here: ENOSPC at the step-4 save): one line naming the step, the
    directory and the error, exit 2; its partial directory removed, step 2's checkpoint kept. (Before: a
    traceback, exit 1.) Partial directories a killed run's saves left behind are removed at the next save."""
    import subprocess

    stale = tmp_path / "ck" / ".tmp_step_00000099"
    stale.mkdir(parents=True)
    (stale / "__0_0.distcp").write_bytes(b"half")
    env = tr.env_for() if target == "torch" else jr.env_for()
    cmd = [jr.PY, "-c", FULL_DISK, target, str(build(target)), "--steps", "6", "--checkpoint-dir", "ck",
           "--checkpoint-every", "2"]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    line = one_error_line(p.stderr)
    assert line.startswith("error: checkpoint: step 4 could not be saved in ck (OSError: [Errno 28] No space left on "
                           "device; "), line
    assert line.endswith("the checkpoints saved before it are kept: continue from them with --resume auto once there "
                         "is room"), line
    assert sorted(os.listdir(tmp_path / "ck")) == ["step_00000002"]
