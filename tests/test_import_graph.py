"""The package's shape: its modules import each other without a cycle, the root holds a handful of modules (the rest
live in folders that say what they are), and the command line stays small.

The graph is read from the source (ast), so it counts every import a module can make: at its top, inside a function
(a lazy import hides a cycle from Python, not from the reader) and under `TYPE_CHECKING`, and the package `__init__`
modules each import runs on its way (`from orchestrator.steps import audit` runs orchestrator/steps/__init__.py
first). A cycle fails the test with the modules that form it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "orchestrator"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its `__init__.py`)."""
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `module` imports, wherever in the file the import is."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node, path.name == "__init__.py")
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known:
                    found.add(submodule)  # `from orchestrator import report`: the module itself
                elif source in known:
                    found.add(source)
    # Importing a module runs the `__init__` of every package above it first: an edge to each of them too (not to
    # the importing module's own packages, which run before it whatever it imports).
    own = _ancestors(module) | {module}
    for imported in list(found):
        found.update(package for package in _ancestors(imported) if package in known and package not in own)
    found.discard(module)
    return found


def _ancestors(module: str) -> set[str]:
    """The packages above `module` ('a.b.c' → {'a', 'a.b'})."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {module: imports_of(module, path, known) for module, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50, "the graph reads the package's modules"
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(cycle) for cycle in found)


def test_the_graph_sees_lazy_type_checking_and_package_init_imports(tmp_path: Path) -> None:
    # The check is only as good as its reading: a cycle closed by an import inside a function, or one under
    # TYPE_CHECKING, or by a relative import, or through a package's __init__, is a cycle.
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from orchestrator import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from orchestrator.a import f\n"
    )
    (package / "sub" / "c.py").write_text("from . import d\n")
    (package / "sub" / "d.py").write_text("from .c import x\n")
    (package / "e.py").write_text("import orchestrator.a\n")
    # A package's __init__ runs before any of its modules: `f` importing `pkg.g` imports `pkg`, whose __init__
    # imports `f` back. A package's __init__ importing its own modules is no cycle (`own`).
    (package / "pkg").mkdir()
    (package / "pkg" / "__init__.py").write_text("from orchestrator import f\n")
    (package / "pkg" / "g.py").write_text("X = 1\n")
    (package / "f.py").write_text("from orchestrator.pkg import g\n")
    (package / "own").mkdir()
    (package / "own" / "__init__.py").write_text("from orchestrator.own import h\n")
    (package / "own" / "h.py").write_text("import orchestrator.pkg.g\n")
    found = cycles(import_graph(package))
    assert found == [
        ["orchestrator.a", "orchestrator.b"],
        ["orchestrator.f", "orchestrator.pkg"],
        ["orchestrator.sub.c", "orchestrator.sub.d"],
    ]


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_cycles_finds_a_long_cycle_and_no_false_one(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


# Each database driver is imported only by its engine and the SQL behind it (and by the lab, which sets servers up):
# the steps, services and runs speak the Database and Replication protocols (orchestrator/database/protocol.py).
DRIVERS = {
    "pymysql": ("orchestrator.database.mariadb", "orchestrator.database.mysql"),
    "psycopg": ("orchestrator.database.postgresql", "orchestrator.database.pg"),
}
LAB = "migrate_lab"


def importers_of(packages: set[str], root: Path = ROOT) -> dict[str, set[str]]:
    """The modules importing each of `packages` (top-level names), wherever in the file the import is."""
    found: dict[str, set[str]] = {package: set() for package in packages}
    for module, path in module_files(root).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top in found:
                    found[top].add(module)
    return found


def driver_importers(root: Path = ROOT) -> dict[str, set[str]]:
    return importers_of(set(DRIVERS), root)


def _within(module: str, owners: tuple[str, ...]) -> bool:
    return any(module == owner or module.startswith(owner + ".") for owner in owners)


def test_each_database_driver_is_imported_only_behind_its_engine() -> None:
    found = driver_importers()
    assert found["pymysql"] and found["psycopg"], "the check reads the engines' imports"
    strays = sorted(
        f"{module} imports {driver}"
        for driver, modules in found.items()
        for module in modules
        if not _within(module, (*DRIVERS[driver], LAB))
    )
    assert strays == []


def test_the_command_line_module_stays_small() -> None:
    # cli/commands.py parses arguments and hands them on; drawing and shared helpers live in cli/render.py and
    # cli/support.py.
    lines = (ROOT / "cli" / "commands.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"orchestrator/cli/commands.py has {lines} lines"


# The run's shared core (contracts, runtime, results, window) and the neutral pieces everything uses (exit_codes,
# redaction, secrets, retry) live at the root; everything else has a folder (docs/ARCHITECTURE.md).
ROOT_MODULES_AT_MOST = 10


def root_modules(root: Path = ROOT) -> list[str]:
    return sorted(path.name for path in root.glob("*.py"))


def test_the_root_holds_a_handful_of_modules() -> None:
    found = root_modules()
    assert "__init__.py" in found, "the count reads the package's root"
    assert len(found) <= ROOT_MODULES_AT_MOST, (
        f"orchestrator/ holds {len(found)} modules ({', '.join(found)}): give the new one a folder"
    )


def test_every_folder_of_the_package_is_a_package() -> None:
    # A folder without __init__.py would still import (a namespace package) but hide from setuptools' find and from
    # this graph's reading of `from orchestrator.x import y`.
    folders = [p for p in ROOT.rglob("*") if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))]
    missing = sorted(str(p.relative_to(ROOT.parent)) for p in folders if not (p / "__init__.py").exists())
    assert missing == []


# The lab is a distribution of its own (lab/): the product imports it in one place only, where `migrate lab` is
# mounted when it is installed, so `pip install migrate` runs without it.
LAB_MOUNT = "orchestrator.cli.root"


def test_the_product_imports_the_lab_only_where_it_is_mounted() -> None:
    assert importers_of({LAB})[LAB] == {LAB_MOUNT}
