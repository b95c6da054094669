"""One rendered program -> the files of its package, each importing what it uses from the ones before it.

A target's program template renders the whole program as one text: a prologue (the entry file's docstring and
every import any part needs), then parts, each opened by a marker line `# mithril-file: NAME.py` and its own
docstring. `split` cuts it into files; `link` gives each file the prologue's imports it uses and a
`from NAME import ...` line for each earlier file it uses names of (found by the symbol tables of the
parsed files, not by text). Files import only from files before them in PROGRAM_FILES' order
(config -> model -> parallel -> data -> checkpoint -> train -> generate): the data flows one way, and a name
used before the file that defines it is a RenderError, as is a name defined by two files.
"""

from __future__ import annotations

import ast
import re
import symtable

from .. import pyast

# the files a program may be split into, in the order they may import from each other
PROGRAM_FILES = ("config.py", "model.py", "parallel.py", "data.py", "checkpoint.py", "train.py", "generate.py")
MARKER = re.compile(r"^# mithril-file: (\S+)[ \t]*\n", re.MULTILINE)
RUNTIME = "runtime"
WIDTH = 100  # the programs' line length (render/build.py RUFF_SETTINGS)
LOCAL_IMPORTS = "# beside this file: runtime/ (the helpers every build carries unchanged) and this build's files"


class LinkError(Exception):
    pass


def split(text: str, name: str) -> dict[str, str]:
    """{file: text} of one rendered template: the whole text under `name` without markers; with markers, the
    prologue (its docstring goes to `name`, its imports to every part: `link` keeps those a part uses)
    followed by each part."""
    pieces = MARKER.split(text)
    if len(pieces) == 1:
        return {name: text}
    prologue, parts = pieces[0], dict(zip(pieces[1::2], pieces[2::2], strict=True))
    unknown = [p for p in parts if p not in PROGRAM_FILES]
    if unknown:
        raise LinkError(f"{name}: unknown program file(s) {', '.join(unknown)} (PROGRAM_FILES)")
    doc, imports = _docstring(prologue)
    out = {}
    for part, body in parts.items():
        part_doc, rest = _docstring(body)
        if part == name:
            part_doc = doc + ("\n" + part_doc if part_doc else "")
        out[part] = part_doc + imports + "\n\n" + rest.lstrip("\n")
    return out


def _docstring(text: str) -> tuple[str, str]:
    """(the module docstring with its line end, or "", the rest) of a text."""
    tree = pyast.parse(text)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = text.splitlines(keepends=True)
        return "".join(lines[: first.end_lineno]), "".join(lines[first.end_lineno:])
    return "", text


def link(files: dict[str, str]) -> dict[str, str]:
    """The program files of `files` (PROGRAM_FILES present), each with only the imports it uses and its
    imports of the earlier files' names it uses; other files unchanged."""
    order = [f for f in PROGRAM_FILES if f in files]
    files = _settle_config(files, order)
    defined = {f: _defined(files[f], f) for f in order}
    out = dict(files)
    for i, name in enumerate(order):
        reads = _used(files[name], name)
        used = reads - defined[name]
        own = []
        for earlier in order[:i]:
            names = sorted(used & defined[earlier])
            clash = [n for n in names if any(n in defined[o] for o in order[:i] if o != earlier)]
            if clash:
                raise LinkError(f"{name} uses {', '.join(clash)}, defined in more than one file before it")
            if names:
                own.append(f"from {earlier[:-3]} import {', '.join(names)}")
        later = sorted(n for f in order[i + 1:] for n in used & defined[f] if f != "generate.py")
        if later:
            raise LinkError(f"{name} uses {', '.join(later)} of a file after it (files import only from the ones "
                            f"before them: {' -> '.join(order)})")
        out[name] = _with_imports(files[name], reads, own)
    return out


SHARED = "config.py"
OWN_SETTINGS = "# what the spec decided that only this file uses (the settings several files share: config.py)"


def _settle_config(files: dict[str, str], order: list[str]) -> dict[str, str]:
    """Every assignment of config.py whose names one other training file alone reads moves to the top of that
    file (with the comment lines right above it), as nanoGPT's train.py opens with its settings: config.py
    keeps what several files share. One that no file reads goes (a setting nothing runs on is dead code).
    Decided from the last statement up, so that a setting read only by settings that moved (or went) goes
    with them."""
    if SHARED not in files:
        return files
    text = files[SHARED]
    lines = text.splitlines(keepends=True)
    readers = {f: _used(files[f], f) for f in order if f != SHARED}
    stays: set[str] = set()  # names read by what stays in config.py
    moving: dict[str, list[tuple[int, int]]] = {}
    dropped: list[tuple[int, int]] = []  # read by no file
    for node in reversed(pyast.parse(text).body):
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        reads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        users = [f for f, used in readers.items() if names & used]
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and len(users) <= 1 and users != ["generate.py"]
                and not names & stays):
            start = node.lineno - 1
            while start and lines[start - 1].startswith("#") and not lines[start - 1].startswith("# ---"):
                start -= 1  # its comment
            if users:
                moving.setdefault(users[0], []).insert(0, (start, node.end_lineno))
                readers[users[0]] |= reads
            else:
                dropped.append((start, node.end_lineno))
        else:
            stays |= reads
    if not moving and not dropped:
        return files
    out = dict(files)
    gone = {i for spans in [*moving.values(), dropped] for a, b in spans for i in range(a, b)}
    out[SHARED] = "".join(line for i, line in enumerate(lines) if i not in gone)
    for f, spans in moving.items():
        block = OWN_SETTINGS + "\n" + "".join("".join(lines[a:b]) for a, b in spans)
        out[f] = _after_imports(files[f], block)
    return out


def _after_imports(text: str, block: str) -> str:
    """`text` with `block` after its docstring and top-level imports."""
    tree = pyast.parse(text)
    at = 0
    for i, node in enumerate(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (i == 0 and _docstring(text)[0]):
            at = node.end_lineno
        else:
            break
    lines = text.splitlines(keepends=True)
    return "".join(lines[:at]) + "\n\n" + block + "\n\n" + "".join(lines[at:])


def _defined(text: str, name: str) -> set[str]:
    """The names a file defines at module level (functions, classes, assignments; not its imports)."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))

    visit(pyast.parse(text, filename=name).body)
    return names


def _used(text: str, name: str) -> set[str]:
    """The module-level names a file reads: at module level, or as a global from any function or class."""
    with pyast.LOCK:
        table = symtable.symtable(text, name, "exec")
    used = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    stack = list(table.get_children())
    while stack:
        scope = stack.pop()
        stack.extend(scope.get_children())
        used.update(s.get_name() for s in scope.get_symbols() if s.is_global() and s.is_referenced())
    return used


def _with_imports(text: str, used: set[str], own: list[str]) -> str:
    """`text` with its top-level imports (those before the first other statement) cut to the names it
    `used`, one statement per module, and the imports `own` of the build's other files after the ones of
    runtime/ (the build's ruff pass sorts each group)."""
    tree = pyast.parse(text)
    body = tree.body[1:] if _docstring(text)[0] else tree.body
    head = []
    for node in body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            break
        head.append(node)
    if not head and not own:
        return text
    outside, local = [], []
    for node in head:
        kept = [a for a in node.names if (a.asname or a.name.split(".")[0]) in used]
        if not kept:
            continue
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
        if isinstance(node, ast.Import):
            outside.append(f"import {names}")
        elif node.module.split(".")[0] == RUNTIME:
            local.append(f"from {node.module} import {names}")
        else:
            outside.append(f"from {node.module} import {names}")
    local = sorted(local + own, key=lambda line: line.split()[1])
    lines = text.splitlines(keepends=True)
    start = head[0].lineno - 1 if head else (body[0].lineno - 1 if body else len(lines))
    end = head[-1].end_lineno if head else start
    block = "\n".join(outside) + "\n"
    if local:
        block += "\n" + _local_block(local)
    return "".join(lines[:start]) + block + "".join(lines[end:])


def _local_block(imports: list[str]) -> str:
    """The imports of runtime/ and the build's files, after the others. Where one does not fit on a line it is
    wrapped at WIDTH, the names packed (ruff would give each name a line of its own: dozens of lines at the
    top of train.py), between pragmas that keep ruff's formatter and import sorter off them."""
    if all(len(line) <= WIDTH for line in imports):
        return "# isort: split\n" + LOCAL_IMPORTS + "\n" + "\n".join(imports) + "\n"
    wrapped = []
    for line in imports:
        if len(line) <= WIDTH:
            wrapped.append(line)
            continue
        head, names = line.split(" import ", 1)
        indent = " " * len(head + " import (")
        rows, row = [], head + " import ("
        for name in names.split(", "):
            piece = name + ", "
            if len(row) + len(piece.rstrip()) + 1 > WIDTH:  # (+1: a closing parenthesis may follow)
                rows.append(row.rstrip())
                row = indent
            row += piece
        rows.append(row.rstrip(", ") + ")")
        wrapped.append("\n".join(rows))
    return ("# isort: off\n# fmt: off\n" + LOCAL_IMPORTS + "\n" + "\n".join(wrapped) + "\n# fmt: on\n"
            "# isort: on\n")
