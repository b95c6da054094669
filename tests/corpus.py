"""The broken-spec corpus (tests/specs/broken/): each file declares what it must produce in comment lines.

    # expect: CODE LINE:COL [FILE]   a diagnostic (FILE, relative to the spec's directory, defaults to the spec;
                                    `--set #N`: in the N-th `--set` argument)
    # expect-text: TEXT             text that must appear in some diagnostic's message or help
    # args: --devices 4             extra command-line arguments for `mithril-spec validate`

Every diagnostic the spec produces must be expected, and every expected one produced. The exit code is 1
when an error is expected (or `--strict` is given), 0 for warnings alone.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

BROKEN = Path(__file__).parent / "specs" / "broken"
# (FILE may be `--set #N`: the N-th `--set` argument, whose text a diagnostic about it points into)
_EXPECT = re.compile(r"^#\s*expect:\s*([EW]\d{3})\s+(\d+):(\d+)(?:\s+(--set #\d+|\S+))?\s*$")


@dataclasses.dataclass(frozen=True)
class Case:
    path: Path
    expect: tuple[tuple[str, str, int, int], ...]  # (code, file, line, col)
    texts: tuple[str, ...]
    args: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        if "--strict" in self.args or any(code.startswith("E") for code, *_ in self.expect):
            return 1
        return 0


    def source(self, file: str) -> str:
        """The text of an expected diagnostic's FILE: a file's, or a `--set #N` argument's."""
        if file.startswith("--set #"):
            settings = [b for a, b in zip(self.args, self.args[1:]) if a == "--set"]
            return settings[int(file.removeprefix("--set #")) - 1]
        return Path(file).read_text(encoding="utf-8", errors="replace")


def corpus_files() -> list[Path]:
    return sorted(p for p in BROKEN.iterdir() if p.suffix in (".yaml", ".yml", ".toml") and p.is_file())


def read_case(path: Path) -> Case:
    expect, texts, args = [], [], []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("#"):
            continue
        m = _EXPECT.match(line)
        if m:
            code, ln, col, file = m.groups()
            target = str(path) if file is None else file if file.startswith("--set #") else str(path.parent / file)
            expect.append((code, target, int(ln), int(col)))
        elif re.match(r"^#\s*expect-text:", line):
            texts.append(line.split(":", 1)[1].strip())
        elif re.match(r"^#\s*args:", line):
            args += shlex.split(line.split(":", 1)[1])
        elif re.match(r"^#\s*expect", line):
            raise ValueError(f"{path}: unreadable expectation line {line!r}")
    return Case(path, tuple(expect), tuple(texts), tuple(args))
