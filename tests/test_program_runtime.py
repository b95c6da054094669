"""The runtime/ package every build carries (templates/runtime/): the same files byte for byte in every build
and target (and runtime/<target>/ in every build of its target), no template in them, nothing in them that no
program uses, and what they do (manifests, refusals) checked directly. (What they import: tests/test_render.py,
the standard library and numpy, and a target's own also its framework.)"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys

import pytest
from render_cases import ROOT

from mithril_spec.frontend import compile_file
from mithril_spec.lowering.predicted import digest as digest_of
from mithril_spec.render.build import render_files
from mithril_spec.targets import TARGETS
from mithril_spec.template_files import runtime_files, template_dirs

BUILDS = [("gpt-tiny.yaml", "torch"), ("gpt-tiny.yaml", "jax"), ("mlp-dp.yaml", "mlx"), ("gpt-pipe.yaml", "torch"),
          ("gpt-pipe.yaml", "jax"), ("moe-dp.yaml", "torch"), ("cnn-dp.yaml", "mlx"),
          ("examples/gpt-docs/gpt-docs.yaml", "torch")]  # (the one example that reads a token file)


@pytest.fixture(scope="module")
def builds() -> dict[tuple[str, str], dict[str, str]]:
    def path(spec):
        return ROOT / spec if "/" in spec else ROOT / "specs" / spec

    return {(spec, target): render_files(compile_file(path(spec)), target, spec.rpartition("/")[2])
            for spec, target in BUILDS}


def test_every_build_carries_the_same_runtime(builds):
    """runtime/*.py: the same in every build and target; runtime/<target>/: the same in every build of that
    target, and only there."""
    common = runtime_files()
    assert {"runtime/__init__.py", "runtime/errors.py", "runtime/checkpoints.py", "runtime/console.py"} <= set(common)
    for (spec, target), files in builds.items():
        want = runtime_files(target)
        assert common.items() <= want.items()
        assert all(n.count("/") == 1 or n.startswith(f"runtime/{target}/") for n in want), (target, sorted(want))
        assert {n: t for n, t in files.items() if n.startswith("runtime/")} == want, (spec, target)
    for target in TARGETS:
        for name, text in runtime_files(target).items():
            assert "{{" not in text and "{%" not in text and "{#" not in text, f"{name} holds template syntax"


def test_nothing_in_runtime_goes_unused(builds):
    """Every function and class of runtime/ is imported by some example's program or used by another runtime
    module (a helper nothing calls does not ship)."""
    programs = "\n".join(t for files in builds.values() for n, t in files.items() if not n.startswith("runtime/"))
    runtime = {n: t for target in TARGETS for n, t in runtime_files(target).items()}
    for name, text in runtime.items():
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                others = "\n".join(t for n, t in runtime.items() if n != name)
                used_inside = text.count(node.name) > 1 or node.name in others
                assert node.name in programs or used_inside, f"{name}: {node.name} is used by no program"


@pytest.fixture()
def runtime(monkeypatch):
    """The runtime package, imported from the templates as a build imports it."""
    base = next(d for d in template_dirs() if (d / "runtime").is_dir())
    monkeypatch.syspath_prepend(str(base))
    for name in [n for n in sys.modules if n == "runtime" or n.startswith("runtime.")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("runtime.checkpoints"), importlib.import_module("runtime.errors")


def test_a_manifest_verifies_its_checkpoint_and_names_what_is_wrong(runtime, tmp_path):
    checkpoints, _ = runtime
    m = checkpoints.Manifests("manifest.json", "gpt", "h1", "m1", {"lr": 0.1}, {"data": 2})
    ckpt = tmp_path / "step_00000004"
    (ckpt / "shards").mkdir(parents=True)
    (ckpt / "shards" / "0.bin").write_bytes(b"0123456789")
    arrays = {"params/w": ((4, 2), "float32")}
    m.write(str(ckpt), 4, arrays, stack_order="x")
    saved = json.loads((ckpt / "manifest.json").read_text())
    assert saved["files"]["shards/0.bin"]["bytes"] == 10 and saved["stack_order"] == "x" and saved["mesh"] == {"data": 2}
    assert m.verify(str(ckpt), 4, arrays) is None
    assert "disagree" in m.verify(str(ckpt), 5, arrays)
    assert "train state differs" in m.verify(str(ckpt), 4, {"params/w": ((4, 3), "float32")})
    other = checkpoints.Manifests("manifest.json", "bert", "h1", "m1", {"lr": 0.1}, {})
    assert "checkpoint of the spec 'gpt', not of 'bert'" in other.verify(str(ckpt), 4, arrays)
    changed = checkpoints.Manifests("manifest.json", "gpt", "h2", "m1", {"lr": 0.2}, {})
    assert changed.verify(str(ckpt), 4, arrays) is None  # only the optimizer settings differ
    assert changed.settings_note(str(ckpt)).startswith("note: lr 0.1 -> 0.2")
    (ckpt / "shards" / "0.bin").write_bytes(b"0123456780")
    assert m.verify(str(ckpt), 4, arrays) == "shards/0.bin: checksum mismatch (the file is corrupt)"
    (ckpt / "shards" / "0.bin").write_bytes(b"01234")
    assert "truncated" in m.verify(str(ckpt), 4, arrays)
    (ckpt / "manifest.json").unlink()
    assert "incomplete checkpoint" in m.verify(str(ckpt), 4, arrays)
    assert checkpoints.checkpoint_dirs(str(tmp_path), lambda n: int(n[5:]) if n.startswith("step_") else None) == {
        4: str(ckpt)}


def test_a_refusal_carries_its_line_and_whose_it_is(runtime):
    _, errors = runtime
    errors.require(True, "never")
    with pytest.raises(errors.Refusal) as e:
        errors.require(False, "--data x: no such file", local=True)
    assert str(e.value) == "--data x: no such file" and e.value.local
    assert not issubclass(errors.Refusal, SystemExit)  # the program's entry point decides how to exit


def test_profile_reads_the_predictions_of_its_own_plan_json(runtime, builds, tmp_path):
    """runtime/profile.py `plan_predictions`: plan.json's "predicted" beside the program, when its digest is
    the one the build embedded (PREDICTED_DIGEST, lowering/predicted.py `digest`); else a Refusal."""
    _, errors = runtime
    profile = importlib.import_module("runtime.profile")
    for key in (("gpt-tiny.yaml", "torch"), ("gpt-pipe.yaml", "jax")):
        files = builds[key]
        (tmp_path / "plan.json").write_text(files["plan.json"])
        digest = next(line.split('"')[1] for line in files["train.py"].splitlines()
                      if line.startswith("PREDICTED_DIGEST = "))
        want = json.loads(files["plan.json"])["predicted"]
        assert profile.plan_predictions(str(tmp_path / "train.py"), digest) == want
        assert profile.predictions_digest(want) == digest == digest_of(want)
    with pytest.raises(errors.Refusal, match="is not this program's plan .* it is the plan of spec 'gpt-pipe' for "
                                             "target jax on mesh"):
        profile.plan_predictions(str(tmp_path / "train.py"), digest_of(json.loads(builds[
            ("gpt-tiny.yaml", "jax")]["plan.json"])["predicted"]))
    (tmp_path / "plan.json").write_text("{")
    with pytest.raises(errors.Refusal, match="plan.json cannot be read"):
        profile.plan_predictions(str(tmp_path / "train.py"), digest)
    (tmp_path / "plan.json").unlink()
    with pytest.raises(errors.Refusal, match="--profile: no .*plan.json: the build writes it beside train.py"):
        profile.plan_predictions(str(tmp_path / "train.py"), digest)
    mlx = json.loads(builds[("mlp-dp.yaml", "mlx")]["plan.json"])
    assert mlx["predicted"] is None and "PREDICTED_DIGEST" not in builds[("mlp-dp.yaml", "mlx")]["train.py"]


def test_collectives_are_summed_per_kind_and_step(runtime):
    profile = importlib.import_module("runtime.profile")
    events = [("nccl:all_reduce", 0.5, 2), ("ncclDevKernel_AllGather_RING", 0.25, 1), ("gemm", 9.0, 4),
              ("all-reduce.3", 0.5, 2)]
    assert profile.collective_totals(events, 2) == ({"all-reduce": 0.5, "all-gather": 0.125},
                                                    {"all-reduce": 2.0, "all-gather": 0.5})


def test_a_signal_while_the_interpreter_shuts_down_keeps_the_preempted_exit_code(tmp_path):
    """A launcher passes on the SIGTERM that its process group got too: the second one can reach train.py after
    it saved and chose exit 3, while Python tears its modules down with the default (killing) handlers back."""
    base = next(d for d in template_dirs() if (d / "runtime").is_dir())
    script = tmp_path / "late_signal.py"
    script.write_text(
        "import os, signal, sys, time\n"
        f"sys.path.insert(0, {str(base)!r})\n"
        "from runtime.preemption import PREEMPTED, Preemption\n"
        "preempt = Preemption()\n"
        "os.kill(os.getpid(), signal.SIGTERM)  # the first signal: handled, the run stops saved\n"
        "assert preempt.stop()\n"
        "class LateSignal:  # torn down with the modules, after Python put its own handlers away\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.2)\n"
        "late = LateSignal()\n"
        "sys.exit(PREEMPTED)\n")
    done = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
