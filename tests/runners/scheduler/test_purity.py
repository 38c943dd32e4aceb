"""SCHED-01: the scheduler (and the naming module it uses) is pure.

Every module in runners/scheduler/ is parsed with `ast`: an import outside the allow-list
or a call that reads a clock fails the test. The guard is itself tested on bad source, so
a guard that silently stopped finding anything would fail too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.purity import impurities_in

ROOT = Path(__file__).resolve().parents[3]
SCHEDULER_DIR = ROOT / "runners" / "scheduler"
NAMING = ROOT / "runners" / "naming.py"

# Standard-library modules with no I/O, no clock and no randomness. `datetime` is here for
# its types and arithmetic; reading its clock is caught by CLOCK_CALLS below.
PURE_STDLIB = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections",
        "collections.abc",
        "dataclasses",
        "datetime",
        "enum",
        "fractions",
        "functools",
        "heapq",
        "itertools",
        "math",
        "operator",
        "re",
        "typing",
    }
)
# What the scheduler may import of ours: itself, and the pure naming module.
OURS_ALLOWED = frozenset({"runners.naming"})


def violations(source: str, filename: str, own_package: str | None) -> list[str]:
    """Every forbidden import or clock call in `source`, as "file: what" (tests/purity.py)."""
    return impurities_in(source, filename, PURE_STDLIB | OURS_ALLOWED, own_package=own_package)


def _modules() -> list[tuple[Path, str | None]]:
    files = [(path, "runners.scheduler") for path in sorted(SCHEDULER_DIR.rglob("*.py"))]
    return [*files, (NAMING, None)]


def test_sched01_the_guard_sees_every_module() -> None:
    names = {path.name for path, _ in _modules()}
    assert {"__init__.py", "decide.py", "model.py", "naming.py"} <= names


@pytest.mark.parametrize("path,package", _modules(), ids=[p.name for p, _ in _modules()])
def test_sched01_scheduler_modules_import_only_pure_modules(
    path: Path, package: str | None
) -> None:
    assert violations(path.read_text(), str(path.relative_to(ROOT)), package) == []


@pytest.mark.parametrize(
    "source",
    [
        "import django",
        "from django.db import models",
        "from runners.models import Runner",
        "import time",
        "import random",
        "import os",
        "from datetime import datetime\nx = datetime.now()",
        "import datetime\nx = datetime.datetime.utcnow()",
        "from datetime import date\nx = date.today()",
        "from time import monotonic\nx = monotonic()",
        "x = time.time()",
        "x = __import__('socket')",
        "from .. import models",
    ],
)
def test_sched01_the_guard_catches_impure_code(source: str) -> None:
    assert violations(source, "bad.py", "runners.scheduler"), source


def test_sched01_importing_the_scheduler_loads_no_django() -> None:
    """The import graph at run time, not just the source: nothing of Django is loaded."""
    code = (
        "import sys, runners.scheduler\n"
        "print('\\n'.join(sorted(m for m in sys.modules "
        "if m.split('.')[0] in {'django', 'runners', 'fleet', 'accounts', 'capacity', "
        "'zoomies_site', 'random', 'socket', 'sqlite3'})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = set(result.stdout.split())
    assert not {m for m in loaded if not m.startswith(("runners.scheduler", "runners.naming"))} - {
        "runners"
    }, loaded
