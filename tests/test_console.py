"""The console of the generated programs (docs/program.md "Command line"): the per-step line, the compile and
summary lines, --steps beyond the schedule's note, --tensorboard's scalars, --resume auto and the refusal of
a fresh run over later checkpoints. Few processes: one JAX program run three times, one torch run, one MLX run."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import jax_runs as jr
import mlx_runs as mr
import pytest
import torch_runs as tr

SPECS = Path(__file__).resolve().parent.parent / "specs"
SHORT = (("steps: 20", "steps: 2"),)  # the schedule ends at step 2: --steps 3 goes past it
STEP = re.compile(r"^step (\d+)/(\d+) \| loss \d+\.\d{4} \| lr \d\.\de[-+]\d\d \| grad norm \d+\.\d\d \| "
                  r"[\d,.]+ (tok|samples)/s \| (mfu [\d.]+% \| )?mem \d+\.\d\d GB \| eta \d+(s|m\d\ds|h\d\dm)$", re.MULTILINE)
SUMMARY = re.compile(r"^done: (\d+) steps in \S+ \| mean step [\d.]+ ms \| [\d,.]+ (tok|samples)/s \| "
                     r"final loss \d+\.\d{4}( \| val_\w+ [\d.]+)* \| peak mem \d+\.\d\d GB$", re.MULTILINE)


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} of the tensorboard event files in `directory` (TFRecord framing)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 16 + n
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


FAKE_WANDB = """
import json, os


def _record(*call):
    with open(os.environ["FAKE_WANDB_LOG"], "a") as f:
        f.write(json.dumps(call) + "\\n")


class _Run:
    def log(self, row, step):
        _record("log", row, step)

    def finish(self):
        _record("finish")


def init(**kw):
    _record("init", kw)
    return _Run()
"""


@pytest.mark.runs
def test_jax_console_tensorboard_and_resume_auto(tmp_path):
    program = jr.build(SPECS / "mlp-dp.yaml", "data=1", SHORT)
    ckpt, tb = tmp_path / "ckpt", tmp_path / "tb"
    ckpt.mkdir()  # empty: --resume auto starts fresh
    first = jr.run(program, "--steps", "3", "--checkpoint-dir", str(ckpt), "--resume", "auto",
                   "--tensorboard", str(tb))
    out = first.output
    assert f"--resume auto: no checkpoint in {ckpt}: starting fresh" in out
    assert ("note: --steps 3 goes past the schedule's 2 steps: steps 3-3 run at the schedule's final lr "
            f"({first.metrics[-1]['lr']:.1e})") in out
    assert out.index("compiling the train step...") < out.index("first step (compile included) took ") < \
        out.index("step 1/3 |")
    lines = STEP.findall(out)
    assert [(int(s), int(n), unit) for s, n, unit, *_ in lines] == [(i, 3, "samples") for i in (1, 2, 3)]
    assert "mfu" not in out  # on CPU the peak is unknown
    assert [int(m[0]) for m in SUMMARY.findall(out)] == [3]
    assert set(first.metrics[0]) >= {"step", "loss", "lr", "grad_norm", "step_time_s", "samples_per_s"}
    got = scalars(tb)
    assert {"loss", "lr", "grad_norm"} <= set(got)
    assert [s for s, _ in got["loss"]] == [1, 2, 3]
    assert got["loss"][-1][1] == pytest.approx(first.metrics[-1]["loss"], rel=1e-6)

    # --wandb through a stand-in module that records what the program hands it (the real one: below)
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "wandb.py").write_text(FAKE_WANDB)
    more = jr.run(program, "--steps", "4", "--checkpoint-dir", str(ckpt), "--resume", "auto", "--wandb", "proj",
                  env={"PYTHONPATH": str(fake), "FAKE_WANDB_LOG": str(tmp_path / "wandb.jsonl")})
    calls = [json.loads(line) for line in (tmp_path / "wandb.jsonl").read_text().splitlines()]
    # a resumed run continues the W&B run whose id its checkpoint directory keeps
    run_id = (ckpt / "wandb_run_id").read_text()
    assert calls[0] == ["init", {"project": "proj", "name": "mlp-dp", "config": {"spec": "mlp-dp", "mesh": {},
                                                                                 "steps": 2},  # (one device)
                                 "id": run_id, "resume": "allow"}]
    assert calls[1][0] == "log" and calls[1][2] == 4 and calls[1][1]["loss"] == pytest.approx(more.metrics[-1]["loss"])
    assert calls[2:] == [["finish"]]
    # what --resume auto found is said once checked and restored, and each save says where it went
    assert "--resume auto:" not in more.output
    assert f"resumed from {ckpt} at step 3" in more.output
    assert f"checkpoint: step 4 saved in {ckpt / '4'} (" in more.output
    assert [r["step"] for r in more.metrics] == [4] and "step 4/4 |" in more.output

    fresh = jr.run(program, "--steps", "2", "--checkpoint-dir", str(ckpt), expect_rc=2)
    assert (f"--checkpoint-dir {ckpt} already holds checkpoints of steps after 0 ([3, 4]): pass --resume auto "
            "to continue from them, or --checkpoint-dir DIR to save into another directory") in fresh.output


@pytest.mark.runs
def test_torch_and_mlx_console(tmp_path):
    # torch: the schedule of a 1-step spec, --steps 2 past it, --tensorboard and --resume auto (fresh, then on)
    program = tr.build(SPECS / "gpt-tiny.yaml", "data=1", (("steps: 20", "steps: 1"),))
    ckpt, tb = tmp_path / "ckpt", tmp_path / "tb"
    torch_run = tr.run(program, "--steps", "2", "--checkpoint-dir", str(ckpt), "--resume", "auto",
                       "--tensorboard", str(tb))
    assert f"--resume auto: no checkpoint in {ckpt}: starting fresh" in torch_run.output
    assert "note: --steps 2 goes past the schedule's 1 steps: steps 2-2 run at the schedule's final lr" in \
        torch_run.output
    assert [s for s, _ in scalars(tb)["loss"]] == [1, 2]
    more = tr.run(program, "--steps", "3", "--checkpoint-dir", str(ckpt), "--resume", "auto")
    assert f"resumed from {ckpt} at step 2" in more.output
    assert [r["step"] for r in more.metrics] == [3]
    # the real wandb, offline: the run is kept under WANDB_DIR
    mlx_run = mr.run(mr.build(SPECS / "mlp-dp.yaml", "data=1"), "--steps", "2", "--wandb", "proj",
                     env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path)})
    assert len([p for p in (tmp_path / "wandb").iterdir() if p.name.startswith("offline-run-")]) == 1
    for r, unit in ((torch_run, "tok"), (mlx_run, "samples")):
        assert [(int(s), int(n), u) for s, n, u, *_ in STEP.findall(r.output)] == [(1, 2, unit), (2, 2, unit)]
        assert [int(m[0]) for m in SUMMARY.findall(r.output)] == [2]
        assert "compiling the train step" not in r.output
