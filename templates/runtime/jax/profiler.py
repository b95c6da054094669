"""--profile in a JAX program (docs/program.md "Profiling"): jax.profiler traces the steps of --profile-steps
(a TensorBoard / Perfetto trace under DIR/plugins/profile), read back with jax.profiler.ProfileData; the
window, its time and the summary (measured next to planned) are runtime/profile.py's."""

import os
from pathlib import Path

import jax

from runtime.console import process_peak_rss
from runtime.profile import ProfileWindow, collective_totals


class StepProfiler:
    """--profile DIR: jax.profiler traces the steps of --profile-steps; then the first process reads its trace
    back and prints the summary. A collective's time is that of XLA's collective instructions: on a GPU or
    TPU their device events ("XLA Ops"), on the CPU backend the host threads running them."""

    def __init__(self, args, start):
        self.window = ProfileWindow(args, start)

    def begin(self, step, state):
        """Before step `step` (counted from 0) is queued: the trace starts at the window's first step, once
        the steps before it are done."""
        if self.window.begins(step):
            jax.block_until_ready(state)
            jax.profiler.start_trace(self.window.dir)
            self.window.started()

    def end(self, step, state):
        """After step `step` is queued: at the window's last step, waits for it, stops the trace and sums it up."""
        if not self.window.ends(step):
            return
        jax.block_until_ready(state)
        step_s = self.window.stopped()
        jax.profiler.stop_trace()
        devices = jax.local_devices()
        # per step and device
        comm, calls = collective_totals(
            collective_events(self.window.dir), self.window.steps * len(devices)
        )
        peaks = [
            (d.memory_stats() or {}).get("peak_bytes_in_use") or process_peak_rss() for d in devices
        ]
        if jax.process_index() == 0:
            self.window.report(devices[0].device_kind, step_s, comm, calls, peaks)


def collective_events(directory):
    """(name, seconds, 1) of each event of XLA's instructions in the newest trace under `directory`, over this
    process's devices (runtime/profile.py `collective_totals` keeps the collectives)."""
    traces = sorted(Path(directory).glob("plugins/profile/*/*.xplane.pb"), key=os.path.getmtime)
    trace = jax.profiler.ProfileData.from_file(str(traces[-1]))  # (kept: its planes read from it)
    planes = list(trace.planes)
    devices = [p for p in planes if p.name.startswith("/device:")]
    events = []
    for plane in devices or [p for p in planes if p.name.startswith("/host:CPU")]:
        for line in plane.lines:
            if devices and line.name != "XLA Ops":
                continue  # (the kernels' lines repeat the ops)
            events += [
                (e.name, e.duration_ns / 1e9, 1)
                for e in line.events
                if not e.name.startswith("end: ")
            ]
    return events
