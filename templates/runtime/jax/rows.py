"""The metrics row of a JAX program's step, whose figures train.py reads one iteration late (once the next
step is queued behind it)."""

import time


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
