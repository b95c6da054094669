"""Test-session setup: the suite builds programs from several threads while other tests (and coverage's
analysis of the generated programs) parse Python too; CPython 3.11's ast.parse is not thread-safe, so
every parse in the test process takes one lock (mithril_spec/pyast.py)."""

from mithril_spec import pyast

pyast.install()
