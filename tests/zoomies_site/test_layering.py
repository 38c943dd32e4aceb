"""The ground floor (`zoomies_site.core`) imports no app above it (issue 7, item 4).

Read from the source, not the module cache: an import inside a function counts too.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import zoomies_site.core

CORE = Path(zoomies_site.core.__file__).parent
ROOT = CORE.parents[1]
PROJECT_PACKAGES = {"accounts", "capacity", "fleet", "runners", "zoomies_site"}
# What the ground floor may stand on: itself, its own models, and the sealing primitive
# (AES-GCM over a key, which imports nothing of the project but this floor's environment).
ALLOWED = ("zoomies_site.core", "zoomies_site.models", "accounts.sealing")


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
