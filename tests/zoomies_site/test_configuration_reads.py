"""Configuration is read through one door (issue 7, item 3).

Operator settings come from the registry, Django's process settings from `settings.py`, and
both read the environment through `zoomies_site.core.environment`. A production module that
reads a variable itself is a setting the Settings page cannot show.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READS = re.compile(r"os\.environ\.get\(|os\.environ\[|os\.getenv\(|\benviron\.get\(")
# Programs of their own. (The sealing key never passes through the registry, but it too is
# read through the door: zoomies_site.core.sealing calls environment.lookup.)
OWN_PROGRAMS = (
    "zoomies_site/core/environment.py",  # the door itself
    "fleet/agent/",  # the agent runs on other hosts, configured by its command line
    "runners/github/fake/",  # the fake GitHub and fake runner, test doubles run as programs
)


def production_modules() -> list[str]:
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [f for f in files if not f.startswith(("tests/", "bench/", "scripts/"))]


def test_no_production_module_reads_the_environment_itself():
    readers = [
        f"{path}:{number}"
        for path in production_modules()
        if not path.startswith(OWN_PROGRAMS)
        for number, line in enumerate((ROOT / path).read_text().splitlines(), 1)
        if READS.search(line)
    ]
    assert readers == []


def test_the_pattern_finds_a_direct_read():
    assert READS.search('root = os.environ.get("ZOOMIES_ACTIONS_RUNNER_DIR", "/opt")')
    assert READS.search('os.environ["ZOOMIES_DB"]')
    assert not READS.search("env=os.environ.copy(),")
