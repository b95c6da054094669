"""Hostile specs are answered fast and small (mithril_spec/limits.py; docs/spec.md, Limits): alias and merge-key
bombs, huge files, deep nesting, huge repeats and meshes, long expressions, huge numbers. Every case runs in
one child process, each measured there (CPU time, and the process's peak memory over all of them), and
answers with a diagnostic (exit 1) or its normal output, never a traceback or an internal error; within 1 s
(interpreter start-up included: the work itself must stay well under it) and 200 MB."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPT = (ROOT / "specs" / "gpt-tiny.yaml").read_text()
MLP = (ROOT / "specs" / "mlp-dp.yaml").read_text()
MLP_TOML = (ROOT / "specs" / "mlp-dp.toml").read_text()

CPU_BUDGET_S = 0.6  # for the work itself; interpreter start-up and imports (about 0.3 s) make up the second
MEMORY_BUDGET_MB = 200


def _alias_bomb() -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    return MLP + "\n".join(lines) + "\n"


def _merge_bomb() -> str:  # merge keys of merge keys: PyYAML < 6.0.3 expands them exponentially (5.6 GB)
    lines = ["m0: &m0 {" + ", ".join(f"k{j}: {j}" for j in range(10)) + "}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 10)}]}}" for i in range(1, 12)]
    return MLP + "\n".join(lines) + "\n"


# name: (files {name: text or size of a sparse file}, argv (FILE = the first file), expected exit, expected code)
CASES: dict[str, tuple[dict, list[str], int, str | None]] = {
    "alias-bomb": ({"s.yaml": _alias_bomb()}, ["validate", "FILE"], 1, "E006"),
    "merge-key-bomb": ({"s.yaml": _merge_bomb()}, ["validate", "FILE"], 1, "E006"),
    "50-MB-spec": ({"s.yaml": 50 << 20}, ["validate", "FILE"], 1, "E006"),
    "million-comment-lines": ({"s.yaml": MLP + "# comment\n" * 1_000_000}, ["validate", "FILE"], 1, "E006"),
    "1-MiB-blank-lines-unclosed-quote": ({"s.yaml": MLP + "\n" * ((1 << 20) - len(MLP) - 20) + 'x: "open\n'},
                                         ["validate", "FILE"], 1, "E001"),
    # syntax errors explained where the mistake is: the scans for the bracket never closed stay linear
    "1-MiB-unclosed-flow-comments": ({"s.yaml": MLP + "x: [1,\n" + "# ] }\n" * (((1 << 20) - len(MLP)) // 7)
                                      + "y: 1\n"}, ["validate", "FILE"], 1, "E001"),
    "1-MiB-toml-unclosed-array": ({"s.toml": MLP_TOML + "x = [1,\n" + "# ]\n" * (((1 << 20) - len(MLP_TOML)) // 5)
                                   + "[t]\n"}, ["validate", "FILE"], 1, "E002"),
    "toml-deep-inline-tables-1-MiB-line": ({"s.toml": "x = " + "{a = " * 90 + "1 2" + "}" * 90 + " " * 1_000_000},
                                            ["validate", "FILE"], 1, "E002"),
    "1-MiB-key-without-colon": ({"s.yaml": MLP + "z\n  " + "a" * ((1 << 20) - len(MLP) - 20) + ": 1\n"},
                                ["validate", "FILE"], 1, "E001"),
    "1-MiB-toml-comments": ({"s.toml": MLP_TOML + "# comment\n" * (((1 << 20) - len(MLP_TOML)) // 10)},
                            ["validate", "FILE"], 0, None),
    "toml-100k-values": ({"s.toml": MLP_TOML + "x = [" + ",".join(["1"] * 100_000) + "]\n"},
                         ["validate", "FILE"], 1, "E006"),
    "toml-5000-digits": ({"s.toml": MLP_TOML.replace("steps = 20", "steps = " + "9" * 5000)},
                         ["validate", "FILE"], 1, "E015"),
    "deep-flow-nesting": ({"s.yaml": MLP + "x: " + "[" * 10_000 + "]" * 10_000 + "\n"}, ["validate", "FILE"], 1,
                          "E006"),
    "deep-block-nesting": ({"s.yaml": MLP + "x:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 400))},
                           ["validate", "FILE"], 1, "E006"),
    "deep-toml-dotted-keys": ({"s.toml": MLP_TOML + "x" + ".x" * 10_000 + " = 1\n"}, ["validate", "FILE"], 1,
                              "E006"),
    "repeat-100000-validate": ({"s.yaml": GPT.replace("layers: 4}", "layers: 100000}")}, ["validate", "FILE"], 1,
                               "E031"),
    "repeat-100000-build": ({"s.yaml": GPT.replace("layers: 4}", "layers: 100000}")},
                            ["build", "FILE", "--target", "jax", "-o", "OUT"], 1, "E031"),
    "report-of-2^24-devices": ({"s.yaml": GPT.replace("batch_size: 16", "batch_size: 16777216")},
                               ["plan", "FILE", "--mesh", "data=16777216", "--report", "OUT.html"], 0, None),
    "report-of-2^24-shards": ({"s.yaml": GPT.replace("batch_size: 16", "batch_size: 16777216").replace(
        "d: 128", "d: 16777216").replace("seq: 64", "seq: 1")},
                              ["plan", "FILE", "--mesh", "fsdp=16777216", "--report", "OUT.html"], 0, None),
    "long-size-expression": ({"s.yaml": GPT.replace("hidden: ff", 'hidden: "' + "+".join(["1"] * 100_000) + '"')},
                             ["validate", "FILE"], 1, "E021"),
    "deep-size-expression": ({"s.yaml": GPT.replace("hidden: ff", 'hidden: "' + "(" * 99 + "ff" + ")" * 99 + '"')},
                             ["validate", "FILE"], 0, None),
    "5000-digit-integer": ({"s.yaml": GPT.replace("ff: 512", "ff: " + "9" * 5000)}, ["validate", "FILE"], 1, "E015"),
    "2^70-batch": ({"s.yaml": GPT.replace("batch_size: 16", "batch_size: 1180591620717411303424")},
                   ["validate", "FILE"], 1, "E015"),
    "size-product-overflow": ({"s.yaml": GPT.replace("hidden: ff", 'hidden: "ff*ff*ff*ff*ff*ff*ff*ff*ff*ff"')},
                              ["validate", "FILE"], 1, "E015"),
    "lr-1e400": ({"s.yaml": GPT.replace("lr: 3.0e-4", "lr: 1e400")}, ["validate", "FILE"], 1, "E015"),
    "moe-capacity-1e300": ({"s.yaml": (ROOT / "specs" / "moe-dp.yaml").read_text().replace(
        "capacity_factor: 1.25", "capacity_factor: 1e300")}, ["validate", "FILE"], 1, "E015"),
    "4000-bad-keys-text": ({"s.yaml": GPT.replace("dims: {", "dims: {" + "".join(f'"bad {i}": 1, ' for i in range(4000)))},
                           ["validate", "FILE", "--format", "text"], 1, "E013"),
    "5000-duplicate-keys": ({"s.yaml": GPT + "".join("name: x\n" for _ in range(5000))},
                             ["validate", "FILE", "--format", "text"], 1, "E003"),
    "huge-mesh-flag": ({"s.yaml": GPT}, ["plan", "FILE", "--mesh", "data=" + "9" * 5000], 2, None),
}

CHILD = textwrap.dedent("""
    import contextlib, io, json, resource, sys, time
    from mithril_spec import cli

    def peak_mb():
        # VmHWM: this process's own peak (ru_maxrss keeps the peak of the process it was forked from)
        try:
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 2**20)

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def call(argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
        return rc, out.getvalue(), err.getvalue()

    call(["validate", sys.argv[2]])  # warm up: imports, the pydantic models
    results = {}
    for name, argv in json.loads(open(sys.argv[1]).read()).items():
        c0, w0 = cpu(), time.perf_counter()
        rc, out, err = call(argv + (["--format", "json"] if argv[0] == "validate" and "--format" not in argv
                                    else []))
        c1, w1 = cpu(), time.perf_counter()
        if argv[0] == "validate" and "--format" not in argv:
            codes = sorted({d["code"] for d in json.loads(out)})
        else:
            codes = sorted({c for c in __import__("re").findall(r"\\[([EW]\\d{3})\\]", err)})
        results[name] = {"rc": rc, "cpu": c1 - c0, "wall": w1 - w0, "codes": codes, "out": out[-300:],
                         "err": err[-300:], "maxrss_mb": peak_mb()}
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    argvs = {}
    for name, (files, argv, _rc, _code) in CASES.items():
        case = root / name
        case.mkdir()
        for fname, content in files.items():
            path = case / fname
            if isinstance(content, int):  # a file of that size (sparse: its size is what counts)
                with open(path, "wb") as f:
                    f.write(MLP.encode())
                    f.truncate(content)
            else:
                path.write_text(content, encoding="utf-8")
        first = case / next(iter(files))
        argvs[name] = [str(first) if a == "FILE" else str(case / "out") if a == "OUT" else
                       str(case / "report.html") if a == "OUT.html" else a for a in argv]
    (root / "cases.json").write_text(json.dumps(argvs))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(root / "cases.json"), str(ROOT / "specs" / "mlp-dp.yaml")],
                          capture_output=True, text=True, check=False, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1]), root


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_spec_is_answered_fast(results, name):
    res, root = results
    r = res[name]
    _files, argv, rc, code = CASES[name]
    assert "Traceback" not in r["out"] + r["err"] and "internal error" not in r["err"], r
    assert r["rc"] == rc, r
    if code is not None:
        assert code in r["codes"], r
    assert r["cpu"] < CPU_BUDGET_S, f"{name}: {r['cpu']:.2f} s of CPU"
    if "OUT.html" in argv and rc == 0:
        assert (root / name / "report.html").stat().st_size < 2 << 20


def test_hostile_specs_stay_small(results):
    res, _root = results
    peak = max(r["maxrss_mb"] for r in res.values())
    assert peak < MEMORY_BUDGET_MB, [f"{n}: {r['maxrss_mb']:.0f} MB" for n, r in res.items() if r["maxrss_mb"] > 100]


def test_real_models_stay_within_the_limits(tmp_path, capsys):
    """A 1000-layer GPT (about 6,000 layers once expanded) validates, plans and builds."""
    from mithril_spec import cli

    spec = tmp_path / "gpt-1000.yaml"
    spec.write_text(GPT.replace("layers: 4}", "layers: 1000}"))
    assert cli.main(["validate", str(spec)]) == 0
    assert cli.main(["plan", str(spec), "--format", "json"]) == 0
    capsys.readouterr()
