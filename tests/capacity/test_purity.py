"""CAP-03: the capacity planner and the event wire format are pure.

The modules are parsed with `ast`: an import outside the allow-list, or a call that reads a
clock, fails. The guard is tested on bad source too, and the run-time import graph is
checked in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.purity import impurities_in

ROOT = Path(__file__).resolve().parents[2]
PURE_MODULES = ("capacity/planner.py", "capacity/events.py")
ALLOWED = frozenset(
    {
        "__future__",
        "collections",
        "collections.abc",
        "dataclasses",
        "datetime",
        "typing",
        "math",
        # events.py: hashing and JSON are computation, not I/O.
        "hashlib",
        "hmac",
        "json",
        # The scheduler is held pure by its own guard (SCHED-01).
        "runners.naming",
        "runners.scheduler",
        "runners.scheduler.matching",
        "runners.scheduler.model",
        "runners.scheduler.resources",
        "capacity.planner",
    }
)


def violations(source: str, filename: str) -> list[str]:
    return impurities_in(source, filename, ALLOWED)


@pytest.mark.parametrize("module", PURE_MODULES)
def test_cap03_planner_modules_import_nothing_impure(module: str) -> None:
    path = ROOT / module
    assert violations(path.read_text(), module) == []


@pytest.mark.parametrize(
    "source",
    [
        "import django",
        "from django.db import transaction",
        "from capacity.models import Attempt",
        "from fleet.models import Host",
        "import random",
        "import secrets",
        "import socket",
        "import urllib.request",
        "from datetime import datetime\nx = datetime.now()",
        "from django.utils import timezone\nx = timezone.now()",
        "import time\nx = time.time()",
        "x = __import__('os')",
        "from . import models",
    ],
)
def test_cap03_the_guard_catches_impure_code(source: str) -> None:
    assert violations(source, "bad.py"), source


def test_cap03_importing_the_planner_loads_no_django_and_no_network() -> None:
    code = (
        "import sys, capacity.planner, capacity.events\n"
        "print('\\n'.join(sorted(m for m in sys.modules "
        "if m.split('.')[0] in {'django', 'fleet', 'accounts', 'zoomies_site', 'socket', "
        "'random', 'secrets', 'sqlite3', 'urllib', 'http'} or m.startswith('capacity.'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = set(result.stdout.split())
    assert loaded <= {"capacity.planner", "capacity.events"}, loaded
