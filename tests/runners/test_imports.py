"""The import graph: no file-level import circle, and no function-level project import
without a comment saying why (issue: one place writes runners and jobs).

Read from the syntax trees, so nothing is imported to check it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("accounts", "fleet", "runners", "zoomies_site", "capacity")


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    modules: dict[str, Path] = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if "migrations" in rel.parts:
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, module: str, modules: dict) -> list[str]:
    """The project modules an import statement loads (a submodule when it names one)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")
            is_package = modules[module].name == "__init__.py"
            package = package[: len(package) - node.level + (1 if is_package else 0)]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    found = []
    for name in names:
        # `import a.b.c` loads a.b.c; the nearest project module that exists is the target.
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name.split(".")[0] in PACKAGES:
            found.append(name)
    return found


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                pending += handler.body
        elif isinstance(node, ast.With):
            pending += node.body
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        edges = set()
        for node in _module_level_imports(tree):
            edges.update(_targets(node, module, modules))
        # A package's submodule importing its own package (`from runners.actions import
        # steps` inside runners/actions/) runs no code twice: the package is already
        # importing. Only edges into other modules count.
        edges.discard(module)
        graph[module] = {
            t
            for t in edges
            if not (module.startswith(t + ".") and modules[t].name == "__init__.py")
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
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
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_file_level_import_circle_between_project_modules():
    graph = import_graph()
    assert "runners.reconcile" in graph and graph["runners.reconcile"]  # the graph is real
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def imports_in_functions(
    source: str, module: str, modules: dict[str, Path], rel: str
) -> list[tuple[str, int, str, bool]]:
    """(path, line, module, has a comment) for every project import inside a function."""
    lines = source.splitlines()
    found = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            line = lines[node.lineno - 1]
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            # Ruff's bare noqa pragma is no reason: the line must say why too.
            said = re.sub(r"#\s*noqa:[\sA-Z0-9,]*", "", line)
            commented = "#" in said or above.startswith("#")
            for target in _targets(node, module, modules):
                found.append((rel, node.lineno, target, commented))
    return found


def function_level_imports() -> list[tuple[str, int, str, bool]]:
    modules = module_files()
    found = []
    for module, path in modules.items():
        rel = path.relative_to(ROOT).as_posix()
        found += imports_in_functions(path.read_text(), module, modules, rel)
    return found


def test_a_function_level_import_without_a_reason_is_found():
    modules = module_files()
    source = (
        "def f():\n"
        "    from runners.models import Runner\n"
        "    # why: the registry is imported by the settings module\n"
        "    from zoomies_site.core import registry\n"
        "    import json\n"
    )
    found = imports_in_functions(source, "runners.x", modules, "runners/x.py")
    assert found == [
        ("runners/x.py", 2, "runners.models", False),
        ("runners/x.py", 4, "zoomies_site.core.registry", True),
    ]


def test_a_function_level_project_import_says_why():
    """A one-line comment on the import or just above it, everywhere: no allow-list."""
    imports = function_level_imports()
    silent = sorted(
        f"{path}:{line}: {target}" for path, line, target, commented in imports if not commented
    )
    assert silent == []
