"""--profile DIR (docs/program.md "Profiling"): torch.profiler over the steps of --profile-steps, a Chrome
trace per rank; the window, its time and the summary (measured next to planned) are runtime/profile.py's."""

import os

import torch

from runtime.console import process_peak_rss
from runtime.profile import ProfileWindow, collective_totals
from runtime.torch.ranks import all_ranks


class StepProfiler:
    """--profile DIR: torch.profiler traces the steps of --profile-steps on every rank (CPU, and the GPU's
    kernels on CUDA) into DIR/trace-rank<R>.json (chrome://tracing, Perfetto); then every rank writes its
    summary to DIR/summary-rank<R>.json, and rank 0 prints its own and writes it to DIR/summary.json. A
    collective's time is its operation's (gloo, on the CPU) or its NCCL kernels' (CUDA)."""

    def __init__(self, args, device, start):
        self.window = ProfileWindow(args, start)
        self.device, self.cuda = device, device.type == "cuda"

    def begin(self, step):
        """Before step `step` (counted from 0): the trace starts at the window's first step."""
        if not self.window.begins(step):
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.start()
        self.window.started()

    def end(self, step):
        """After step `step` is done (its loss read): at the window's last step the trace stops, is written,
        and summarised."""
        if not self.window.ends(step):
            return
        if self.cuda:
            torch.cuda.synchronize(self.device)
        step_s = self.window.stopped()
        self.prof.stop()
        rank = int(os.environ.get("RANK", "0"))
        self.prof.export_chrome_trace(self.window.path(f"trace-rank{rank}.json"))
        if self.cuda:  # the NCCL kernels, on the GPU's clock
            events = [
                (e.key, e.self_device_time_total / 1e6, e.count)
                for e in self.prof.key_averages()
                if e.device_type == torch.autograd.DeviceType.CUDA and e.key.startswith("nccl")
            ]
        else:  # gloo's operations (the work, on its threads)
            events = [
                (e.key, e.cpu_time_total / 1e6, e.count)
                for e in self.prof.key_averages()
                if e.key.startswith("gloo:")
            ]
        comm, calls = collective_totals(events, self.window.steps)
        peaks = all_ranks(
            torch.cuda.max_memory_allocated(self.device) if self.cuda else process_peak_rss()
        )
        name = torch.cuda.get_device_name(self.device) if self.cuda else "cpu"
        # every rank writes its own summary (a pipeline's stages differ); rank 0 prints its own
        self.window.report(name, step_s, comm, calls, peaks, rank=rank)
