"""How a program refuses what it was asked (docs/program.md "Errors"): `require(ok, message)` raises
Refusal, which the program's entry point (train.py's `__main__`, generate.py's) turns into one line,
`error: MESSAGE`, said by the first process, and exit code 2 on every process."""


class Refusal(Exception):
    """What was asked cannot run. `local`: a verdict about this process's own data (its samples), said by
    the process that reaches it; otherwise every process reaches the same verdict and the first one says it."""

    def __init__(self, message, local=False):
        super().__init__(message)
        self.local = local


def require(ok, message, local=False):
    """Unless `ok`, refuse with `message` (one line saying what to do instead)."""
    if not ok:
        raise Refusal(message, local)
