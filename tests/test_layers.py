"""The package's layers point one way: every import of msgq's own modules goes to a lower
layer (or stays inside its own unit), no import cycle exists, and a function-local import
says why it is not at the top.

The layer order is written once, here (README's Layout section and ``msgq/__init__.py``
draw it). The check reads the source with :mod:`ast` (Cython files: their Python-level
``import`` lines), so it sees function-local imports too, and skips ``if TYPE_CHECKING:``
blocks, which never run.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Folders of the source tree and the package each becomes (setup.py's package_dir).
FOLDERS = {"msgq": "msgq", "visionipc": "msgq.visionipc", "schemas": "msgq.schemas"}

#: Lowest first. A module belongs to the unit that is the longest prefix of its name
#: ("msgq" alone is the package's __init__). A unit imports its own modules and units of
#: lower layers; units of one layer are peers and do not import each other.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # msgq._reservation: the Reservation base that both backends subclass
    ("foundation", ("msgq._reservation", "msgq.aio", "msgq.errors", "msgq.tables",
                    "msgq.version")),
    # msgq.extras: the one loader of an optional extra's library (its install hint names
    # msgq.version's distribution)
    ("extras", ("msgq.extras",)),
    ("clock", ("msgq.clock",)),
    ("events", ("msgq.schemas",)),
    # msgq/shm/*.pyx are the files msgq/shm_backend.pyx includes: one module.
    ("extension", ("msgq.shm_backend", "msgq.shm")),
    ("queue namespace", ("msgq.queues",)),
    ("backends", ("msgq.zmq", "msgq.fake_events")),
    ("socket factory", ("msgq.sockets",)),
    ("package", ("msgq",)),
    ("services", ("msgq.messaging", "msgq.logs", "msgq.visionipc")),
    ("tools", ("msgq.lockstep", "msgq.bridge", "msgq.spark", "msgq.compat", "msgq.viz")),
    ("program output", ("msgq.cli.output",)),
    ("programs", ("msgq.bench", "msgq.cflags")),
    ("command line", ("msgq.cli",)),
    # the end-to-end demo runs msgq's commands (msgq logstats) among its steps
    ("demo", ("msgq.demo",)),
    ("entry point", ("msgq.__main__",)),
]

UNIT_LAYER = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}

#: Why an import may sit inside a function, not at the top: the comment on its line or
#: right above starts with one of these. "optional extra": it loads a library of an extra
#: (pyspark, mcap, foxglove-sdk, a benchmark peer), directly or through the msgq module
#: it names; "start-up cost": it would slow the start of a program that does not need it;
#: "plugin": the module is loaded into other programs (pytest's plugin), which pay for
#: what it imports; "another msgq": the code runs where msgq may be another tree or
#: installation (bench.ab's --count run under the other side's tree, bench.upstream
#: under upstream's, __main__ before its check of a mixed installation). A library of
#: an extra itself is loaded with msgq.extras.require.
LOCAL_IMPORT_REASONS = ("optional extra", "start-up cost", "plugin", "another msgq")

#: At most this many function-local imports of msgq's own modules: the rest sit at the
#: top, where a reader (and this file's cycle check) sees them. The CLI imports a
#: command's module only when it runs, so command modules need none. (21: the lake
#: benchmark's build floor, a spark-extra module its runner imports when it runs; the
#: floor's own eleven local imports went to its top.)
MAX_LOCAL_MSGQ_IMPORTS = 21


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported msgq module
    path: Path
    line: int
    local: bool  # inside a function
    commented: bool  # a comment on its line or right above


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [FOLDERS[rel.parts[0]].split(".")] + [list(rel.parts[1:])]
    names = parts[0] + parts[1]
    names[-1] = names[-1].rsplit(".", 1)[0]
    if names[-1] == "__init__":
        names.pop()
    return ".".join(names)


def source_files() -> list[Path]:
    files = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".pyx") and "__pycache__" not in path.parts:
                files.append(path)
    return files


MODULES = {module_name(p): p for p in source_files()}


def unit_of(module: str) -> str | None:
    best = None
    for unit in UNIT_LAYER:
        if (module == unit or module.startswith(unit + ".")) and unit != "msgq":
            if best is None or len(unit) > len(best):
                best = unit
    if best is None and module == "msgq":
        return "msgq"
    return best


def resolve(module: str, name: str) -> str:
    """The msgq module an import names: ``from msgq import clock`` is msgq.clock when that
    is a module, else the package."""
    candidate = f"{module}.{name}"
    return candidate if candidate in MODULES else module


def _comment(lines: list[str], line: int) -> str | None:
    """The comment on the import's line, or right above it or above the run of imports
    it belongs to (one comment may give the reason for a few imports together)."""
    if "#" in lines[line - 1]:
        return lines[line - 1].split("#", 1)[1].strip()
    i = line - 2
    if i >= 0 and re.match(r"\s*except ImportError:\s*#", lines[i]):  # a try-import's fallback
        return lines[i].split("#", 1)[1].strip()
    while i >= 0 and re.match(r"\s*(import |from \S+ import )", lines[i]):
        i -= 1
    block: list[str] = []  # the comment lines right above, first line first
    while i >= 0 and lines[i].strip().startswith("#"):
        block.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(block) if block else None


def _commented(lines: list[str], line: int) -> bool:
    return _comment(lines, line) is not None


def _reason(lines: list[str], line: int) -> str | None:
    """The allowed reason the import's comment starts with (``# noqa: ...`` and the like
    skipped), or None."""
    comment = _comment(lines, line) or ""
    for part in comment.split("#"):
        for reason in LOCAL_IMPORT_REASONS:
            if part.strip().startswith(reason):
                return reason
    return None


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path) -> Iterator[Import]:
    source = module_name(path)
    text = path.read_text()
    lines = text.splitlines()
    package = source if path.name.startswith("__init__.") else source.rsplit(".", 1)[0]
    if path.suffix == ".pyx":
        for i, line in enumerate(lines, 1):
            m = re.match(r"\s*(?:from\s+([\w.]+)\s+import\s+([\w, ]+)|import\s+([\w.]+))", line)
            if m and "cimport" not in line:
                targets = ([resolve(m.group(1), n.strip()) for n in m.group(2).split(",")]
                           if m.group(1) else [m.group(3)])
                for target in targets:
                    if target.split(".")[0] == "msgq":
                        yield Import(source, target, path, i, line.startswith(" "),
                                     _commented(lines, i))
        return

    def visit(node: ast.AST, local: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "msgq":
                        yield Import(source, alias.name, path, child.lineno, local,
                                     _commented(lines, child.lineno))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                if module.split(".")[0] == "msgq":
                    for alias in child.names:
                        yield Import(source, resolve(module, alias.name), path, child.lineno,
                                     local, _commented(lines, child.lineno))
            yield from visit(child, inner)

    yield from visit(ast.parse(text), False)


ALL_IMPORTS = [imp for path in MODULES.values() for imp in imports_of(path)]


def _where(imp: Import) -> str:
    return f"{imp.path.relative_to(ROOT)}:{imp.line}"


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if unit_of(m) is None)
    assert not unplaced, f"place these modules in LAYERS of {__file__}: {unplaced}"
    assert len(MODULES) > 60  # the walk found the tree


def test_imports_point_down():
    wrong = []
    for imp in ALL_IMPORTS:
        if imp.target not in MODULES:
            wrong.append(f"{_where(imp)}: {imp.target} is not a module of msgq")
            continue
        src, dst = unit_of(imp.source), unit_of(imp.target)
        if src == dst:
            continue
        src_layer, dst_layer = UNIT_LAYER[src], UNIT_LAYER[dst]
        if dst_layer > src_layer:
            wrong.append(f"{_where(imp)}: {imp.source} ({LAYERS[src_layer][0]}) imports "
                         f"{imp.target} ({LAYERS[dst_layer][0]}), a higher layer")
        elif dst_layer == src_layer:
            wrong.append(f"{_where(imp)}: {imp.source} imports its peer {imp.target} "
                         f"(both {LAYERS[src_layer][0]})")
    assert not wrong, "\n".join(wrong)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def _parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_cycles():
    # Importing a submodule runs its parent packages first, but those edges are implicit:
    # the graph holds the imports the code writes, function-local ones included.
    edges: dict[str, set[str]] = {}
    for imp in ALL_IMPORTS:
        if imp.target != imp.source and imp.target not in _parents(imp.source):
            edges.setdefault(imp.source, set()).add(imp.target)
    assert _cycles(edges) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_few_function_local_imports_of_msgq_each_with_an_allowed_reason():
    local = sorted({(imp.path, imp.line) for imp in ALL_IMPORTS if imp.local})
    wrong = []
    for path, line in local:
        lines = path.read_text().splitlines()
        if _reason(lines, line) is None:
            wrong.append(f"{path.relative_to(ROOT)}:{line}: {lines[line - 1].strip()} "
                         f"(# {_comment(lines, line)})")
    assert not wrong, ("function-local imports of msgq without one of the reasons "
                       f"{LOCAL_IMPORT_REASONS}:\n" + "\n".join(wrong))
    where = "\n".join(f"{p.relative_to(ROOT)}:{n}" for p, n in local)
    assert len(local) <= MAX_LOCAL_MSGQ_IMPORTS, \
        f"{len(local)} function-local imports of msgq (move them to the top):\n{where}"


def test_the_reason_check_reads_the_comment():
    lines = ["def f():", "    # start-up cost: numpy", "    import numpy",
             "    import msgq.logs  # (the same)", "    import msgq.viz  # noqa: F401 # plugin"]
    assert [_reason(lines, n) for n in (3, 4, 5)] == ["start-up cost", None, "plugin"]


def test_function_local_imports_say_why():
    """A function-local import (of anything) is for an optional or expensive dependency,
    and a comment on its line or right above says which."""
    silent = []
    for path in MODULES.values():
        if path.suffix != ".py":
            continue
        lines = path.read_text().splitlines()

        def visit(node: ast.AST, local: bool, lines: list[str] = lines,
                  path: Path = path) -> None:
            for child in ast.iter_child_nodes(node):
                inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                if local and isinstance(child, (ast.Import, ast.ImportFrom)) and \
                        not _commented(lines, child.lineno):
                    silent.append(f"{path.relative_to(ROOT)}:{child.lineno}: "
                                  f"{lines[child.lineno - 1].strip()}")
                visit(child, inner)

        visit(ast.parse("\n".join(lines)), False)
    assert not silent, "function-local imports without a reason:\n" + "\n".join(silent)


@pytest.mark.parametrize("folder", sorted({p.parent for p in MODULES.values()
                                           if p.name == "__init__.py"}))
def test_every_folder_says_what_it_may_import(folder: Path):
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    assert "Layer:" in doc, f"{folder.relative_to(ROOT)}/__init__.py: no 'Layer:' paragraph"


def test_the_layout_picture_follows_the_layer_list():
    """docs/layout.md's picture lists the layers top down, in LAYERS' order, and each row
    names every unit of its layer (by its last name: ``zmq``, ``lockstep``), so
    the map a newcomer reads is the one this file checks."""
    text = (ROOT / "docs" / "layout.md").read_text()
    block = text.split("```\n", 2)[1]
    rows: list[tuple[str, str]] = []  # (layer, the text of its row and continuation lines)
    names = {name for name, _ in LAYERS}
    for line in block.splitlines()[1:]:
        if not line.strip():
            break  # the end of the layer table
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if line.startswith(" ") and not line.startswith("  ") and head[0] in names:
            rows.append((head[0], line))
        else:
            assert rows, f"docs/layout.md: a row before the first layer: {line!r}"
            rows[-1] = (rows[-1][0], rows[-1][1] + "\n" + line)
    assert [name for name, _ in rows] == [name for name, _ in reversed(LAYERS)]
    for (name, row), (_, units) in zip(rows, reversed(LAYERS), strict=True):
        for unit in units:
            last = "msgq" if unit == "msgq" else unit.rsplit(".", 1)[1]
            assert re.search(rf"(?<![\w.]){re.escape(last)}(?!\w)", row), \
                f"docs/layout.md: the {name} row does not name {unit}"


@pytest.mark.parametrize(("modules", "heavy"), [
    ("msgq, msgq.messaging", ("asyncio", "numpy", "importlib.metadata", "pyarrow", "zmq")),
    ("msgq.logs", ("asyncio", "tqdm", "importlib.metadata", "pyarrow", "zmq")),
])
def test_import_loads_no_heavy_module(modules: str, heavy: tuple[str, ...]):
    """Every process that uses msgq pays for ``import msgq`` (and a service for
    msgq.messaging; a log tool for msgq.logs): asyncio (about 25 ms), numpy, tqdm and
    importlib.metadata are imported only by what uses them (msgq.aio.running_loop,
    a replay's progress bar, msgq.version.installed_version)."""
    code = f"import sys, {modules}; print([m for m in {heavy!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
