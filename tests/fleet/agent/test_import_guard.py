"""ARCH-05: the agent is installable on a host alone; it imports no model and no other app."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fleet.agent

AGENT_DIR = Path(fleet.agent.__file__).parent
FORBIDDEN = ("django", "rest_framework", "runners", "capacity", "accounts", "zoomies_site")


def imported_modules(path: Path) -> list[str]:
    """Absolute names of everything a module imports, relative imports resolved."""
    package = ".".join(path.relative_to(AGENT_DIR.parent.parent).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names.append(module)
            names.extend(f"{module}.{alias.name}" for alias in node.names)
    return names


def offending(name: str) -> bool:
    top = name.split(".")[0]
    if top in FORBIDDEN:
        return True
    # Within fleet, only the agent itself and the protocol it shares with the controller
    # (pure by its own guard below): fleet.models and friends need Django.
    if name in ("fleet", "fleet.protocol") or name.startswith("fleet.protocol."):
        return False
    return top == "fleet" and not name.startswith("fleet.agent")


def test_arch05_the_agent_imports_no_django_and_no_other_app():
    modules = sorted(AGENT_DIR.rglob("*.py"))
    assert len(modules) >= 8
    bad = {
        str(path.relative_to(AGENT_DIR)): name
        for path in modules
        for name in imported_modules(path)
        if offending(name)
    }
    assert bad == {}


def test_arch05_the_protocol_package_imports_nothing_of_the_controller():
    """fleet/protocol/ ships with the agent: the standard library and its own modules."""
    modules = sorted((AGENT_DIR.parent / "protocol").glob("*.py"))
    assert len(modules) >= 5
    for path in modules:
        names = [n for n in imported_modules(path) if not n.startswith("fleet.protocol")]
        assert names, path
        assert not [n for n in names if n.split(".")[0] in (*FORBIDDEN, "fleet", "httpx")], path


def test_arch05_the_guard_would_notice():
    assert offending("django.db.models")
    assert offending("fleet.models.Host")
    assert offending("runners.states")
    assert not offending("fleet.agent.client")
    assert not offending("fleet.protocol")
    assert offending("fleet.actions")
    assert not offending("httpx")


def test_arch05_importing_the_agent_loads_no_django():
    code = (
        "import sys, fleet.agent.cli, fleet.agent.backends.process_shim; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'runners', 'capacity', "
        "'accounts', 'zoomies_site')]; print(bad); sys.exit(1 if bad else 0)"
    )
    root = AGENT_DIR.parent.parent
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
