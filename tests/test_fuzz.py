"""Property-based fuzzing of the front end: whatever the file holds, `validate` answers 0 or 1 (never a
usage error for a file that exists, never an internal error or a traceback), the front end raises only
`DiagnosticError`, and every diagnostic names a real position in a real file.

Inputs: character, line and byte mutations of the example specs (YAML and TOML), and structured specs
(valid ones with random values, keys and deletions at random places) written out as YAML and as TOML.
Crashes the fuzzer found are kept below as regression cases.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import tempfile
import tomllib
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mithril_spec import cli
from mithril_spec.codes import CATALOG
from mithril_spec.diagnostics import DiagnosticError
from mithril_spec.frontend import compile_file
from mithril_spec.ops import OPS
from mithril_spec.schema import schema_text
from mithril_spec.source import load_file
from mithril_spec.spec.sharding import MESH_AXES

ROOT = Path(__file__).resolve().parent.parent
SEEDS = sorted(p for p in (ROOT / "specs").iterdir() if p.suffix in (".yaml", ".toml")) + [
    ROOT / "tests" / "specs" / "twins" / "gpt-tiny.toml",
    ROOT / "tests" / "specs" / "broken" / "pipeline_stages_out_of_order.yaml",
    ROOT / "tests" / "specs" / "broken" / "moe_experts_not_divisible.yaml",
    ROOT / "tests" / "specs" / "broken" / "unknown_key_layer.toml",
]
SEED_TEXT = {p: p.read_text(encoding="utf-8") for p in SEEDS}
SEED_DATA = {p: load_file(p).data for p in SEEDS if p.parent.name in ("specs", "twins")}

# MITHRIL_FUZZ_EXAMPLES=5000 for a long run; the default keeps each test to a few seconds.
EXAMPLES = int(os.environ.get("MITHRIL_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)

_TMP = Path(tempfile.mkdtemp(prefix="mithril-fuzz-"))


# ---------------------------------------------------------------- the property


def check(path: Path, thorough: bool = True) -> list[dict]:
    """Runs validate (JSON and text), plan and the front end on `path`; returns the JSON diagnostics."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["validate", str(path), "--format", "json"])
    assert rc in (0, 1), (rc, err.getvalue())
    assert "Traceback" not in out.getvalue() + err.getvalue()
    diags = json.loads(out.getvalue())
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    for d in diags:
        assert d["code"] in CATALOG
        assert d["message"]
        assert d["file"] is not None and Path(d["file"]).is_file(), d
        if d["file"] == str(path):
            assert 1 <= d["line"] <= max(1, len(lines) + 1), (d, len(lines))
        assert d["col"] >= 1
    assert (rc == 1) == any(d["severity"] == "error" for d in diags)
    if not thorough:
        return diags

    text_out = io.StringIO()
    with contextlib.redirect_stdout(text_out), contextlib.redirect_stderr(text_out):
        assert cli.main(["validate", str(path), "--color", "always"]) == rc
        assert cli.main(["plan", str(path)]) in (0, 1)
    assert "Traceback" not in text_out.getvalue() and "internal error" not in text_out.getvalue()

    try:
        compile_file(path)
    except DiagnosticError as e:
        assert e.diagnostics
    return diags


def write(text: str | bytes, suffix: str) -> Path:
    path = _TMP / f"fuzz{suffix}"
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    return path


# ---------------------------------------------------------------- text mutations

SYNTAX = list(":{}[],\"'#=.-*&!|>?%@`\\\t\n ") + ["\r\n", "  ", "- ", "---", "...", '"""', "'''", "[[", "]]", "<<: "]
WORDS = [
    "",
    "0",
    "-1",
    "1e309",
    "-0.0",
    "nan",
    "inf",
    ".nan",
    "null",
    "~",
    "true",
    "no",
    "yes",
    "[]",
    "{}",
    "batch",
    "d/3",
    "heads*2",
    "vocab - 256",
    "x" * 70,
    "1_000",
    "0x10",
    "0o17",
    "'q'",
    '"',
    ":",
    "&a",
    "*a",
    "!!binary",
    "!!python/object:os.system",
    "2001-02-30",
    "12:30:00",
    "é",
    "\u2028",
    "\x00",
    "\x7f",
    "\ufeff",
    "tensor",
    "fsdp",
    "pipe",
    "expert",
    "block_input",
    "layer_norm",
    "repeat",
    "extends",
    "../x.yaml",
    "9" * 40,
]


@st.composite
def mutated(draw, seeds=SEEDS):
    path = draw(st.sampled_from(seeds))
    text = SEED_TEXT[path]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "swap", "lines", "dup", "indent", "word"]))
        n = len(text)
        i = draw(st.integers(0, max(n - 1, 0)))
        if kind == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 12)) :]
        elif kind == "insert":
            piece = draw(st.lists(st.sampled_from(SYNTAX) | st.text(max_size=3), min_size=1, max_size=4))
            text = text[:i] + "".join(piece) + text[i:]
        elif kind == "swap" and n > 1:
            j = draw(st.integers(0, n - 1))
            a, b = sorted((i, j))
            text = text[:a] + text[b] + text[a + 1 : b] + text[a] + text[b + 1 :] if a != b else text
        elif kind in ("lines", "dup", "indent"):
            lines = text.split("\n")
            k = draw(st.integers(0, len(lines) - 1))
            if kind == "lines":
                m = draw(st.integers(0, len(lines) - 1))
                lines[k], lines[m] = lines[m], lines[k]
            elif kind == "dup":
                lines.insert(k, lines[k])
            else:
                lines[k] = draw(st.sampled_from(["  ", "", "\t", "    "])) + lines[k].lstrip(
                    " " if draw(st.booleans()) else ""
                )
            text = "\n".join(lines)
        else:
            tokens = list(re.finditer(r"[A-Za-z0-9_.+\-]+", text))
            if tokens:
                t = draw(st.sampled_from(tokens))
                text = text[: t.start()] + draw(st.sampled_from(WORDS) | st.text(max_size=6)) + text[t.end() :]
    return path.suffix, text


@FUZZ
@given(mutated())
def test_fuzz_text_mutations(case):
    suffix, text = case
    check(write(text, suffix))


@FUZZ
@given(
    st.sampled_from(SEEDS),
    st.lists(st.tuples(st.integers(0, 10**6), st.binary(min_size=0, max_size=4)), min_size=1, max_size=4),
)
@example(SEEDS[0], [(30, b"\xe9")])
@example(SEEDS[0], [(0, b"\xef\xbb\xbf")])
@example(SEEDS[0], [(10, b"\x00")])
def test_fuzz_byte_mutations(seed, edits):
    """Raw bytes, including invalid UTF-8, NULs and BOMs: still a diagnostic (exit 1), never exit 2."""
    data = bytearray(seed.read_bytes())
    for pos, chunk in edits:
        pos %= len(data) + 1
        if chunk:
            data[pos:pos] = chunk
        else:
            del data[pos : pos + 1]
    check(write(bytes(data), seed.suffix))


# ---------------------------------------------------------------- structured specs


def _schema_keys() -> list[str]:
    keys: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "properties" and isinstance(v, dict):
                    keys.update(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(schema_text()))
    return sorted(keys)


KEYS = _schema_keys()
NAMES = sorted(
    set(OPS)
    | set(MESH_AXES)
    | {
        "batch",
        "block_input",
        "x",
        "y",
        "tokens",
        "wte",
        "fc1",
        "head",
        "decoder",
        "blocks",
        "d",
        "heads",
        "vocab",
        "seq",
        "embed",
        "mlp",
    }
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.integers(-3, 300)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(NAMES + WORDS)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS + NAMES) | st.text(min_size=1, max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


PLAUSIBLE = (
    st.integers(-1, 300)
    | st.booleans()
    | st.sampled_from(NAMES)
    | st.sampled_from(["d/2", "4*d", "heads", "ff"])
    | st.lists(st.sampled_from(NAMES + ["batch", 8, 64, None]), max_size=4)
)
LOGICAL = ["batch", "embed", "heads", "kv_heads", "mlp", "vocab", "experts", "features", "seq", "nope"]
AXES = st.sampled_from(list(MESH_AXES) + ["dta"])
PLANS = st.fixed_dictionaries(
    {},
    optional={
        "meshes": st.dictionaries(
            st.sampled_from(["default", "a", "b"]),
            st.dictionaries(AXES, st.integers(1, 8) | st.just(0), max_size=4),
            max_size=3,
        ),
        "mesh": st.dictionaries(AXES, st.integers(1, 8), max_size=4),
        "devices": st.integers(0, 16),
        "sharding": st.fixed_dictionaries(
            {},
            optional={
                "rules": st.dictionaries(st.sampled_from(LOGICAL), AXES | st.lists(AXES, max_size=3), max_size=5)
                | st.lists(st.tuples(st.sampled_from(LOGICAL), AXES).map(list), max_size=4),
                "params": st.dictionaries(
                    st.sampled_from(
                        ["*", "*.weight", "wte.weight", "fc1.*", "blocks.*.attn.*", "head.bias", "nothing"]
                    ),
                    st.lists(AXES | st.none() | st.lists(AXES, max_size=2), max_size=3),
                    max_size=3,
                ),
                "inputs": st.dictionaries(
                    st.sampled_from(["x", "y", "tokens", "targets", "z"]),
                    st.lists(AXES | st.none(), max_size=3),
                    max_size=2,
                ),
            },
        ),
        "pipeline": st.fixed_dictionaries(
            {"microbatches": st.integers(0, 8)},
            optional={
                "schedule": st.sampled_from(["gpipe", "1f1b", "interleaved"]),
                "virtual_stages": st.integers(1, 3),
            },
        ),
        "training": st.fixed_dictionaries({"batch_size": st.integers(1, 64), "grad_accum": st.integers(1, 4)}),
    },
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _copy(node):
    return json.loads(json.dumps(node))


@st.composite
def structured(draw):
    seed = draw(st.sampled_from(sorted(SEED_DATA)))
    data = _copy(SEED_DATA[seed])
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(data))
        path = draw(st.sampled_from(paths))
        parent = data
        for p in path[:-1]:
            parent = parent[p]
        kind = draw(st.sampled_from(["replace", "delete", "add", "add"]))
        if not path:
            if kind == "replace" and draw(st.integers(0, 9)) == 0:
                data = draw(VALUES)  # a whole document that is not a spec
            elif isinstance(data, dict):
                data[draw(st.sampled_from(KEYS))] = draw(VALUES)
            continue
        node = parent[path[-1]]
        if kind == "replace":
            parent[path[-1]] = draw(PLAUSIBLE if draw(st.booleans()) else VALUES)
        elif kind == "delete":
            del parent[path[-1]]
        elif isinstance(node, dict):
            node[draw(st.sampled_from(KEYS + NAMES))] = draw(VALUES)
        elif isinstance(node, list):
            node.insert(draw(st.integers(0, len(node))), draw(VALUES))
        else:
            parent[path[-1]] = draw(VALUES)
    return data


@st.composite
def planned(draw):
    """A valid spec with a random mesh, sharding, pipeline and batch: exercises the planner's checks."""
    seed = draw(st.sampled_from(sorted(SEED_DATA)))
    data = _copy(SEED_DATA[seed])
    extra = draw(PLANS)
    if "mesh" in extra and "meshes" in extra and draw(st.integers(0, 9)):
        del extra["mesh"]  # both at once is E047; keep that rare
    for key in ("mesh", "meshes", "sharding", "pipeline", "devices"):
        if key in extra:
            data.pop("meshes" if key == "mesh" else "mesh" if key == "meshes" else key, None)
    for key, value in extra.items():
        if key == "training":
            data["training"].update(value)
        else:
            data[key] = value
    return data


def to_yaml(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=None)


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, list):
        items = [x for x in (_toml_value(i) for i in v) if x is not None]
        return "[" + ", ".join(items) + "]"
    items = [(k, _toml_value(x)) for k, x in v.items()]
    return "{" + ", ".join(f"{_toml_str(str(k))} = {x}" for k, x in items if x is not None) + "}"


def to_toml(data) -> str:
    """A minimal TOML writer (no null in TOML: null entries are dropped); the top level must be a table."""
    if not isinstance(data, dict):
        data = {"value": data}
    lines = [f"{_toml_str(str(k))} = {x}" for k, x in ((k, _toml_value(v)) for k, v in data.items()) if x is not None]
    return "\n".join(lines) + "\n"


def test_toml_writer_round_trips_the_examples():
    for seed, data in SEED_DATA.items():
        assert tomllib.loads(to_toml(data)) == data, seed


@FUZZ
@given(structured())
def test_fuzz_structured_yaml(data):
    text = to_yaml(data)
    check(write(text, ".yaml"))


@FUZZ
@given(structured())
def test_fuzz_structured_toml(data):
    text = to_toml(data)
    tomllib.loads(text)  # the writer is right; what the spec means is the front end's business
    check(write(text, ".toml"))


@FUZZ
@given(planned(), st.booleans())
def test_fuzz_planner(data, toml):
    check(write(to_toml(data) if toml else to_yaml(data), ".toml" if toml else ".yaml"))


# ---------------------------------------------------------------- command-line values


@settings(max_examples=80, deadline=None, database=None)
@given(
    mesh=st.none()
    | st.text(alphabet="datfspiesnorx=,0123456789 ", max_size=20)
    | st.sampled_from(["default", "single", "fsdp_tp", "data=4,tensor=2", "pipe=2", "expert=2", "data=0"]),
    devices=st.none() | st.integers(-2, 64),
    strict=st.booleans(),
)
def test_fuzz_cli_mesh_and_devices(mesh, devices, strict):
    """Bad flags are usage errors (2) or spec diagnostics (1), never an internal error (3)."""
    argv = ["validate", str(ROOT / "specs" / "gpt-tiny.yaml"), "--format", "json"]
    argv += ["--mesh", mesh] if mesh is not None else []
    argv += ["--devices", str(devices)] if devices is not None else []
    argv += ["--strict"] if strict else []
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
    assert rc in (0, 1, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()


# ---------------------------------------------------------------- regressions found by fuzzing


REGRESSIONS = {
    "invalid-date.yaml": ("x: 2001-02-30\n", "E010"),  # ValueError from the timestamp constructor: was exit 2
    "bad-float-tag.yaml": ("version: !!float abc\n", "E014"),  # ValueError: was exit 2
    "deep-flow.yaml": ("x: " + "[" * 3000 + "]" * 3000 + "\n", "E006"),  # RecursionError: was exit 3
    "deep-array.toml": ("x = " + "[" * 3000 + "]" * 3000 + "\n", "E006"),  # RecursionError: was exit 3
    "deep-table.toml": ("x = " + "{a=" * 600 + "1" + "}" * 600 + "\n", "E006"),  # RecursionError: was exit 3
    "deep-block.yaml": ("x:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 3000)), "E006"),  # was 1:1
    "deep-dotted.toml": ("x" + ".x" * 3000 + " = 1\n", "E006"),
    "laughs.yaml": (
        "a: &a [1,1,1,1,1,1,1,1,1,1]\n"
        + "".join(f"a{i}: &a{i} [{','.join([('*a' if i == 1 else f'*a{i - 1}')] * 10)}]\n" for i in range(1, 9)),
        "E006",
    ),
    # merge keys of merge keys: PyYAML < 6.0.3 expands them exponentially while flattening (5.6 GB)
    "merge-laughs.yaml": (
        "a0: &a0 {" + ", ".join(f"k{j}: {j}" for j in range(10)) + "}\n"
        + "".join(f"a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * 10)}]}}\n" for i in range(1, 12)),
        "E006",
    ),
    "alias-cycle.yaml": ("a: &a [1, *a]\n", "E001"),
    "surrogate-key.yaml": ('version: 1\n"\\ud800": 1\n', "E001"),  # was E013 at 1:1 quoting the whole spec
    "int-digits.yaml": ("version: " + "9" * 5000 + "\n", "E015"),  # was E012 quoting 5000 digits
    "int-digits.toml": ("version = " + "9" * 5000 + "\n", "E015"),  # ValueError: was a usage error (exit 2)
    "toml-many-values.toml": ("x = [" + ",".join(["1"] * 100_000) + "]\n", "E006"),  # took 9 s
    "toml-unclosed-quotes.toml": ('x = "' + 'a\\"' * 30_000 + "\n", "E002"),  # each quote rescanned the line
    "toml-long-word.toml": ("x = " + "9" * 3999 + " " + "a" * 500_000 + "\n", "E002"),
    # RecursionError in the size parser: was exit 3
    "long-expression.yaml": ((ROOT / "specs" / "gpt-tiny.yaml").read_text().replace(
        "hidden: ff", 'hidden: "' + "+".join(["1"] * 50_000) + '"'), "E021"),
    # syntax errors explained where the mistake is: brackets and quotes in strings and comments do not count
    "unclosed-in-strings.yaml": ("x: [\"]\", 'a'']', # ]\n  1\n", "E001"),
    "unclosed-in-strings.toml": ('x = [\"]\", \'\'\'\n]\'\'\', # ]\n1\n', "E002"),
    "escape-at-end.toml": ('x = "\\', "E002"),
    "key-at-end.toml": ("x", "E002"),
    "control-char.yaml": ('version: 1\nname: "a\x01b"\n', "E001"),  # was reported at 1:1
    "latin1.toml": (b'version = 1\nname = "caf\xe9"\n', "E002"),  # was a usage error (exit 2)
    "bom.toml": (b"\xef\xbb\xbfversion = 2\n", "E014"),  # a BOM made every TOML spec a syntax error
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_fuzz_regressions(name, tmp_path):
    text, code = REGRESSIONS[name]
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    diags = check(path)
    assert code in {d["code"] for d in diags}, diags
