"""No process started by a test run outlives it (issue 21 item 1).

The run's first process names the run in its environment (`SESSION_ENV`); every process a
test starts inherits it, controllers and the processes they fork included, unless a test
builds an environment from nothing. When the run ends, whatever still carries the name is a
process some test left behind: the run fails, naming each, and kills them, so the next run
(and the machine) does not pay for them.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

SESSION_ENV = "ZOOMIES_TEST_RUN"
# Forked children that are stopping when the run ends (a controller's last test teardown)
# get this long to finish before they count as left behind; a test of this check sets less.
GRACE_SECONDS = float(os.environ.get("ZOOMIES_TEST_LEFTOVER_GRACE", "15"))


def name_this_run() -> str:
    """Called once per run, in the process that starts the others (not in xdist workers,
    which inherit it). A nested run of pytest names its own."""
    os.environ[SESSION_ENV] = uuid.uuid4().hex
    return os.environ[SESSION_ENV]


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def carrying(run: str) -> dict[int, str]:
    """Live processes (zombies are dead) started with this run's name, but this process and
    its ancestors: pid -> command line."""
    needle = f"{SESSION_ENV}={run}\0".encode()
    mine = _ancestors()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if state not in ("Z", "X"):
            found[int(entry.name)] = f"[{comm}] {cmdline.strip()}"[:300]
    return found


def left_behind(run: str, grace: float = GRACE_SECONDS) -> dict[int, str]:
    """What still runs once `grace` has passed; each is killed before this returns."""
    deadline = time.monotonic() + grace
    while (found := carrying(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found


# -- as a pytest plugin (tests/conftest.py registers it; `-p tests.leftovers` elsewhere) ----


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the run's first process; workers inherit it
        name_this_run()


@pytest.hookimpl(trylast=True)  # after the other teardown hooks have stopped what they own
def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # a worker: the others may still be running
        return
    found = left_behind(os.environ[SESSION_ENV])
    if found:
        lines = "\n".join(f"  {pid}: {what}" for pid, what in sorted(found.items()))
        print(f"\nprocesses left behind by this run (now killed):\n{lines}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
