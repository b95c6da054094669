"""render/link.py: a program template's text cut into the build's files, each importing what it uses."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from program_files import TRAINING
from render_cases import ruff_problems

from mithril_spec.frontend import compile_file
from mithril_spec.render import link
from mithril_spec.render.build import render_files

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = '''"""the entry's docstring"""

import math
import os

from runtime.errors import require

# mithril-file: config.py
"""settings"""
SHARED = 3
# the rate
RATE = 0.5
# ----
WIDTH = SHARED * 2
# mithril-file: model.py
"""the model"""


def model(x):
    return math.sqrt(x) * WIDTH + SHARED
# mithril-file: train.py


def main():
    require(RATE > 0, "rate")
    return model(SHARED) * RATE
'''


def test_each_part_gets_the_imports_it_uses_and_the_settings_only_it_reads():
    files = link.link(link.split(PROGRAM, "train.py"))
    assert sorted(files) == ["config.py", "model.py", "train.py"]
    config, model, train = files["config.py"], files["model.py"], files["train.py"]
    assert config.startswith('"""settings"""') and "import" not in config  # it uses none
    assert "SHARED = 3" in config  # read by two files
    assert "RATE" not in config and "WIDTH" not in config  # each read by one file alone: it opens that file
    assert "WIDTH = SHARED * 2" in model
    assert "# the rate\nRATE = 0.5" in train and link.OWN_SETTINGS in train
    assert train.startswith('"""the entry\'s docstring"""')
    assert "import math" in model and "import os" not in model and "from runtime" not in model
    assert "from config import SHARED\n" in model
    assert "from config import SHARED\n" in train and "from model import model" in train
    assert "from runtime.errors import require" in train and "import math" not in train
    for name, text in files.items():
        compile(text, name, "exec")


def test_a_name_used_before_the_file_that_defines_it_fails_the_build():
    backwards = PROGRAM.replace("return math.sqrt(x) * WIDTH + SHARED", "return main() + x")
    with pytest.raises(link.LinkError, match="model.py uses main of a file after it"):
        link.link(link.split(backwards, "train.py"))


def test_a_name_two_earlier_files_define_fails_the_build():
    twice = PROGRAM.replace('"""the model"""\n', '"""the model"""\nSHARED = 1.0\n')
    with pytest.raises(link.LinkError, match="SHARED, defined in more than one file"):
        link.link(link.split(twice, "train.py"))


def test_an_unknown_file_fails_the_build():
    with pytest.raises(link.LinkError, match="unknown program file"):
        link.split(PROGRAM.replace("# mithril-file: model.py", "# mithril-file: helpers.py"), "train.py")


def test_long_imports_are_packed_and_ruff_clean(tmp_path):
    names = [f"SETTING_NUMBER_{i}" for i in range(12)]
    program = PROGRAM.replace("SHARED = 3\n", "SHARED = 3\n" + "".join(f"{n} = {i}\n" for i, n in enumerate(names)))
    program = program.replace("return math.sqrt(x) * WIDTH + SHARED",
                              "return math.sqrt(x) * WIDTH + SHARED + " + " + ".join(names))
    program = program.replace("return model(SHARED) * RATE", "return model(SHARED) * RATE + " + " + ".join(names))
    files = {n: link.link(link.split(program, "train.py"))[n] for n in ("config.py", "model.py", "train.py")}
    from mithril_spec.render.build import format_python

    files = {n: format_python(t, n) for n, t in files.items()}
    block = files["model.py"].split("# fmt: off\n")[1].split("# fmt: on")[0]
    assert block.count("\n") <= 4 and all(n in block for n in names)  # packed, not a line per name
    assert not ruff_problems(files, tmp_path)


@pytest.mark.parametrize(("spec", "target"), [("gpt-tiny.yaml", "torch"), ("gpt-pipe.yaml", "jax"),
                                              ("mlp-dp.yaml", "mlx")])
def test_a_build_imports_only_from_the_files_before(spec, target):
    files = render_files(compile_file(ROOT / "specs" / spec), target, spec)
    order = [f for f in link.PROGRAM_FILES if f in files]
    assert order[: len(TRAINING)] == list(TRAINING)
    for i, name in enumerate(order):
        own = {n.module for n in ast.parse(files[name]).body if isinstance(n, ast.ImportFrom)
               and n.module + ".py" in link.PROGRAM_FILES}
        assert own <= {f[:-3] for f in order[:i]}, (name, own)
