"""A generated program refuses bad input like the compiler does: one line on stderr, exit code 2, before
any training step where it can (docs/program.md "Errors"); through the generated launchers too.

- Shared code (templates/common: the command line, data from disk, --init-params): every case runs in one
  Python process that imports the MLX program (the quickest to import) and calls `main(parse_args(argv))`
  once per case, capturing its stdout, stderr and exit code; a traceback fails the case.
- Launchers, per target, as real processes: launch.sh of torch (torchrun), JAX (--nproc) and MLX
  (mlx.launch), and torch's launch.sbatch (srun and scontrol played by shims) propagate exit 2 with the
  program's one line, and nothing else on stderr (no torchrun traceback, no mlx.launch report).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import stat
import subprocess
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import numpy as np
import pytest
import torch_runs as tr
from safetensors.numpy import save_file

from mithril_spec.frontend import compile_file

MLP = jr.SPECS / "mlp-dp.yaml"
WORK = jr.WORK / "runtime-errors"
ROWS = 64  # one batch of mlp-dp
BAD = 37  # the sample whose label is out of range: in the second half of the batch (rank / process 1's rows)


def arrays_edit(path: Path) -> tuple[tuple[str, str], ...]:
    return (("data: {kind: synthetic}", f"data: {{kind: arrays, path: {path}}}"),)


def write_data() -> Path:
    """Data directories for mlp-dp (x: [N, 64] float32, y: [N] labels in [0, 10)): `good` and one per way
    of being wrong."""
    root = WORK / "data"
    if root.is_dir():
        return root
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((ROWS, 64)).astype(np.float32), rng.integers(0, 10, ROWS)
    bad_label = y.copy()
    bad_label[BAD] = 12
    cases = {
        "good": {"x": x, "y": y},
        "missing": {"x": x},
        "empty": {"x": x, "y": b""},  # a 0-byte file
        "no-rows": {"x": x[:0], "y": y[:0]},
        "rows-differ": {"x": x, "y": y[:50]},
        "float-labels": {"x": x, "y": y.astype(np.float64)},
        "label-range": {"x": x, "y": bad_label},
    }
    for name, arrays in cases.items():
        (root / name).mkdir(parents=True)
        for k, a in arrays.items():
            if isinstance(a, bytes):
                (root / name / f"{k}.npy").write_bytes(a)
            else:
                np.save(root / name / f"{k}.npy", a)
    return root


def write_params() -> Path:
    """Parameter files for mlp-dp: right names and shapes (zeros) but one thing wrong each."""
    root = WORK / "params"
    if root.is_dir():
        return root
    root.mkdir(parents=True)
    good = {p.name: np.zeros(p.param.shape, np.float32) for p in compile_file(MLP, "data=1").plan.params}

    def variant(**change):
        out = {k: v for k, v in good.items() if change.get(k, v) is not None}
        out.update({k: v for k, v in change.items() if v is not None and not k.startswith("_")})
        return out

    nan = good["fc2.bias"].copy()
    nan[3] = np.nan
    np.savez(root / "int.npz", **variant(**{"fc1.weight": good["fc1.weight"].astype(np.int64)}))
    np.savez(root / "nan.npz", **variant(**{"fc2.bias": nan}))
    np.savez(root / "missing.npz", **variant(**{"head.weight": None}))
    np.savez(root / "shape.npz", **variant(**{"head.bias": np.zeros(7, np.float32)}))
    np.savez(root / "unknown.npz", **variant(**{"extra.weight": np.zeros(3, np.float32)}))
    save_file(variant(**{"fc2.bias": np.where(np.arange(256) == 3, np.inf, 0).astype(np.float32)}),
              str(root / "inf.safetensors"))
    (root / "garbage.npz").write_text("not an archive")
    return root


# The cases of the shared code: (name, train.py arguments, what its one line says)
def shared_cases(data: Path, params: Path, tmp: Path) -> list[tuple[str, list[str], str]]:
    (tmp / "a-file").write_text("")
    d = lambda name: ["--data", str(data / name)]
    p = lambda name: ["--data", str(data / "good"), "--init-params", str(params / name)]
    return [
        ("data: missing .npy", d("missing"), f"--data: no {data / 'missing' / 'y.npy'} (one .npy per input"),
        ("data: 0-byte .npy", d("empty"), f"--data: {data / 'empty' / 'y.npy'} is not a readable .npy array"),
        ("data: no rows", d("no-rows"), f"--data: {data / 'no-rows' / 'x.npy'} holds no samples (shape [0, 64])"),
        ("data: row counts differ", d("rows-differ"),
         "the arrays hold different numbers of samples (x.npy 64, y.npy 50)"),
        ("data: float labels", d("float-labels"), "y.npy holds float64 values, expected integers (int32)"),
        ("data: label out of range", d("label-range"),
         f"y.npy row {BAD} (sample {BAD}) holds 12, outside [0, 10)"),
        ("data: not a directory", ["--data", str(tmp / "a-file")], "is not a directory of .npy files"),
        ("init: no such file", p("nope.npz"), "nope.npz: no such file"),
        ("init: integer arrays", p("int.npz"), "fc1.weight of dtype int64 (expected floating point: float16, bfloat16, float32 or float64)"),
        ("init: NaN", p("nan.npz"), "non-finite values (NaN or inf) in fc2.bias"),
        ("init: inf (.safetensors)", p("inf.safetensors"), "`fc2.bias` holds non-finite values (NaN or inf)"),
        ("init: missing name", p("missing.npz"), "not this model's parameters: head.weight (missing)"),
        ("init: wrong shape", p("shape.npz"), "head.bias of shape [7] (expected [10])"),
        ("init: unknown name", p("unknown.npz"), "extra.weight (unknown)"),
        ("init: not a parameter file", p("garbage.npz"), "garbage.npz: cannot read it as a .npz archive"),
        ("--metrics in a missing directory", [*d("good"), "--metrics", str(tmp / "no" / "m.jsonl")],
         f"cannot write there ({tmp / 'no'} is not a writable directory)"),
        ("--checkpoint-dir is a file", [*d("good"), "--checkpoint-dir", str(tmp / "a-file")],
         "--checkpoint-dir " + str(tmp / "a-file") + ": is a file, not a directory"),
        # (before: trained, then a traceback at the first save)
        ("--checkpoint-dir under a file", [*d("good"), "--checkpoint-dir", str(tmp / "a-file" / "ck")],
         f"--checkpoint-dir {tmp / 'a-file' / 'ck'}: cannot write there ({tmp / 'a-file'} is a file)"),
        ("--export-params is a directory", [*d("good"), "--export-params", str(tmp)], ": is a directory, not a file"),
        ("--steps -1", [*d("good"), "--steps", "-1"], "--steps must be >= 0"),
        ("unknown flag", [*d("good"), "--stpes", "3"], "unrecognized arguments: --stpes 3"),
    ]


# Imports each program once, then runs main(parse_args(argv)) per case in this process.
DRIVER = r"""
import contextlib, importlib.util, io, json, os, sys, traceback, warnings
sys.path.insert(0, @TESTS@)
from program_import import load_program
warnings.simplefilter("always")
jobs, results = json.loads(sys.argv[1]), []
modules = {}
for program, name, argv in jobs:
    if program not in modules:
        modules[program] = load_program(os.path.dirname(program))
    mod, out, err, code = modules[program], io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            mod.cli(argv)
        except SystemExit as e:
            code = e.code
        except BaseException:
            traceback.print_exc()
            code = "traceback"
    results.append({"name": name, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""
DRIVER = DRIVER.replace("@TESTS@", repr(str(Path(__file__).resolve().parent)))  # tests/program_import.py


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, f"not one line:\n{stderr[-3000:]}"
    return lines[0]


def run_process(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_shared_code_refuses_bad_input_in_one_line(tmp_path):
    data, params = write_data(), write_params()
    program = mr.build(MLP, "data=1", arrays_edit(data / "good")) / "train.py"
    # a spec file whose name argparse would take for a format (%(prog)s, then a lone %)
    odd = tmp_path / "m%(prog)s%.yaml"
    odd.write_text(MLP.read_text())
    odd_program = mr.build(odd, "data=1") / "train.py"
    cases = shared_cases(data, params, tmp_path)
    base = ["--steps", "1", "--checkpoint-dir", ""]
    jobs = [(str(program), name, [*base, *argv]) for name, argv, _ in cases]
    jobs += [(str(program), "good data trains", [*base, "--data", str(data / "good")]),
             (str(odd_program), "--help, spec file named with %", ["--help"])]
    p = run_process([jr.PY, "-c", DRIVER, json.dumps(jobs)], tmp_path, jr.env_for())
    assert p.returncode == 0, p.stderr[-3000:]
    results = {r["name"]: r for r in json.loads(p.stdout.splitlines()[-1])}
    for name, _, says in cases:
        r = results[name]
        assert r["code"] == 2, f"{name}: exit {r['code']}\n{r['stderr'][-3000:]}"
        line = one_line(r["stderr"])
        assert line.startswith("error: ") and says in line, f"{name}: {line}"
    assert "memory " not in results["data: missing .npy"]["stdout"]  # refused before any work
    assert results["good data trains"]["code"] == 0 and "step 1/" in results["good data trains"]["stdout"]
    assert results["--help, spec file named with %"]["code"] == 0
    help_text = "".join(results["--help, spec file named with %"]["stdout"].split())  # (wrapped lines)
    assert f"generatedbymithril-specfrom{odd.name})." in help_text
    jr.report("runtime errors: shared code", cases=len(cases),
              lines={name: one_line(results[name]["stderr"]) for name, _, _ in cases[:3]})


def shim(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.slow
def test_launchers_propagate_exit_2_with_one_line(tmp_path):
    """Process 1 reads the sample whose label is out of range, but every process checks the step's whole
    batch: all refuse together, process 0 says why, the launcher exits 2 and adds nothing."""
    data = write_data()
    bad = ["--steps", "1", "--checkpoint-dir", "", "--data", str(data / "label-range")]
    says = f"y.npy row {BAD} (sample {BAD}) holds 12, outside [0, 10)"
    torch_prog = tr.build(MLP, "data=2", arrays_edit(data / "good"))
    jax_prog = jr.build(MLP, "data=2", arrays_edit(data / "good"))
    mlx_prog = mr.build(MLP, "data=2", arrays_edit(data / "good"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim(bin_dir, "srun", 'while [[ $1 == -* ]]; do shift; done; exec "$@"')  # one node: srun runs the command once
    shim(bin_dir, "scontrol", "echo localhost")
    jax_env = jr.env_for({"PYTHON": jr.PY})
    commands = {
        "torch launch.sh": ([str(torch_prog / "launch.sh"), *bad], tr.env_for()),
        "jax launch.sh --nproc 2": (["bash", str(jax_prog / "launch.sh"), "--nproc", "2", *bad], jax_env),
        "mlx launch.sh": (["bash", str(mlx_prog / "launch.sh"), *bad], jax_env),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # torch's (the longest) beside the two others
        done = {name: pool.submit(run_process, cmd, tmp_path, env) for name, (cmd, env) in commands.items()}
        runs = {name: f.result() for name, f in done.items()}
    for name, p in runs.items():
        assert p.returncode == 2, f"{name}: exit {p.returncode}\n{p.stderr[-3000:]}"
        line = one_line(p.stderr)
        assert line.startswith("error: --data: ") and says in line, f"{name}: {line}"
        assert "step " not in p.stdout, name  # before the first step

    # launcher-level refusals, before any Python starts
    jax3 = run_process(["bash", str(jax_prog / "launch.sh"), "--nproc", "3", "--steps", "1"], tmp_path, jax_env)
    assert jax3.returncode == 2 and "--nproc must divide the 2 devices" in one_line(jax3.stderr)
    env = tr.env_for({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NUM_NODES": "3",
                      "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "1", "SLURM_SUBMIT_DIR": str(torch_prog)})
    sbatch = run_process(["bash", str(torch_prog / "launch.sbatch"), "--steps", "1"], tmp_path, env)
    assert sbatch.returncode == 2, sbatch.stderr
    assert "NNODES=3 must be a positive divisor of the 2 ranks" in one_line(sbatch.stderr)
    jr.report("runtime errors: launchers", **{name: one_line(p.stderr) for name, p in runs.items()})


@pytest.mark.slow
def test_torch_launcher_reports_another_failure_in_one_line(tmp_path):
    """A rank that fails otherwise (here: killed) gives its exit code and one line naming it, not torchrun's
    ChildFailedError report."""
    prog = tr.build(MLP, "data=2")
    script = tmp_path / "crash.py"
    script.write_text("import os, signal\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    # launch.sh runs $here/train.py: a copy of the program directory whose train.py dies on rank 1
    copy = tmp_path / "prog"
    copy.mkdir()
    (copy / "launch.sh").write_text((prog / "launch.sh").read_text())
    (copy / "train.py").write_text(script.read_text())
    p = run_process(["bash", str(copy / "launch.sh")], tmp_path, tr.env_for())
    assert p.returncode == 128 + 9, p.stderr
    assert one_line(p.stderr) == "launch.sh: rank 1 failed with exit code -9"
