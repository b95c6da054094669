"""The training loop of a JAX program: the jitted step queued ahead of the host's logging, the next batch read
meanwhile, checkpoints at their steps, a preemption's stop, the command line's exit codes. The program
passes its step, its batches, its metrics row and its checkpoints."""

import sys
import time

import jax

from runtime.console import Metrics
from runtime.errors import Refusal
from runtime.jax.devices import any_process, refuse
from runtime.jax.profiler import StepProfiler
from runtime.preemption import Preemption


def run(args, setup_devices, make_mesh, train):
    """The program (`args` parsed): the devices (before anything touches one), the preemption signals
    (SIGTERM / SIGUSR1: stop after the current step, saved; set after jax.distributed.initialize, whose
    preemption notifier takes SIGTERM for itself), then train(args, mesh, preempt) under the mesh (the
    model's sharding constraints name its axes); exits with the code train returns."""
    setup_devices(args)
    preempt = Preemption()
    mesh = make_mesh()
    with jax.set_mesh(mesh):
        code = train(args, mesh, preempt)
    if jax.process_count() > 1:
        jax.distributed.shutdown()
    if code:
        sys.exit(code)


def command_line(main, parse_args, argv=None):
    """main(parse_args(argv)): what was asked that cannot run ends in one line and exit 2."""
    try:
        main(parse_args(argv))
    except Refusal as refusal:
        refuse(refusal)


def train_steps(
    args,
    state,
    step_fn,
    step_row,
    batch_of,
    checkpoints,
    manager,
    preempt,
    console,
    export_grads=None,
    evaluates=None,
    evaluate=None,
    eval_log=None,
):
    """The steps from the state's step to --steps of `step_fn` (state, batch) -> (state, figures[, gradients]) on the batches
    batch_of(step); step_row(done, figures, since) -> (the metrics row, when it was read). `manager`: the
    orbax manager of `checkpoints` (runtime/jax/checkpoints.py), None without a checkpoint directory;
    `export_grads(gradients)`: --export-grads, of the first step; `evaluates(done)`: whether the evaluation
    `evaluate(state)` -> its figures runs after step `done` (`eval_log`: its part of the line). Returns the
    state and None, or after a preemption the state and the exit code."""
    is_first, start = jax.process_index() == 0, int(state["step"])
    metrics = Metrics(args.metrics, is_first, append=bool(args.resume), start=start)
    batch = batch_of(start) if start < args.steps else None
    profiler = StepProfiler(args, start)  # --profile
    console.compiling()
    # A step's figures are read one iteration late, once the next step is queued behind it: the devices
    # never wait while the host logs. `since`: when the previous step's figures were read.
    queued, since = None, time.perf_counter()
    stop, every, saved = False, args.checkpoint_every, None
    for step in range(start, args.steps):
        profiler.begin(step, state)
        # returns at once; the devices work in the background
        state, m, *grads = step_fn(state, batch)
        if grads and step == start:  # --export-grads: the first step's (gathered by every process)
            export_grads(grads.pop())
        profiler.end(step, state)
        if step + 1 < args.steps:
            batch = batch_of(step + 1)  # meanwhile, read the next batch
        if queued:  # the previous step's figures: waits for that step only
            row, since = step_row(*queued, since)
            metrics.log(**row)
            console.step(row)
        done, queued = step + 1, (step + 1, m)
        # a signal on any process: every process stops after this step (with several processes, one number
        # gathered from each, per step)
        stop = preempt.stop(any_process)
        save = manager and (stop or done == args.steps or (every > 0 and done % every == 0))
        evals = evaluates(done) if evaluates else False
        # the last step, or its state is needed now (saved, evaluated): wait for it
        if done == args.steps or save or evals or stop:
            row, _ = step_row(*queued, since)
            val = evaluate(state) if evals else {}
            row.update(val)
            metrics.log(**row)
            console.step(row, eval_log(val) if eval_log else "")
            if save:  # (a preemption's save, and the last one, are synchronous)
                background = args.async_checkpoint and not stop and done < args.steps
                saved = checkpoints.save(manager, done, state, background)
            # the next step's time leaves the evaluation and the save out
            queued, since = None, time.perf_counter()
        if stop:
            break
    checkpoints.finish_saves()
    metrics.close()
    console.summary()
    if manager:
        manager.close()
    # preempted: exit once the checkpoint is saved
    return state, preempt.exit(done, manager and saved, console.say) if stop else None


def step_row(done, m, since, batch_size, tokens_per_sample=0, scaled=False):
    """The metrics row of step `done` from its figures `m` (device arrays), and the time they were read:
    reading them waits for that step (and only for it: the devices go on with the step queued behind it).
    Its step_time_s runs from `since`, when the previous step's figures were read: one whole iteration of
    the loop (the next batch, the logging, the wait), so samples_per_s (of `batch_size` samples) is the rate
    the run really trains at; tokens_per_s where a sample holds `tokens_per_sample` tokens. `scaled`: the
    loss scale this step's loss was multiplied by, and the steps skipped so far (this one included)."""
    m = {k: float(v) for k, v in m.items()}  # waits for the step
    now = time.perf_counter()
    dt = now - since
    row = {"step": done, "loss": m["loss"], "lr": m["lr"], "grad_norm": m["grad_norm"]}
    row.update(step_time_s=dt, samples_per_s=batch_size / dt)
    if scaled:
        row.update(loss_scale=m["loss_scale"], skipped_steps=int(m["skipped_steps"]))
    if tokens_per_sample:
        row["tokens_per_s"] = batch_size * tokens_per_sample / dt
    return row, now
