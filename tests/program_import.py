"""A generated program loaded in-process, for tests that call its functions (drivers run in a subprocess too:
they put this directory on sys.path first).

A build is a package of files that import each other by name (config, model, parallel, data, checkpoint,
train: mithril_spec/render/link.py), so loading a second build in one process must first forget the modules
of the one before. `load_program(build)` returns a view whose attributes are the names of all of the build's
files (train.py's first); setting one sets it in every file that holds that name, as a test that replaces a
function (the optimizer, a reduction) means it.
"""

from __future__ import annotations

import importlib
import os
import sys

MODULES = ("train", "checkpoint", "data", "parallel", "model", "config")  # train.py first: its names win


class Program:
    def __init__(self, modules):
        object.__setattr__(self, "_modules", modules)

    def __getattr__(self, name):
        for module in self._modules:
            if name in vars(module):
                return vars(module)[name]
        raise AttributeError(f"no file of the program defines {name!r}")

    def __setattr__(self, name, value):
        holders = [m for m in self._modules if name in vars(m)] or self._modules[:1]
        for module in holders:
            setattr(module, name, value)


def load_program(build) -> Program:
    """The program of the build directory `build` (its train.py and the files it imports), freshly imported."""
    build = os.path.abspath(str(build))
    for stem in MODULES:  # a previous build's files
        sys.modules.pop(stem, None)
    # and its runtime/ package: the common files are the same in every build, runtime/<target>/ only in its
    # target's (a JAX build's runtime has no runtime.torch)
    for name in [n for n in sys.modules if n == "runtime" or n.startswith("runtime.")]:
        del sys.modules[name]
    if sys.path[:1] != [build]:
        sys.path.insert(0, build)  # its files and its runtime/ package
    return Program([importlib.import_module(m) for m in MODULES if os.path.isfile(os.path.join(build, m + ".py"))])
