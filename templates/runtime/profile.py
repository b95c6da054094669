"""--profile's summary for the torch and jax programs (docs/program.md "Profiling"): the steps profiled, the
collective kind of a traced event's name, the plan's figures for this device, and the table of measured next
to planned, printed and written to DIR/summary.json. Each program's profiler measures; this reports."""

import json
import os

from .errors import require

# the words a traced event's name holds (lower case, without `-` and `_`) for each collective kind
COLLECTIVE_WORDS = (
    ("all-reduce", ("allreduce",)),
    ("all-gather", ("allgather",)),
    ("reduce-scatter", ("reducescatter",)),
    ("all-to-all", ("alltoall",)),
    ("send/recv", ("collectivepermute", "sendrecv", "send", "recv")),
)


def collective_kind(name):
    """The collective kind (all-reduce, all-gather, reduce-scatter, all-to-all, send/recv) of a traced event
    named `name` (nccl and gloo operations, NCCL kernels, XLA's collective instructions), or None."""
    word = name.lower().replace("-", "").replace("_", "")
    for kind, words in COLLECTIVE_WORDS:
        if any(w in word for w in words):
            return kind
    return None


def profile_window(text, steps):
    """--profile-steps A:B: the first and the last step profiled (numbered from 1, as the console numbers
    them). Default: the second step (the first compiles and warms up) and the next, within the run."""
    if text is None:
        first = min(2, steps)
        return first, min(first + 1, steps)
    parts = text.split(":")
    ok = len(parts) == 2 and all(p.strip().isdigit() for p in parts)
    require(
        ok, f"--profile-steps {text}: expected A:B, the first and last step to profile (e.g. 2:4)"
    )
    first, last = int(parts[0]), int(parts[1])
    require(
        1 <= first <= last <= steps,
        f"--profile-steps {text}: needs 1 <= A <= B <= {steps} (the steps of "
        "this run, numbered from 1)",
    )
    return first, last


def planned_profile(device_name, predicted):
    """The hardware profile whose predictions (`predicted`: the program's predicted) apply to a device
    named `device_name`, or None."""
    for key, name in predicted["device_profiles"]:
        if key.lower() in (device_name or "").lower() and name in predicted["profiles"]:
            return name
    return None


def ms(seconds):
    return f"{seconds * 1e3:10.3f} ms"


def report_profile(
    directory, window, device_name, step_s, comm_s, calls, peaks, predicted, rank=None
):
    """Prints the summary of the profiled steps and writes it to `directory`/summary.json: measured seconds
    per step (`step_s`), per collective kind (`comm_s`, `calls`: per step and device), the rest of the step
    (compute, and whatever else the device did), and each device's peak bytes (`peaks`), next to what the
    plan predicts on this device's hardware profile (`predicted`: the program's PREDICTED). With a `rank`
    (torch: every rank calls it with its own measurement), it also writes `directory`/summary-rank<R>.json,
    and only rank 0 prints and writes summary.json."""
    name = planned_profile(device_name, predicted)
    plan = predicted["profiles"].get(name) if name else None
    kinds = sorted(set(predicted["comm_bytes"]) | set(comm_s))
    compute = max(0.0, step_s - sum(comm_s.values()))
    rows = [
        ("step", ms(step_s), ms(plan["step_s"]) if plan else "", ""),
        ("compute (rest of the step)", ms(compute), ms(plan["compute_s"]) if plan else "", ""),
    ]
    for k in kinds:
        planned_calls = predicted["comm_calls"].get(k, 0)
        rows.append(
            (
                k,
                ms(comm_s.get(k, 0.0)) + f" {calls.get(k, 0):6.1f} calls",
                (ms(plan["comm_s"].get(k, 0.0)) if plan else "") + f" {planned_calls:6d} calls",
                f"{predicted['comm_bytes'].get(k, 0):,} B planned",
            )
        )
    first, last = window
    summary = {
        "steps": [first, last],
        "device": device_name,
        "profile": name,
        "step_s": step_s,
        "compute_s": compute,
        "comm_s": comm_s,
        "comm_calls": calls,
        "peak_bytes": peaks,
        "planned": {
            "profile": plan,
            "comm_bytes": predicted["comm_bytes"],
            "comm_calls": predicted["comm_calls"],
            "peak_bytes": predicted["peak_bytes"],
        },
    }
    if rank is not None:
        with open(os.path.join(directory, f"summary-rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, **summary}, f, indent=1)
        if rank != 0:
            return
    print(
        f"profile of steps {first}..{last} (trace in {directory}), per step and device: measured | planned "
        f"({name or 'no hardware profile for ' + repr(device_name)})",
        flush=True,
    )
    for r in rows:
        print(f"  {r[0]:28s} {r[1]:>28s} | {r[2]:>28s} {r[3]}", flush=True)
    for d, peak in enumerate(peaks):
        print(
            f"  peak memory, device {d}: {peak:,} B measured | {predicted['peak_bytes']:,} B planned",
            flush=True,
        )
    with open(os.path.join(directory, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
