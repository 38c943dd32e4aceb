"""Several writers, one database: STORE-01 and STORE-03, by behaviour.

STORE-01: on SQLite every connection runs in WAL mode with a busy timeout, and a
transaction takes the write lock at BEGIN (IMMEDIATE), so a read-then-write transaction can
never fail half way with "database is locked". On PostgreSQL the same tests check what
applies there instead: no persistent connections (CONN_MAX_AGE 0) and READ COMMITTED.

STORE-03: four processes run short read-then-write transactions through the real code
path (`runners.actions.record_job`, `zoomies_site.core.leases`) against one database at once;
none sees an OperationalError and the rows they leave are consistent.
"""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import OperationalError, connection, transaction
from django.db.utils import load_backend

from runners.models import Job
from zoomies_site.core.models import Lease

ROOT = Path(__file__).resolve().parents[2]
LEASE_TABLE = Lease._meta.db_table
JOB_TABLE = Job._meta.db_table


def second_connection(**options):
    """A new connection built from the same settings as `connection`, plus `options`."""
    settings_dict = copy.deepcopy(connection.settings_dict)
    settings_dict["OPTIONS"].update(options)
    backend = load_backend(settings_dict["ENGINE"])
    return backend.DatabaseWrapper(settings_dict, alias="store-probe")


def insert_lease(conn, name: str) -> None:
    with conn.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {LEASE_TABLE} (name, holder, dirty) VALUES (%s, %s, %s)",
            [name, "", False],
        )


def count_leases(conn, name: str) -> int:
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {LEASE_TABLE} WHERE name = %s", [name])
        return cursor.fetchone()[0]


def assert_postgresql_settings() -> None:
    """What STORE-01 asks of PostgreSQL: no persistent connections, READ COMMITTED."""
    assert connection.vendor == "postgresql", connection.vendor
    assert connection.settings_dict["CONN_MAX_AGE"] == 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        assert cursor.fetchone()[0] == "read committed"


# ---- STORE-01 ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_store01_every_connection_runs_wal_with_a_busy_timeout_and_a_writer_waits() -> None:
    """STORE-01: WAL and a busy timeout on the test's connection and on a fresh one; and a
    second writer waits for the lock holder to commit, then succeeds, instead of failing."""
    if connection.vendor == "sqlite":
        probe = second_connection()
        try:
            for conn in (connection, probe):
                with conn.cursor() as cursor:
                    cursor.execute("PRAGMA journal_mode")
                    assert cursor.fetchone()[0] == "wal"
                    cursor.execute("PRAGMA busy_timeout")
                    assert cursor.fetchone()[0] >= 5000  # ms: long enough to queue writers
                    cursor.execute("PRAGMA synchronous")
                    assert cursor.fetchone()[0] == 1  # NORMAL, WAL's usual pairing
        finally:
            probe.close()
    else:
        assert_postgresql_settings()

    Lease.objects.create(name="store01-wait")
    holding, writing, releasing = threading.Event(), threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def hold_the_lock() -> None:
        try:
            with transaction.atomic():
                Lease.objects.filter(name="store01-wait").update(holder="first")
                holding.set()
                # Give the second writer time to reach the lock; then mark the release, so a
                # write that did not wait for it is caught by order, not by a stopwatch.
                writing.wait(30)
                time.sleep(0.3)
                releasing.set()
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
            holding.set()
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert holding.wait(30), "the first writer never took the lock"
    writer = second_connection()  # the real settings: on SQLite, the real busy timeout
    try:
        with writer.cursor() as cursor:
            writing.set()
            cursor.execute(
                f"UPDATE {LEASE_TABLE} SET holder = %s WHERE name = %s", ["second", "store01-wait"]
            )
            released_first = releasing.is_set()
    finally:
        writer.close()
        holder.join(30)
    assert not failure, failure
    assert released_first, "the second writer went through while the first held the lock"
    assert Lease.objects.get(name="store01-wait").holder == "second"


@pytest.mark.django_db(transaction=True)
def test_store01_a_transaction_takes_the_write_lock_at_begin_immediate() -> None:
    """STORE-01: on SQLite a transaction that has only read already holds the write lock
    (BEGIN IMMEDIATE): another connection's write waits out its busy timeout and fails, while
    its reads go on (WAL). A deferred read-only transaction, for contrast, blocks nobody. On
    PostgreSQL: READ COMMITTED, so a write committed meanwhile by another connection neither
    waits for an open reading transaction nor stays hidden from it."""
    if connection.vendor != "sqlite":
        assert_postgresql_settings()
        probe = second_connection()
        try:
            with transaction.atomic():
                assert count_leases(connection, "store01-begin") == 0
                # A write that waited for this open transaction would wait for ever (one
                # thread holds both): the statement timeout turns that into a clear error.
                with probe.cursor() as cursor:
                    cursor.execute("SET statement_timeout = '30s'")
                insert_lease(probe, "store01-begin")  # autocommit: committed at once
                assert count_leases(connection, "store01-begin") == 1
        finally:
            probe.close()
        return

    assert connection.settings_dict["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    probe = second_connection(timeout=0.3)
    try:
        with transaction.atomic():
            assert not Lease.objects.filter(name="store01-begin").exists()  # a read, no write
            with probe.cursor() as cursor:
                cursor.execute("PRAGMA busy_timeout")
                assert cursor.fetchone()[0] == 300  # ms: it waits this long, then fails
            with pytest.raises(OperationalError, match="database is locked"):
                insert_lease(probe, "store01-begin")
            assert count_leases(probe, "store01-begin") == 0  # WAL: readers are not blocked
        insert_lease(probe, "store01-begin")  # the lock went with the commit

        # Contrast: a plain (deferred) BEGIN that only reads takes no write lock.
        deferred = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        try:
            deferred.execute("BEGIN")
            deferred.execute(f"SELECT count(*) FROM {LEASE_TABLE}").fetchone()
            insert_lease(probe, "store01-deferred")
            deferred.execute("ROLLBACK")
        finally:
            deferred.close()
    finally:
        probe.close()
    assert set(Lease.objects.values_list("name", flat=True)) == {
        "store01-begin",
        "store01-deferred",
    }


# ---- STORE-03 ---------------------------------------------------------------------------

PROCESSES = 4
ROUNDS = 150
SHARED_JOBS = 10
OWN_BASE, SHARED_BASE = 7_100_000_000, 7_200_000_000

# One writer process: ROUNDS short transactions, alternating between this process's own jobs
# (each sent its three statuses in a shuffled order) and jobs every process writes, with a
# lease taken and let go every fifth round. Prints a JSON report; exits 1 on any error.
WORKER = r"""
import json, os, random, sys, time
from datetime import timedelta

import django

django.setup()
from django.db import OperationalError, connection
from django.utils import timezone

from runners.actions import JobUpdate, record_job
from zoomies_site.core import leases

index, rounds, shared, own_base, shared_base, go = sys.argv[1:7]
index, rounds, shared = int(index), int(rounds), int(shared)
own_base, shared_base = int(own_base), int(shared_base)
RANK = {"queued": 0, "in_progress": 1, "completed": 2}
rng = random.Random(index)
me = f"store03-p{index}"
errors, backwards, sent, seen = [], [], {}, {}
leases_held = 0
own = [rng.sample(list(RANK), 3) for _ in range(rounds // 2 // 3 + 1)]

connection.ensure_connection()
open(f"{go}.ready{index}", "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
started = time.monotonic()


def send(github_id, status):
    update = JobUpdate(github_id=github_id, status=status, repository="acme/app", labels=("x",))
    job, _ = record_job(update, installation=None, now=timezone.now(), source="webhook", actor=me)
    sent[github_id] = max(sent.get(github_id, 0), RANK[status])
    rank = RANK[job.status]
    if rank < RANK[status] or rank < seen.get(github_id, 0):
        backwards.append([github_id, status, job.status, seen.get(github_id)])
    seen[github_id] = max(seen.get(github_id, 0), rank)


for n in range(rounds):
    try:
        if n % 2 == 0:
            k = n // 2
            send(own_base + index * 1000 + k // 3, own[k // 3][k % 3])
        else:
            send(shared_base + rng.randrange(shared), rng.choice(list(RANK)))
        if n % 5 == 0:
            now = timezone.now()
            if leases.acquire("store03", holder=me, now=now, ttl=timedelta(seconds=60)):
                leases_held += 1
                if leases.holder_of("store03")[0] != me:
                    backwards.append(["lease", me, leases.holder_of("store03")[0]])
                leases.release("store03", holder=me)
    except OperationalError as exc:
        errors.append(f"round {n}: {exc}")

print(json.dumps({
    "errors": errors, "backwards": backwards, "leases": leases_held,
    "sent": {str(k): v for k, v in sent.items()}, "seconds": time.monotonic() - started,
}))
sys.exit(1 if errors or backwards else 0)
"""


def _worker_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZOOMIES_", "DJANGO_SETTINGS"))}
    env.update(
        DJANGO_SETTINGS_MODULE="zoomies_site.settings",
        ZOOMIES_DATA_DIR=str(tmp_path),
        PYTHONUNBUFFERED="1",
    )
    if connection.vendor == "sqlite":
        env["ZOOMIES_DB"] = str(tmp_path / "store03.db")
    else:
        # The test database itself, committed to for real (the flush after the test empties it).
        db = connection.settings_dict
        user = quote(db["USER"] or "", safe="") + (
            ":" + quote(db["PASSWORD"], safe="") if db["PASSWORD"] else ""
        )
        port = f":{db['PORT']}" if db["PORT"] else ""
        env["ZOOMIES_DATABASE_URL"] = f"postgres://{user}@{db['HOST']}{port}/{db['NAME']}"
    return env


def _job_rows(tmp_path: Path) -> list[tuple[int, str]]:
    query = f"SELECT github_id, status FROM {JOB_TABLE} ORDER BY github_id"
    if connection.vendor == "sqlite":
        db = sqlite3.connect(tmp_path / "store03.db")
        try:
            return db.execute(query).fetchall()
        finally:
            db.close()
    with connection.cursor() as cursor:
        cursor.execute(query)
        return cursor.fetchall()


# The mark, not a late getfixturevalue("transactional_db"): requested late, as the first
# database test of a session, the connection kept the configured (not the test) database.
@pytest.mark.django_db(transaction=True)
def test_store03_four_processes_write_one_database_at_once_without_database_is_locked(
    tmp_path: Path,
) -> None:
    """STORE-03: on SQLite, a file migrated by `manage.py migrate`; four processes each run
    150 read-then-write transactions (record_job on their own and on shared jobs, leases)
    at once. Every process exits 0 with no OperationalError, every job is there once, and
    none moved backwards. On PostgreSQL the same four processes write the test database."""
    env = _worker_env(tmp_path)
    if connection.vendor == "sqlite":
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert migrate.returncode == 0, migrate.stderr

    go = tmp_path / "go"
    args = [str(ROUNDS), str(SHARED_JOBS), str(OWN_BASE), str(SHARED_BASE), str(go)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(i), *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(PROCESSES)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(Path(f"{go}.ready{i}").exists() for i in range(PROCESSES)):
            assert all(w.poll() is None for w in workers), "a worker exited before the start"
            assert time.monotonic() < deadline, "the workers did not get ready"
            time.sleep(0.02)
        go.touch()  # all four start writing at the same moment
        outputs = [w.communicate(timeout=120) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()

    reports = []
    for i, (worker, (out, err)) in enumerate(zip(workers, outputs, strict=True)):
        assert "database is locked" not in err, err[-3000:]
        assert worker.returncode == 0, f"worker {i}: {out[-2000:]}\n{err[-3000:]}"
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["errors"] for r in reports] == [[]] * PROCESSES
    assert [r["backwards"] for r in reports] == [[]] * PROCESSES
    assert sum(r["leases"] for r in reports) > 0

    rows = _job_rows(tmp_path)
    ids = [github_id for github_id, _ in rows]
    assert len(ids) == len(set(ids))
    expected: dict[int, int] = {}
    for report in reports:
        for github_id, rank in report["sent"].items():
            expected[int(github_id)] = max(expected.get(int(github_id), 0), rank)
    statuses = ["queued", "in_progress", "completed"]
    assert dict(rows) == {github_id: statuses[rank] for github_id, rank in expected.items()}
    own = {github_id: status for github_id, status in rows if github_id < SHARED_BASE}
    assert len(own) == PROCESSES * (ROUNDS // 2 // 3)
    assert set(own.values()) == {"completed"}  # all three statuses, in any order, end there
