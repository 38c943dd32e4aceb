"""The PostgreSQL databases a test run makes, and how none outlives it (issue 8 item 15).

A run makes two kinds: pytest-django's test database, `test_zoomies_<owner>` (plus `_gwN`
per xdist worker, tests/conftest.py names it), and each end-to-end controller's own,
`zoomies_e2e_<owner>_<random>` (tests/e2e/harness.py). `<owner>` says which process made
it: `<host>_<pid>_<start>`, where `<host>` is a hash of this kernel's boot id and this pid
namespace (the space the pid means something in) and `<start>` is that process's start
time in clock ticks since boot, so a pid the kernel has since handed to another process is
not mistaken for the run that made the database.

Every e2e database this process makes is kept in `CREATED` and dropped when the session
ends (tests/conftest.py's `pytest_sessionfinish`, on every xdist worker) or the process
exits. A killed run drops nothing; the next run on this host drops its databases at its
start (`drop_stale`). A database whose owner is on another host (another machine or
container sharing the server), or is alive, or whose name carries no owner, is never
touched: its run may still be using it.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import secrets
from pathlib import Path

import psycopg

E2E_PREFIX = "zoomies_e2e"
TEST_PREFIX = "test_zoomies"

# <prefix>_<host>_<pid>_<start>, then anything (the random part, pytest-django's _gwN).
OWNED = re.compile(rf"^(?:{E2E_PREFIX}|{TEST_PREFIX})_([0-9a-f]{{8}})_(\d+)_(\d+)(?:_|$)")

# The e2e databases this process made and has not dropped yet.
CREATED: list[str] = []


def _host() -> str:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    namespace = os.stat("/proc/self/ns/pid").st_ino
    return hashlib.sha256(f"{boot}:{namespace}".encode()).hexdigest()[:8]


HOST = _host()


def started(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2, in parentheses) may itself hold spaces.
    return int(stat.rpartition(")")[2].split()[19])


def owner(pid: int | None = None) -> str:
    pid = pid or os.getpid()
    return f"{HOST}_{pid}_{started(pid)}"


def new_name(prefix: str = E2E_PREFIX) -> str:
    """A name of this process's own; a random part keeps its many databases apart."""
    return f"{prefix}_{owner()}_{secrets.token_hex(4)}"


def run_database_name() -> str:
    """pytest-django's test database for this process (it adds `_gwN` on xdist workers)."""
    return f"{TEST_PREFIX}_{owner()}"


def is_stale(name: str) -> bool:
    """Whether `name` is a database of a dead process on this host (never of another)."""
    match = OWNED.match(name)
    if not match or match[1] != HOST:
        return False
    return started(int(match[2])) != int(match[3])


def with_database(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


def create(url: str) -> str:
    """Create a database of this process's own on `url`'s server; returns its URL."""
    name = new_name()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    if not CREATED:
        atexit.register(drop_created, url)  # scripts and benchmarks end without a session
    CREATED.append(name)
    return with_database(url, name)


def _drop(conn: psycopg.Connection, name: str) -> None:
    # FORCE ends the connections a killed controller's children may have left open.
    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def drop(url: str, name: str) -> None:
    """Drop one database this process made (a test is done with its controller); a name it
    did not make is left alone."""
    if name not in CREATED:
        return
    with psycopg.connect(url, autocommit=True) as conn:
        _drop(conn, name)
    CREATED.remove(name)


def drop_created(url: str) -> list[str]:
    """Drop every database this process made and still has."""
    if not CREATED:
        return []
    dropped = []
    with psycopg.connect(url, autocommit=True) as conn:
        while CREATED:
            name = CREATED.pop()
            _drop(conn, name)
            dropped.append(name)
    return dropped


def drop_own_test_database(url: str, worker: str | None) -> None:
    """Drop this process's pytest-django test database if it is still there: its own drop
    fails when a child that wrote it has exited but its server session has not yet ended
    ("is being accessed by other users"), and it was then left on the shared server."""
    with psycopg.connect(url, autocommit=True) as conn:
        _drop(conn, run_database_name() + (f"_{worker}" if worker else ""))


def drop_stale(url: str) -> list[str]:
    """Drop the databases of runs on this host whose process is gone (a killed run)."""
    dropped = []
    with psycopg.connect(url, autocommit=True) as conn:
        names = [row[0] for row in conn.execute("SELECT datname FROM pg_database")]
        for name in filter(is_stale, names):
            try:
                _drop(conn, name)
            except psycopg.Error:
                continue  # another run's start got to it first, or is dropping it now
            dropped.append(name)
    return dropped
