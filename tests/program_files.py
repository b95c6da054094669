"""The Python files of a generated program (render/link.py PROGRAM_FILES, runtime/ aside): a build is a package
of focused files (config.py, model.py, parallel.py, data.py, checkpoint.py, train.py; generate.py for a language
model), so what a test looks for in "the program" is in their text together."""

from __future__ import annotations

from pathlib import Path

from mithril_spec.render.link import PROGRAM_FILES

TRAINING = tuple(f for f in PROGRAM_FILES if f != "generate.py")  # the training program's files


def program_text(source: dict[str, str] | Path | str, files: tuple[str, ...] = TRAINING) -> str:
    """The training program's files joined in their order, from `render_files`' mapping or a build directory."""
    if isinstance(source, dict):
        return "\n".join(source[f] for f in files if f in source)
    return "\n".join((Path(source) / f).read_text() for f in files if (Path(source) / f).is_file())
