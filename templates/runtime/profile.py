"""--profile for the torch and jax programs (docs/program.md "Profiling"): the steps profiled and their time,
the plan's predictions (plan.json's "predicted", read from the plan.json beside the program), the collective
kind of a traced event's name and the sums per kind, and the table of measured next to planned, printed and
written to DIR/summary.json. Each program's profiler traces with its framework and reads its trace back;
this does the rest."""

import hashlib
import json
import os
import time

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


def collective_totals(events, per):
    """The seconds and calls of each collective kind over `events` ((name, seconds, calls) of a trace's
    events), divided by `per` (the steps profiled, times the devices where the trace holds several)."""
    comm, calls = {}, {}
    for name, seconds, count in events:
        kind = collective_kind(name)
        if kind:
            comm[kind] = comm.get(kind, 0.0) + seconds
            calls[kind] = calls.get(kind, 0) + count
    return {k: v / per for k, v in comm.items()}, {k: v / per for k, v in calls.items()}


def predictions_digest(predicted):
    """The first 16 hex digits of the sha256 of `predicted` as compact JSON with sorted keys (the build
    computes its program's PREDICTED_DIGEST so: mithril_spec/lowering/predicted.py `digest`)."""
    text = json.dumps(predicted, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def plan_predictions(program, digest):
    """What the plan predicts for the program whose file is `program` (train.py's `__file__`): "predicted" of
    the plan.json the build wrote beside it, when its figures have the program's `digest` (PREDICTED_DIGEST);
    else a Refusal saying which plan.json is missing or whose it is."""
    path = os.path.join(os.path.dirname(os.path.abspath(program)), "plan.json")
    again = "copy the build's plan.json there, or build the spec again (mithril-spec build)"
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except FileNotFoundError:
        plan = None
    except (OSError, ValueError) as e:
        plan = f"{type(e).__name__}: {e}"
    require(
        plan is not None,
        f"--profile: no {path}: the build writes it beside {os.path.basename(program)}, with the "
        f"predictions --profile prints next to what it measures; {again}",
    )
    require(not isinstance(plan, str), f"--profile: {path} cannot be read ({plan}); {again}")
    plan = plan if isinstance(plan, dict) else {}
    predicted = plan.get("predicted")
    if predicted is None or predictions_digest(predicted) != digest:
        costs, mesh = plan.get("costs"), plan.get("mesh")
        whose = (
            f"the plan of spec {plan.get('name')!r} for target {costs.get('target')} on mesh "
            f"{mesh.get('axes')}"
            if isinstance(costs, dict) and isinstance(mesh, dict)
            else "not a build's plan"
        )
        require(
            False,
            f"--profile: {path} is not this program's plan (its predictions differ from those "
            f"{os.path.basename(program)} was built with: it is {whose}); {again}",
        )
    return predicted


class ProfileWindow:
    """What every program's profiler (train.py's StepProfiler) shares: --profile DIR's steps (args.profile,
    args.profile_window) in a run that starts after step `start` (resumed; 0 otherwise), their time, and the
    summary next to the plan's predictions (args.predicted: plan_predictions'). The profiler starts and
    stops its framework's trace around `begins`/`started` and `ends`/`stopped`."""

    def __init__(self, args, start):
        self.dir, self.window, self.predicted = args.profile, args.profile_window, args.predicted
        self.tick = None
        require(
            not self.dir or self.window[0] > start,
            f"--profile-steps: the run starts after step {start} (resumed), and step "
            f"{self.window[0] if self.dir else 0} is done already",
        )

    def begins(self, step):
        """Whether the trace starts before step `step` (counted from 0): the window's first step."""
        return bool(self.dir) and step + 1 == self.window[0]

    def started(self):
        """The trace runs: the window's time counts from now."""
        self.tick = time.perf_counter()

    def ends(self, step):
        """Whether the trace stops after step `step`: the window's last step, the trace running."""
        return self.tick is not None and step + 1 == self.window[1]

    def stopped(self):
        """The window's steps are done (the device waited for): their seconds per step."""
        seconds, self.tick = time.perf_counter() - self.tick, None
        return seconds / self.steps

    @property
    def steps(self):
        return self.window[1] - self.window[0] + 1

    def path(self, name):
        """DIR/`name`, DIR created."""
        os.makedirs(self.dir, exist_ok=True)
        return os.path.join(self.dir, name)

    def report(self, device_name, step_s, comm_s, calls, peaks, rank=None):
        """report_profile with this window and the plan's predictions."""
        report_profile(
            self.dir, self.window, device_name, step_s, comm_s, calls, peaks, self.predicted, rank
        )


def planned_profile(device_name, predicted):
    """The hardware profile whose predictions (`predicted`: plan.json's) apply to a device named
    `device_name`, or None."""
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
    plan predicts on this device's hardware profile (`predicted`: plan.json's). With a `rank`
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
