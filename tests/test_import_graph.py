"""The package's import structure: no module of ldpbench imports a module that imports it back, and
the mechanisms import nothing from the engine (ldpbench.fl).

At import time such a cycle works only while the modules happen to be imported in one order; an
import deferred into a function avoids that failure but still ties together modules that should be
readable and testable one at a time.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Callable, Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ldpbench"
Imports = Callable[[ast.AST], Iterator[ast.Import | ast.ImportFrom]]  # which import statements of a module count


def module_names(package: Path) -> dict[str, Path]:
    """Dotted name → file of every module under `package` (a package's own name for its __init__.py)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def executed_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements run when the module is imported: at its top level, in class bodies and in
    `if`/`try`/`with` blocks there; not inside functions (run only when called) nor under
    `if TYPE_CHECKING:` (never run)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    elif isinstance(node, ast.If) and _is_type_checking(node.test):
        for statement in node.orelse:
            yield from executed_imports(statement)
    elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        for child in ast.iter_child_nodes(node):
            yield from executed_imports(child)


def every_import(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of the module, inside functions and under `if TYPE_CHECKING:` too."""
    yield from (child for child in ast.walk(node) if isinstance(child, (ast.Import, ast.ImportFrom)))


def imported_modules(name: str, path: Path, modules: dict[str, Path], imports: Imports = executed_imports) -> set[str]:
    """The modules of `modules` that module `name` imports (by the statements `imports` counts).

    `import a.b` and `from a.b import c` count as importing `a.b`, or `a.b.c` where `c` is a submodule
    (`from ldpbench import campaign`); relative imports are resolved. The parent packages Python
    initialises first are not counted: a package's __init__ importing its own submodules would always
    close a cycle with them, and Python handles that one (the package is in sys.modules by then).
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for statement in imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(statement, ast.Import):
            found.update(alias.name for alias in statement.names)
            continue
        base = statement.module or ""
        if statement.level:
            anchor = package.split(".")[:len(package.split(".")) - statement.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in statement.names)
    return found & modules.keys()


def import_graph(package: Path, imports: Imports = executed_imports) -> dict[str, set[str]]:
    """Module → the package's modules it imports (by the statements `imports` counts; by default those
    run at import time)."""
    modules = module_names(package)
    return {name: imported_modules(name, path, modules, imports) for name, path in modules.items()}


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a] (a imports b ... imports a), or None when it has none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(reversed(error.args[1]))
    return None


def test_the_package_has_no_import_cycle():
    """Counts only the imports executed at import time (module top level, class bodies, not under
    `if TYPE_CHECKING:`); an import inside a function runs when it is called and closes no cycle here."""
    cycle = import_cycle(import_graph(PACKAGE))
    assert cycle is None, "import cycle at import time: " + " → ".join(cycle)


def test_no_module_imports_a_module_that_imports_it_even_inside_a_function():
    """Counts every import statement, those inside functions and under `if TYPE_CHECKING:` included: a
    deferred import keeps the cycle out of import time, not out of the design (e.g. the worker runs a
    job's command with the CLI's main, handed to it by the CLI, rather than importing the CLI)."""
    cycle = import_cycle(import_graph(PACKAGE, every_import))
    assert cycle is None, "import cycle (counting imports inside functions): " + " → ".join(cycle)


# Packages that must not import another of the package's packages, counting every import statement:
# a mechanism needs numbers (how often a client reports), never the engine that trains with it.
FORBIDDEN_IMPORTS = {"ldpbench.mechanisms": "ldpbench.fl"}


def forbidden_imports(graph: dict[str, set[str]], forbidden: dict[str, str]) -> list[str]:
    """'importer → imported' for every module of a package in `forbidden` that imports a module of the
    package it maps to."""
    def within(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return sorted(f"{importer} → {imported}" for importer, imports in graph.items() for imported in imports
                  for package, banned in forbidden.items() if within(importer, package) and within(imported, banned))


def test_the_mechanisms_import_nothing_from_the_engine():
    found = forbidden_imports(import_graph(PACKAGE, every_import), FORBIDDEN_IMPORTS)
    assert not found, "the mechanisms import the engine: " + ", ".join(found)


def test_a_forbidden_import_is_found_in_a_function_and_under_type_checking(tmp_path):
    package = tmp_path / "pkg"
    for folder in ("low", "high"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("", encoding="utf-8")
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "high" / "settings.py").write_text("", encoding="utf-8")
    (package / "low" / "plain.py").write_text("from pkg.low import other\n", encoding="utf-8")
    (package / "low" / "other.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                              "    from pkg.high.settings import Settings\n", encoding="utf-8")
    (package / "low" / "late.py").write_text("def later():\n    from ..high import settings\n", encoding="utf-8")

    found = forbidden_imports(import_graph(package, every_import), {"pkg.low": "pkg.high"})

    assert found == ["pkg.low.late → pkg.high.settings", "pkg.low.other → pkg.high.settings"]


def test_the_graph_sees_top_level_relative_and_submodule_imports_and_names_a_cycle(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nimport pkg.b\nif TYPE_CHECKING:\n    from pkg import d\n"
                "def later():\n    from pkg import d\n",
        "b.py": "try:\n    from .sub import c\nexcept ImportError:\n    pass\n",
        "d.py": "from pkg.a import later\n",
        "sub/__init__.py": "from . import c\n",
        "sub/c.py": "from ..b import something\nclass C:\n    from pkg import a\n",
    }
    for name, text in files.items():
        (package / name).write_text(text, encoding="utf-8")

    graph = import_graph(package)

    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"}, "pkg.d": {"pkg.a"},
                     "pkg.sub": {"pkg.sub.c"}, "pkg.sub.c": {"pkg.b", "pkg.a"}}
    cycle = import_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"pkg.a", "pkg.b", "pkg.sub.c"}
    assert all(after in graph[before] for before, after in zip(cycle, cycle[1:]))
    del graph["pkg.sub.c"]
    assert import_cycle(graph) is None
    assert import_graph(package, every_import)["pkg.a"] == {"pkg.b", "pkg.d"}
