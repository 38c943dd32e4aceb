"""The ground floor (`zoomies_site.core`) imports no app above it (issue 7, item 4).

Read from the source, not the module cache: an import inside a function counts too.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import grimp

import zoomies_site.core

CORE = Path(zoomies_site.core.__file__).parent
ROOT = CORE.parents[1]
PROJECT_PACKAGES = {"accounts", "capacity", "fleet", "runners", "zoomies_site"}
# What the ground floor may stand on: itself alone (its models, the event outbox, metrics,
# API helpers and the sealing primitive live on it since issue 22).
ALLOWED = ("zoomies_site.core",)


def project_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in PROJECT_PACKAGES)
    return found


def test_the_ground_floor_imports_no_app_above_it():
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 5, "the registry, findings, leases and controller lock are here"
    above = {
        f"{path.relative_to(CORE)}: {name}"
        for path in files
        for name in project_imports(path)
        if not name.startswith(ALLOWED)
    }
    assert above == set()


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from runners.models import Pool\n")
    assert project_imports(bad) == {"runners.models.Pool"}


def test_no_file_of_the_registry_is_over_700_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (CORE / "registry").glob("*.py")}
    assert max(sizes.values()) <= 700, sizes


def test_every_production_file_over_700_lines_is_explained_in_the_readme_layout():
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    long = [
        f
        for f in files
        if not f.startswith("tests/") and len((ROOT / f).read_text().splitlines()) > 700
    ]
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    assert [f for f in long if f"`{f}` (about" not in layout] == []


def test_the_roof_contract_names_every_module_of_the_roof():
    """The import contract forbids the roof's modules one by one (import-linter cannot say
    "zoomies_site but its core"): a new roof module missing from the list would be
    importable from below unnoticed."""
    import tomllib  # noqa: PLC0415  # only this test reads pyproject.toml

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (roof,) = [c for c in config["contracts"] if c["id"] == "roof"]
    assert set(roof["forbidden_modules"]) == modules_of("zoomies_site") - {"zoomies_site.core"}


def test_the_agent_contract_names_every_fleet_module_but_the_agent_and_the_protocol():
    """The agent is a program of its own (ARCH-06): of fleet it may import only itself and
    fleet.protocol. A fleet module missing from the contract's list would be importable from
    the agent unnoticed (the list had missed ten before this test)."""
    import tomllib  # noqa: PLC0415  # only this test reads pyproject.toml

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (agent,) = [c for c in config["contracts"] if c["id"] == "agent"]
    forbidden = {m for m in agent["forbidden_modules"] if m.startswith("fleet.")}
    assert forbidden == modules_of("fleet") - {"fleet.agent", "fleet.protocol"}


def modules_of(package: str) -> set[str]:
    """A package's direct modules and subpackages, by dotted name."""
    return {
        f"{package}.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / package).iterdir()
        if (p.suffix == ".py" and p.stem != "__init__")
        or (p.is_dir() and (p / "__init__.py").exists())
    }


def import_circles() -> set[tuple[str, str]]:
    """Each pair of production modules that reach each other by imports, type-only and
    in-function imports included (grimp, import-linter's own graph)."""
    graph = grimp.build_graph(*sorted(PROJECT_PACKAGES), include_external_packages=False)
    circles = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.find_shortest_chain(importer=imported, imported=module):
                circles.add(tuple(sorted((module, imported))))
    return circles


def test_issue22_no_production_module_reaches_itself_through_its_imports():
    """`runners.github.client` <-> `installation` and `runners.reconcile` <-> `registrations`
    were circles; the types moved to `runners.github.calls` and a Protocol, and the target
    to `registrations`. The fake GitHub's core, server and handler mixins were one too
    (issue 22 item 5); its sections are now plain modules over one state object."""
    assert import_circles() == set()
