"""Every registry entry is read by production code (issue 7, item 3).

An entry nothing reads is a setting an operator can change to no effect, and findings
computed from it are untrue. Read means: a production module (not the registry, not a test,
not a benchmark) names the key in quotes, or reads a family of keys by prefix
(`registry.get(f"capacity_demand.{name}")`) and names the rest of the key in quotes.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from zoomies_site.core import registry

ROOT = Path(__file__).resolve().parents[2]
NOT_PRODUCTION = ("tests/", "bench/", "scripts/", "zoomies_site/core/registry/")


def production_sources() -> dict[str, str]:
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {f: (ROOT / f).read_text() for f in files if not f.startswith(NOT_PRODUCTION)}


SOURCES = production_sources()


def readers(key: str, sources: dict[str, str]) -> list[str]:
    prefix, _, rest = key.rpartition(".")
    quoted = re.compile(rf"""["']{re.escape(key)}["']""")
    by_prefix = re.compile(rf"""f["']{re.escape(prefix)}\.\{{""")
    suffix = re.compile(rf"""["']{re.escape(rest)}["']""")
    return [
        path
        for path, text in sources.items()
        if quoted.search(text) or (by_prefix.search(text) and suffix.search(text))
    ]


@pytest.mark.parametrize("key", registry.KEYS)
def test_every_registry_entry_is_read_by_production_code(key):
    assert readers(key, SOURCES), f"{key} is read by no production module"


def test_the_check_tells_a_read_from_a_mention():
    sources = {
        "a.py": 'timeout = registry.get("scheduler.provision_timeout")',
        "b.py": 'get = lambda n: registry.get(f"capacity_demand.{n}")\nget("cooldown")',
        "c.py": "# scheduler.idle_timeout is mentioned in a comment only",
    }
    assert readers("scheduler.provision_timeout", sources) == ["a.py"]
    assert readers("capacity_demand.cooldown", sources) == ["b.py"]
    assert readers("scheduler.idle_timeout", sources) == []
