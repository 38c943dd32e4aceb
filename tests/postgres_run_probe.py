"""A small test run that tests/test_postgres_databases.py drives in a pytest subprocess (its
name keeps it out of the suite's own collection).

Each test makes an end-to-end database as a Controller does and uses the run's test
database, checks both are on the server, and appends their names to $ZOOMIES_PROBE_NAMES;
with ZOOMIES_PROBE_KILL=1 the run is SIGKILLed there, as a run killed mid-way would be; with
ZOOMIES_PROBE_LINGER=1 a child stays connected to the test database past the run's end, as
a child whose server session has not yet ended does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from tests.e2e.harness import Controller


def record_databases() -> None:
    e2e_url = Controller._fresh_postgres()
    names = [connection.settings_dict["NAME"], e2e_url.rsplit("/", 1)[1]]
    with psycopg.connect(e2e_url) as conn:
        on_server = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
    assert set(names) <= on_server
    with open(os.environ["ZOOMIES_PROBE_NAMES"], "a") as out:
        out.write("".join(f"{name}\n" for name in names))
    if os.environ.get("ZOOMIES_PROBE_LINGER") == "1":
        db = connection.settings_dict
        test_url = e2e_url.rsplit("/", 1)[0] + "/" + db["NAME"]
        linger = (
            "import sys, time, psycopg; c = psycopg.connect(sys.argv[1]); "
            "print('connected', flush=True); time.sleep(20)"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", linger, test_url],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        assert child.stdout is not None and child.stdout.readline().strip() == "connected"
    if os.environ.get("ZOOMIES_PROBE_KILL") == "1":
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.django_db
@pytest.mark.xdist_group("probe-one")
def test_one_worker_makes_its_databases():
    record_databases()


@pytest.mark.django_db
@pytest.mark.xdist_group("probe-two")
def test_another_worker_makes_its_databases():
    record_databases()
