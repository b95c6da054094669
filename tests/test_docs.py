"""README.md and docs/*.md stay true to the code, for the claims a reader acts on literally:

- every relative link names a file that exists, and its `#anchor` a heading of that file;
- every repository path they name (`tests/test_x.py`, `specs/x.yaml`, `benchmarks/...`) exists;
- every flag of a `mithril-spec ...` command they show is one of that subcommand's, and every flag of a
  `train.py` / `generate.py` / `launch.sh` / `launch.sbatch` command one the generated programs define;
- a block that begins `$ mithril-spec ...` shows that command's output, exactly (run from the repository root);
- every YAML / TOML block of docs/ parses, and is a whole spec that validates (with no error; equal to
  specs/NAME when there is one of its name) or a fragment whose every key is one the spec schema has where it
  stands;
- docs/spec.md's table of the pipeline's stages names every code `validate` reports.

(docs/diagnostics.md and docs/targets.md are generated and compared whole: tests/test_explain.py,
tests/test_architecture.py; docs/fine-tuning.md's walk-through is examples/finetune/run.sh: test_finetune_example.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml

from mithril_spec import cli
from mithril_spec.codes import CATALOG
from mithril_spec.schema import schema_text

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GENERATED = {"diagnostics.md"}  # its blocks are the catalog's examples, broken on purpose (tests/test_explain.py)
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```$", re.MULTILINE | re.DOTALL)


def blocks(doc: Path) -> list[tuple[int, str, str]]:
    """(line, language, text) of every fenced block of `doc`, its indentation removed."""
    text = doc.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(2), textwrap.dedent(m.group(3))) for m in FENCE.finditer(text)]


def prose(doc: Path) -> str:
    """`doc` without its fenced blocks (whose `#` lines are no headings)."""
    return FENCE.sub("", doc.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------ links and paths


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *$", prose(doc), re.MULTILINE):
        a = github_anchor(m.group(1))
        out.add(f"{a}-{seen[a]}" if a in seen else a)
        seen[a] = seen.get(a, 0) + 1
    return out


def broken_links(doc: Path) -> list[str]:
    bad = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", prose(doc)):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            bad.append(f"{doc.name}: ({target}): no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            bad.append(f"{doc.name}: ({target}): {file.name} has no heading #{anchor}")
    return bad


def test_links_resolve():
    found = sum(len(re.findall(r"\]\(([^)\s#:]*\.md)?#", prose(d))) for d in DOCS)
    assert found > 50  # (the anchors are checked: the pattern finds them)
    bad = [b for d in DOCS for b in broken_links(d)]
    assert not bad, "\n".join(bad)


TOP = ("tests", "specs", "examples", "benchmarks", "scripts", "schemas", "templates", "mithril_spec", "docs")
REPO_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w./-]*[\w/])")


def missing_paths(doc: Path) -> list[str]:
    """The repository paths `doc` names that do not exist (a name with a placeholder, `specs/<name>/` or
    `out/...`, is none)."""
    bad = []
    for line_no, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        for m in REPO_PATH.finditer(line):
            path = m.group(1).rstrip(".")
            written = ("-o", "--output", "--write", ">")  # a path the command writes: `--write specs/new.yaml`
            before = line[: m.start()].split()
            if before and before[-1] in written:
                continue
            if not (ROOT / path).exists():
                bad.append(f"{doc.name}:{line_no}: {path}")
    return bad


def test_named_repository_paths_exist():
    bad = [b for d in DOCS for b in missing_paths(d)]
    assert not bad, "no such file or directory:\n" + "\n".join(bad)


# ------------------------------------------------------------------------------------------ command lines


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def commands(doc: Path, program: str) -> list[tuple[int, list[str]]]:
    """(line, words) of every `program ...` command `doc` shows, in blocks and inline, `\\` continuations
    joined; the words end at a comment, a backtick, a pipe or a closing parenthesis."""
    out = []
    lines = doc.read_text(encoding="utf-8").replace("\\\n", " ").splitlines()
    for line_no, line in enumerate(lines, 1):
        for m in re.finditer(rf"(?<![\w./-]){re.escape(program)}((?: +[^\s`#|)]+)*)", line):
            out.append((line_no, m.group(1).split()))
    return out


def unknown_cli_flags(doc: Path) -> list[str]:
    bad = []
    for line_no, words in commands(doc, "mithril-spec"):
        parser, used = cli._parser(), []
        while words and words[0] in _subcommands(parser):
            used.append(words[0])
            parser = _subcommands(parser)[words.pop(0)]
        if not used:
            continue
        bad += [
            f"{doc.name}:{line_no}: mithril-spec {' '.join(used)} {w}"
            for w in words
            if w.startswith("-") and w != "-" and w.split("=")[0] not in _flags(parser)
        ]
    return bad


def test_mithril_spec_flags_in_the_docs_exist():
    assert sum(len(commands(d, "mithril-spec")) for d in DOCS) > 100
    bad = [b for d in DOCS for b in unknown_cli_flags(d)]
    assert not bad, "not an option of that command:\n" + "\n".join(bad)


def program_flags() -> dict[str, set[str]]:
    """The options the generated programs define, read from the templates (every target's; calibrate's
    measuring scripts are no program): argparse's `add_argument("--x", ...)` for train.py and generate.py
    (generate.py's in its sampling templates), the `--x)` cases of the launch scripts."""

    def defined(paths) -> set[str]:
        flags = set()
        for p in paths:
            for call in re.findall(
                r"add_argument\((.*?)(?:help=|\n\s*\)|\)$)", p.read_text(), re.DOTALL | re.MULTILINE
            ):
                flags.update(re.findall(r"\"(--[a-z][\w-]*)\"", call))
        return flags

    templates = [p for p in (ROOT / "templates").rglob("*") if p.is_file() and "calibrate" not in p.parts]
    sampling = [p for p in templates if "sampling" in p.name]
    launchers = {
        m
        for p in templates
        if p.name.startswith("launch.")
        for m in re.findall(r"^\s*(--[a-z][\w-]*)[)=|]", p.read_text(), re.MULTILINE)
    }
    train, sampling = defined(p for p in templates if p not in sampling) | {"--help"}, defined(sampling) | {"--help"}
    return {
        "train.py": train,
        "generate.py": sampling,
        "launch.sh": train | launchers,
        "launch.sbatch": train | launchers,
    }


def unknown_program_flags(doc: Path, known: dict[str, set[str]]) -> list[str]:
    return [
        f"{doc.name}:{line_no}: {program} {w}"
        for program in known
        for line_no, words in commands(doc, program)
        for w in words
        if w.startswith("--") and w != "--" and w.split("=")[0] not in known[program]
    ]


def test_program_flags_in_the_docs_exist():
    known = program_flags()
    assert {"--steps", "--resume", "--compile", "--coordinator", "--export-hf"} <= known["train.py"]
    assert {"--prompt", "--top-k", "--params", "--init-params"} <= known["generate.py"]
    assert "--nproc" in known["launch.sh"]
    bad = [b for d in DOCS for b in unknown_program_flags(d, known)]
    assert not bad, "not an option of that program:\n" + "\n".join(bad)


# ------------------------------------------------------------------------------------------ quoted outputs


def quoted_runs(doc: Path) -> list[tuple[int, list[str], str]]:
    """(line, argv, shown output) of every block of `doc` that begins `$ mithril-spec ...`."""
    out = []
    for line, _, text in blocks(doc):
        first, _, shown = text.partition("\n")
        if first.startswith("$ mithril-spec "):
            out.append((line, shlex.split(first)[2:], shown))
    return out


def run_cli(argv: list[str], monkeypatch) -> str:
    """What `mithril-spec ARGV` prints (stdout and stderr, in order) run from the repository root."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NO_COLOR", "1")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        cli.main(argv)
    return buf.getvalue()


QUOTED = [(d, line, argv, shown) for d in DOCS if d.name not in GENERATED for line, argv, shown in quoted_runs(d)]


def test_the_docs_quote_outputs():
    assert {d.name for d, *_ in QUOTED} >= {"README.md", "spec.md"}


@pytest.mark.parametrize("doc,line,argv,shown", QUOTED, ids=[f"{d.name}:{line}" for d, line, *_ in QUOTED])
def test_quoted_output_is_the_output(doc, line, argv, shown, monkeypatch):
    out = run_cli(argv, monkeypatch)
    assert out.rstrip("\n") == shown.rstrip("\n"), (
        f"{doc.name}:{line}: `mithril-spec {shlex.join(argv)}` prints another output now: put it in the doc "
        f"(or fix the command):\n{out}"
    )


# ------------------------------------------------------------------------------------------ spec snippets

SCHEMA = json.loads(schema_text())
# `extends` is the loader's, merged away before the schema applies (docs/spec.md "extends")
ROOT_SCHEMA = {**SCHEMA, "properties": {**SCHEMA["properties"], "extends": {"type": "string"}}}


def _options(node: dict) -> list[dict]:
    """The object schemas `node` allows, its `$ref`s and `anyOf` / `oneOf` / `allOf` resolved."""
    if "$ref" in node:
        return _options(SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]])
    subs = [s for key in ("anyOf", "oneOf", "allOf") for s in node.get(key, [])]
    return [o for s in subs for o in _options(s)] if subs else [node]


def fits(value, node: dict) -> bool:
    """Whether every key of `value`'s mappings, at every depth, is one `node`'s schema has there (values
    themselves are the validator's: a fragment may leave out what a spec needs)."""
    for option in _options(node):
        if isinstance(value, dict) and option.get("type") == "object":
            props = option.get("properties", {})

            def others(key, option=option):
                out = [s for pattern, s in option.get("patternProperties", {}).items() if re.search(pattern, key)]
                extra = option.get("additionalProperties")
                return out + [extra] if isinstance(extra, dict) else out

            if all(
                fits(v, props[k]) if k in props else any(fits(v, o) for o in others(str(k))) for k, v in value.items()
            ):
                return True
        elif isinstance(value, list) and isinstance(option.get("items"), dict):
            if all(fits(v, option["items"]) for v in value):
                return True
        elif not isinstance(value, (dict, list)) or "prefixItems" in option:  # (a scalar, a tuple: the validator's)
            return True
    return False


def a_fragment_fits(value) -> bool:
    """A fragment stands somewhere in a spec: at its top, or as the value of one of the schema's objects
    (`precision: ...` inside `training`, a list of layers)."""
    defs = SCHEMA["$defs"].values()
    return (
        fits(value, ROOT_SCHEMA)
        or any(fits(value, d) for d in defs)
        or (isinstance(value, list) and all(any(fits(v, d) for d in defs) for v in value))
    )


SNIPPETS = [
    (d, line, lang, text)
    for d in DOCS
    if d.name not in GENERATED and d.parent.name == "docs"
    for line, lang, text in blocks(d)
    if lang in ("yaml", "toml")
]


def parse(lang: str, text: str):
    return yaml.safe_load(text) if lang == "yaml" else tomllib.loads(text)


def test_the_docs_show_whole_specs_and_fragments():
    kinds = {isinstance(parse(lang, text), dict) and "version" in parse(lang, text) for *_, lang, text in SNIPPETS}
    assert kinds == {True, False} and len(SNIPPETS) > 15


@pytest.mark.parametrize("doc,line,lang,text", SNIPPETS, ids=[f"{d.name}:{line}" for d, line, *_ in SNIPPETS])
def test_spec_snippet(doc, line, lang, text, tmp_path, monkeypatch):
    """A whole spec (one with `version`) validates with no error, and is specs/NAME's content where there is
    one of its name; a fragment's every key is one the spec language has where the fragment can stand."""
    where = f"{doc.name}:{line}"
    value = parse(lang, text)
    if not (isinstance(value, dict) and "version" in value):
        assert a_fragment_fits(value), f"{where}: a key of this fragment is not in the spec language (schema)"
        return
    spec = tmp_path / f"snippet.{lang}"
    spec.write_text(text, encoding="utf-8")
    out = run_cli(["validate", str(spec), "--format", "json"], monkeypatch)
    diags = json.loads(out[: out.rindex("]") + 1])
    errors = [f"{d['code']} {d['line']}:{d['col']} {d['message']}" for d in diags if d["severity"] == "error"]
    assert not errors, f"{where}: the spec shown does not validate:\n" + "\n".join(errors)
    for example in (ROOT / "specs").glob(f"{value['name']}.*"):
        if example.suffix in (".yaml", ".toml"):
            assert value == parse(example.suffix[1:], example.read_text()), (
                f"{where}: the spec shown is not {example.relative_to(ROOT)}'s content"
            )


def test_a_broken_fragment_is_told():
    assert a_fragment_fits(yaml.safe_load("training:\n  precision: {compute: float16, loss_scale: dynamic}"))
    assert not a_fragment_fits(yaml.safe_load("training:\n  precision: {compute: float16, los_scale: dynamic}"))
    assert not a_fragment_fits(yaml.safe_load("- {op: conv1d, name: c, filters: 8, kernel: 3}"))
    assert a_fragment_fits(yaml.safe_load("- {op: conv1d, name: c, filters: 8, kernel_size: 3}"))


# ------------------------------------------------------------------------------------------ the stage table


def codes_of(text: str) -> set[str]:
    """The codes a text names, `E040-E048` ranges expanded."""
    out = set(re.findall(r"\b[EW]\d{3}\b", text))
    for kind, a, b in re.findall(r"\b([EW])(\d{3})-[EW](\d{3})\b", text):
        out.update(f"{kind}{n:03d}" for n in range(int(a), int(b) + 1))
    return out


def test_the_stage_table_names_every_validate_code():
    """docs/spec.md's first block, the stages of `validate` with the codes each reports."""
    _, _, table = blocks(ROOT / "docs" / "spec.md")[0]
    assert table.startswith("load ")
    named = codes_of(table)
    validate = {c for c, entry in CATALOG.items() if entry.example.command == ("validate",)}
    assert validate - named == set(), "docs/spec.md's stage table leaves out " + ", ".join(sorted(validate - named))
    assert named - set(CATALOG) == set(), "docs/spec.md's stage table names codes that do not exist"


# ------------------------------------------------------------------------------------------ README, as written


def readme_block(first: str) -> list[str]:
    """The command lines of README.md's block that begins with the line `first`, comments dropped."""
    for _, _, text in blocks(ROOT / "README.md"):
        lines = [line.split("  #")[0].strip() for line in text.splitlines()]
        if lines and lines[0] == first:
            return [line for line in lines if line]
    raise AssertionError(f"README.md has no block beginning {first!r}")


def run_as_written(lines: list[tuple[str, Path]], doc: str) -> list[str]:
    """Run each (command line, directory) in order, as a user of this checkout would (`python`, `mithril-spec`
    this interpreter's, this checkout's package); each must exit 0. Their outputs."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")  # fmt: skip
    outputs = []
    for line, where in lines:
        line = line.replace("PYTHON=python ", f"PYTHON={sys.executable} ")
        line = line.replace("mithril-spec ", f"{sys.executable} -m mithril_spec.cli ")
        p = subprocess.run(["bash", "-c", line], check=False, cwd=where, env=env, capture_output=True, timeout=600)
        out = (p.stdout + p.stderr).decode(errors="replace")  # (generate.py prints a byte model's bytes)
        assert p.returncode == 0, f"{doc}: `{line}` exits {p.returncode}:\n{out[-4000:]}"
        outputs.append(out)
    return outputs


@pytest.mark.slow
def test_the_readme_jax_block_runs_as_written(tmp_path):
    """README.md "JAX target": every line in order (but sbatch), on the CPU's simulated devices: each exits 0,
    and the two runs that continue a 10-step checkpoint to step 20 (one process, then two) end on the loss of
    the same step."""
    pytest.importorskip("jax")
    build, cd, *lines = readme_block("mithril-spec build specs/gpt-tiny.yaml --target jax -o out/gpt-tiny-jax")
    assert cd == "cd out/gpt-tiny-jax"
    (tmp_path / "specs").symlink_to(ROOT / "specs")
    program = tmp_path / "out" / "gpt-tiny-jax"
    outputs = run_as_written(
        [(build, tmp_path), *[(line, program) for line in lines if not line.startswith("sbatch ")]], "README.md"
    )
    final = [re.findall(r"final loss ([\d.]+)", out) for out in outputs]
    resumed = [f for f, out in zip(final, outputs) if "resumed from" in out]
    assert len(resumed) == 2 and resumed[0] == resumed[1], final


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec,target,args",
    [("gpt-pipe.yaml", "jax", []), ("gpt-tiny.yaml", "torch", ["--mesh", "data=1"])],
    ids=["gpt-pipe-jax", "gpt-tiny-torch-1"],
)
def test_a_generated_readme_runs_as_written(spec, target, args, tmp_path):
    """The README.md of a build of a language model, its "Run" and "Sampling" blocks in order: each line exits 0
    (the profile run after the training run, whose checkpoints gpt-tiny's spec saves; generate.py --resume from
    the checkpoints the lines before saved, which gpt-pipe's spec does not ask for)."""
    pytest.importorskip(target)
    program = tmp_path / "program"
    assert cli.main(["build", str(ROOT / "specs" / spec), "--target", target, "-o", str(program), *args]) == 0
    readme = (program / "README.md").read_text()
    lines = []
    for section in ("## Run\n", "## Sampling\n"):
        block = re.search(r"```bash\n(.*?)```", readme.split(section, 1)[1], re.DOTALL).group(1)
        lines += [line.split("  #")[0].strip() for line in block.splitlines()]
    assert any("--profile" in line for line in lines) and any("generate.py --resume" in line for line in lines)
    run_as_written([(line, program) for line in lines if line], "the build's README.md")


# ------------------------------------------------------------------------------------------ hardware profiles


def test_the_docs_list_the_built_in_profiles():
    """README.md's and spec.md's lists and cost-model.md's table name the built-in profiles, all of them; the
    aliases cost-model.md gives are aliases."""
    from mithril_spec.planner.hardware import ALIASES, BUILTIN

    readme = re.search(r"Built-in profiles: (.*?); a spec", (ROOT / "README.md").read_text(), re.DOTALL).group(1)
    spec = re.search(r"besides the built-in ones \((.*?); aliases", (ROOT / "docs" / "spec.md").read_text(), re.DOTALL)
    cost = (ROOT / "docs" / "cost-model.md").read_text()
    section = cost.split("## Hardware and step time")[1].split("Aliases: ")[0]
    table = re.findall(r"^\| `([\w-]+)` \|", section, re.MULTILINE)
    aliases = re.search(r"^Aliases: (.*?)\. ", cost, re.MULTILINE).group(1)
    for where, text in (("README.md", readme), ("docs/spec.md", spec.group(1)), ("docs/cost-model.md", table)):
        named = re.findall(r"`([\w-]+)`", text) if isinstance(text, str) else text
        assert sorted(named) == sorted(BUILTIN), f"{where} lists the built-in profiles {named}, not {list(BUILTIN)}"
    assert set(re.findall(r"`([\w-]+)`", aliases)) <= set(ALIASES)
