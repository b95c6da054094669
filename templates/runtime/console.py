"""What a run prints and records (docs/program.md "Command line"): one console line per step, the compile
lines, the end-of-run summary, the metrics file (one JSON line per step), and the scalars of --tensorboard
and --wandb. The first process alone prints and writes."""

import json
import os
import sys
import time

from .errors import require

# Peak dense FLOP/s per device (bfloat16/float16, TensorFloat-32, float32) of the accelerators whose name the
# program can read (the planner's hardware table): MFU is printed only on these.
PEAK_FLOPS = {
    "H200": (989.4e12, 494.7e12, 66.9e12),
    "H100": (989.4e12, 494.7e12, 66.9e12),
    "A100": (312e12, 156e12, 19.5e12),
}
# The metrics that go to --tensorboard and --wandb (those a row holds)
SCALARS = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "samples_per_s",
    "val_loss",
    "val_accuracy",
    "loss_scale",
    "skipped_steps",
)


def peak_flops(device_name, compute):
    """The peak FLOP/s of one device named `device_name` computing in `compute` (float32, tfloat32 (float32
    matmuls in TensorFloat-32), bfloat16 or float16), or None when unknown."""
    for key, (half, tf32, full) in PEAK_FLOPS.items():
        if key in (device_name or "").upper():
            return {"float32": full, "tfloat32": tf32}.get(compute, half)
    return None


def process_peak_rss():
    """This process's peak resident memory in bytes."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def duration(s):
    s = int(round(s))
    return (
        f"{s // 3600}h{s % 3600 // 60:02d}m"
        if s >= 3600
        else f"{s // 60}m{s % 60:02d}s"
        if s >= 60
        else f"{s}s"
    )


def past_schedule(steps, schedule_steps, lr_at, decays):
    """The note of --steps past the spec's `schedule_steps` (the lr schedule's length), or None;
    `lr_at(t)`: the schedule's lr at 0-based step t, asked only for such a run (on an accelerator it is a
    computation of its own); `decays`: whether the schedule's decay goes on (noam) rather than holding its
    final lr."""
    if steps <= schedule_steps:
        return None
    lr_after = float(lr_at(schedule_steps))
    past = (
        f"note: --steps {steps} goes past the schedule's {schedule_steps} steps: steps "
        f"{schedule_steps + 1}-{steps}"
    )
    if decays:
        return f"{past} continue its decay ({lr_after:.1e} at step {schedule_steps + 1})"
    return f"{past} run at the schedule's final lr ({lr_after:.1e})"


def tensorboard_writer(directory, start=0):
    """--tensorboard DIR: a tensorboardX writer (an optional dependency: exit 2 when it is missing). A run
    resumed at step `start` purges the scalars of later steps that the run it continues wrote."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        require(False, "--tensorboard needs tensorboardX: pip install tensorboardX")
    return SummaryWriter(directory, purge_step=start + 1 if start else None)


def wandb_run(project, name, config, checkpoint_dir=None, start=0):
    """--wandb PROJECT: a Weights & Biases run `name` holding `config` (an optional dependency). With a
    checkpoint directory, the run's id is kept there (wandb_run_id), and a run resumed at step `start`
    continues that W&B run (resume="allow"; W&B ignores a step it already holds)."""
    import wandb

    resume = {}
    if checkpoint_dir:
        path = os.path.join(checkpoint_dir, "wandb_run_id")
        if not (start and os.path.isfile(path)):
            os.makedirs(checkpoint_dir, exist_ok=True)
            with open(path, "w") as f:
                f.write(os.urandom(8).hex())
        with open(path) as f:
            resume = {"id": f.read().strip(), "resume": "allow"}
    return wandb.init(project=project, name=name, config=config, **resume)


class Metrics:
    """JSON lines, one per optimizer step, written by the first process only."""

    def __init__(self, path, enabled, append=False, start=0):
        # A resumed run appends to the metrics of the run it continues (at step `start`), less the rows of
        # later steps (that run went on past its checkpoint before it stopped): the file is rewritten without
        # them, atomically. A fresh run starts the file anew.
        if path and enabled and append and os.path.isfile(path):
            with open(path) as f:
                rows = [line for line in f if line.endswith("\n") and kept_row(line, start)]
            with open(path + ".tmp", "w") as f:
                f.writelines(rows)
            os.replace(path + ".tmp", path)
        self.f = open(path, "a" if append else "w") if (path and enabled) else None  # noqa: SIM115 (open for the run)

    def log(self, **row):
        if self.f:
            self.f.write(json.dumps(row) + "\n")
            self.f.flush()

    def close(self):
        if self.f:
            self.f.close()


def kept_row(line, start):
    """Whether a metrics row of the run a resumed run continues at step `start` stays: one of step `start`
    or before (a line that is no JSON row, the last one of a killed run, does not)."""
    try:
        return json.loads(line)["step"] <= start
    except (ValueError, KeyError, TypeError):
        return False


class Console:
    """What the first process (`enabled`) prints while it trains, and writes to --tensorboard and --wandb.
    `run`: the spec's name, mesh and steps ({"spec", "mesh", "steps"}, what --wandb records); `batch_size`
    samples of `tokens_per_sample` tokens (0: not a sequence model) and `flops_per_step` FLOPs per step;
    `devices` devices of `peak` FLOP/s each (None: unknown, no MFU), `memory()` the peak bytes of a device so
    far; `skipped`: the steps the loss scaler skipped before `start` (rows with `skipped_steps`)."""

    def __init__(
        self,
        args,
        start,
        enabled,
        run,
        batch_size,
        tokens_per_sample,
        flops_per_step,
        devices=1,
        peak=None,
        memory=process_peak_rss,
        compiles=False,
        skipped=0,
    ):
        self.enabled, self.start, self.steps, self.skipped = enabled, start, args.steps, skipped
        self.batch_size, self.tokens_per_sample, self.flops_per_step = (
            batch_size,
            tokens_per_sample,
            flops_per_step,
        )
        self.devices, self.peak, self.memory, self.compiles = devices, peak, memory, compiles
        self.times, self.last, self.began = [], {}, time.perf_counter()
        self.writer = (
            tensorboard_writer(args.tensorboard, start) if enabled and args.tensorboard else None
        )
        self.wandb = (
            wandb_run(args.wandb, run["spec"], run, args.checkpoint_dir, start)
            if enabled and args.wandb
            else None
        )

    def say(self, line):
        if self.enabled and line:
            print(line, flush=True)

    def compiling(self):
        """Before the first step of a compiled train step."""
        if self.compiles and self.start < self.steps:
            self.say("compiling the train step...")

    def step(self, row, extra=""):
        """After each step: `row` is its metrics row; `extra` the rest of its line (the evaluation)."""
        self.times.append(row["step_time_s"])
        self.last = row
        if self.compiles and len(self.times) == 1:
            self.say(f"first step (compile included) took {row['step_time_s']:.1f} s")
        if self.writer:
            for key in SCALARS:
                if key in row:
                    self.writer.add_scalar(key, row[key], row["step"])
            self.writer.flush()
        if self.wandb:
            self.wandb.log({key: row[key] for key in SCALARS if key in row}, step=row["step"])
        if not self.enabled:
            return
        dt, done = row["step_time_s"], row["step"]
        rate = (
            f"{row['tokens_per_s']:,.0f} tok/s"
            if "tokens_per_s" in row
            else f"{row['samples_per_s']:,.1f} samples/s"
        )
        parts = [
            f"step {done}/{self.steps}",
            f"loss {row['loss']:.4f}",
            f"lr {row['lr']:.1e}",
            f"grad norm {row['grad_norm']:.2f}",
            rate,
        ]
        if self.peak:
            parts.append(f"mfu {100 * self.flops_per_step / dt / (self.devices * self.peak):.1f}%")
        parts.append(f"mem {self.memory() / 1e9:.2f} GB")
        timed = self.times[1:] or self.times  # the first step's time includes compiling
        parts.append(f"eta {duration(sum(timed) / len(timed) * (self.steps - done))}")
        if (
            row.get("skipped_steps", 0) > self.skipped
        ):  # the loss scaler skipped this step: nothing was updated
            parts.append(f"skipped: non-finite gradients at loss scale {row['loss_scale']:g}")
        self.skipped = row.get("skipped_steps", self.skipped)
        print(" | ".join(parts) + extra, flush=True)

    def summary(self):
        """The end-of-run line; closes the tensorboard writer."""
        if self.writer:
            self.writer.close()
        if self.wandb:
            self.wandb.finish()
        if not (self.enabled and self.times):
            return
        timed = self.times[1:] or self.times
        mean = sum(timed) / len(timed)
        rate = (
            f"{self.batch_size * self.tokens_per_sample / mean:,.0f} tok/s"
            if self.tokens_per_sample
            else f"{self.batch_size / mean:,.1f} samples/s"
        )
        parts = [
            f"done: {len(self.times)} steps in {duration(time.perf_counter() - self.began)}",
            f"mean step {mean * 1e3:.1f} ms",
            rate,
            f"final loss {self.last['loss']:.4f}",
        ]
        parts += [f"{k} {self.last[k]:.4f}" for k in ("val_loss", "val_accuracy") if k in self.last]
        parts.append(f"peak mem {self.memory() / 1e9:.2f} GB")
        print(" | ".join(parts), flush=True)
