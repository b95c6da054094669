"""SIGTERM or SIGUSR1 (how SLURM ends a job at its time limit or preempts it) asks a run to stop after the
step it is in, saved (docs/program.md "Signals, preemption and restarts")."""

import atexit
import signal

# The exit code of a run that a signal stopped once its checkpoint was saved (docs/program.md "Errors").
PREEMPTED = 3


def ignore_signals():
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, signal.SIG_IGN)


class Preemption:
    """SIGTERM or SIGUSR1 asks the run to stop: the current step finishes, every process agrees to stop after
    the same step (`stop`), the program saves its checkpoint and exits PREEMPTED (`exit`). A second signal
    changes nothing, also while the interpreter shuts down (a launcher passes on the signal that the process
    group got too, and it can arrive that late)."""

    def __init__(self):
        self.signal = None
        for s in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(s, self.ask)
        # Python puts back the default handlers (which kill) before it tears its modules down: from the exit on
        # the signals are ignored, or a late one would turn the exit code PREEMPTED into a death by it (143)
        atexit.register(ignore_signals)

    def ask(self, signum, frame):
        self.signal = self.signal or signal.Signals(signum).name

    def stop(self, combine=None, last=False):
        """Whether to stop after this step: asked on any process (`combine(flag)`: the processes' flags
        combined, the same verdict on every one; a single process alone only looks at its own). After the
        run's `last` step there is nothing left to stop: the run ends as done (its last save, exit 0), not as
        preempted (exit 3, whose continuation, `--resume auto` to the same --steps, would have no step to run)."""
        asked = self.signal is not None
        return (combine(asked) if combine else asked) and not last

    def exit(self, step, saved, say):
        """After stopping at `step`: one line, and the exit code (PREEMPTED once the checkpoint `saved` is
        written; without a checkpoint directory, 128 + the signal's number, as if it had killed the run)."""
        signum = self.signal and getattr(signal, self.signal, signal.SIGTERM)
        say(
            f"stopped by {self.signal or 'a signal on another process'} after step {step}: "
            + (
                f"checkpoint saved in {saved}; continue with --resume auto"
                if saved
                else "no checkpoint directory (--checkpoint-dir), nothing saved"
            )
        )
        return PREEMPTED if saved else 128 + int(signum or signal.SIGTERM)
