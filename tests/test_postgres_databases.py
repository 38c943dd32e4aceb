"""Issue 8 item 15: every PostgreSQL database a test run makes is gone after it, two runs
never share a name, and what a killed run left is dropped by the next run on this host,
never a live run's or another host's (tests/postgres_databases.py).

Against the real server the suite's PostgreSQL pass uses, whichever pass runs this."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests import postgres_databases
from tests.e2e.harness import ROOT

SERVER = os.environ.get("ZOOMIES_DATABASE_URL") or os.environ.get(
    "ZOOMIES_TEST_POSTGRES_URL", "postgres://root@127.0.0.1:5432/test"
)


def on_server() -> set[str]:
    with psycopg.connect(SERVER) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def run_probe(where: Path, *args: str, kill: bool = False, linger: bool = False) -> list[str]:
    """One pytest run of tests/postgres_run_probe.py on PostgreSQL; the databases it made."""
    where.mkdir()
    names = where / "names"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ZOOMIES_"))}
    env |= {
        "ZOOMIES_DATABASE_URL": SERVER,
        "ZOOMIES_DATA_DIR": str(where),
        "ZOOMIES_PROBE_NAMES": str(names),
        "ZOOMIES_PROBE_KILL": "1" if kill else "0",
        "ZOOMIES_PROBE_LINGER": "1" if linger else "0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--no-migrations",
         "tests/postgres_run_probe.py", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == (-9 if kill else 0), done.stdout[-3000:] + done.stderr[-3000:]
    return names.read_text().split()


def dead_process() -> tuple[int, int]:
    """The pid and start time of a process that has ended."""
    child = subprocess.Popen(["sleep", "60"])
    start = postgres_databases.started(child.pid)
    child.kill()
    child.wait()
    assert start is not None
    return child.pid, start


# Two nested pytest runs, 25 s of the test command's SQLite pass: in .ci/run's slow pass.
@pytest.mark.slow
def test_two_runs_get_their_own_names_and_each_leaves_nothing_behind(tmp_path):
    """A killed run leaves its databases and the next run drops them as it starts; the two
    runs' names differ, and the second's are gone when it ends, whichever worker made
    them, even with a child of its still connected to its test database."""
    killed = run_probe(tmp_path / "killed", kill=True)
    assert len(killed) == 2 and set(killed) <= on_server(), "the kill left them"

    # A child still connected when the run ends: pytest-django's own drop is refused then.
    finished = run_probe(tmp_path / "finished", "-n", "2", "--dist", "loadgroup", linger=True)
    assert len(set(finished)) == 4 and not set(killed) & set(finished)
    assert len({name.split("_")[3] for name in finished}) == 2, "both workers made databases"
    assert all(postgres_databases.OWNED.match(name) for name in killed + finished)
    left = on_server()
    assert not set(killed) & left, "the next run dropped what the killed one left"
    assert not set(finished) & left, "and its own when it ended"


def test_only_a_dead_process_of_this_host_loses_its_databases():
    """A live process's database, another host's (another machine or container on the same
    server) and one named without an owner are kept; a database whose pid now belongs to
    another process (the start time differs) is a dead run's and is dropped."""
    pid, start = dead_process()
    other_host = "0" * 8 if postgres_databases.HOST != "0" * 8 else "1" * 8
    me = os.getpid()
    names = {
        "dead": f"zoomies_e2e_{postgres_databases.HOST}_{pid}_{start}_feed0001",
        "dead test": f"test_zoomies_{postgres_databases.HOST}_{pid}_{start}_gw3",
        "pid reused": f"zoomies_e2e_{postgres_databases.HOST}_{me}_{start + 1}_feed0002",
        "alive": postgres_databases.new_name(),
        "another host": f"zoomies_e2e_{other_host}_{pid}_{start}_feed0003",
        "no owner": f"zoomies_e2e_{pid}_feed0004",
    }
    assert postgres_databases.started(me) != start + 1
    try:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            for name in names.values():
                conn.execute(f'CREATE DATABASE "{name}"')
        dropped = postgres_databases.drop_stale(SERVER)
        left = on_server()
        for what in ("dead", "dead test", "pid reused"):
            assert names[what] in dropped and names[what] not in left, what
        for what in ("alive", "another host", "no owner"):
            assert names[what] in left, what
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            for name in names.values():
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
