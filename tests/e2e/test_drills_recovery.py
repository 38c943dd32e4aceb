"""Recovery drills against the real controller process (issue 11 items 3 and 5).

Each drill does to the controller what an operator's bad day would: a kill -9 while its
workers held leases, a database whose write lock another process holds, a database file made
read-only. The controller must stay up or come back in seconds, and say what is wrong on
/healthz while it is wrong.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.e2e.harness import wait_for
from tests.e2e.test_first_job import LABELS, POOL, setup_fleet

pytestmark = [
    pytest.mark.e2e,
    # These drills reach into the SQLite file itself (its lease rows, its write lock, its
    # permissions); on PostgreSQL the same outages need other tools.
    pytest.mark.skipif(
        bool(os.environ.get("ZOOMIES_DATABASE_URL")), reason="a drill on the SQLite file"
    ),
]

FAST_PROBE = {"ZOOMIES_CONTROLLER_LEASE_RENEW": "1s"}
# How many failed write probes an outage lasts: about 30 s at a lease renewal each second
# (FAST_PROBE), and at startup's one try every 2 s (STARTUP_RETRY_SECONDS).
OUTAGE_PROBES = 30
STARTUP_OUTAGE_PROBES = 15


def start_and_settle(controller) -> None:
    """Started, with its embedded agent joined: the outage is of a running controller."""
    controller.start()
    wait_for(lambda: controller.api("hosts"), 60, "the embedded agent to join")


def health(controller) -> tuple[int, dict]:
    response = httpx.get(f"{controller.url}/healthz", timeout=10)
    return response.status_code, response.json()


def test_lease06_a_restart_takes_over_the_dead_workers_leases_and_creates_at_once(e2e):
    """LEASE-06, SCHED-27: after a kill -9 the reconcile lease a dead worker held (5 min
    TTL) no longer blocks the restarted controller: its first runner comes in seconds."""
    controller, fake = e2e
    setup_fleet(controller, fake)
    controller.start()
    controller.api("pools", method="POST", json=POOL)
    dead_pid = controller.process.pid
    controller.kill()
    # What a worker killed mid-pass leaves: the reconcile lease, held for five more minutes.
    db = sqlite3.connect(controller.data_dir / "zoomies.db", timeout=30)
    expires = (datetime.now(UTC) + timedelta(minutes=5)).strftime("%Y-%m-%d %H:%M:%S.%f")
    with db:
        db.execute("DELETE FROM zoomies_site_lease WHERE name = 'reconcile'")
        db.execute(
            "INSERT INTO zoomies_site_lease (name, holder, expires_at, acquired_at, dirty)"
            " VALUES ('reconcile', ?, ?, ?, 0)",
            (f"{socket.gethostname()}:{dead_pid}:dead", expires, expires),
        )
        held = db.execute("SELECT holder FROM zoomies_site_lease WHERE name = 'reconcile'")
        assert held.fetchone()[0].endswith(":dead")
    db.close()

    controller.start()
    ready = time.monotonic()
    job_id = fake.queue_job(repo="acme/app", labels=LABELS, duration=2, conclusion="success")
    # Generous, but well inside the lease's five minutes that used to block every pass.
    wait_for(lambda: controller.api("runners"), 120, "the first runner after the restart")
    first_runner = time.monotonic() - ready
    print(f"drill: first runner {first_runner:.1f} s after the restart was ready")
    wait_for(lambda: fake.job(job_id)["status"] == "completed", 120, "the job to run")
    assert "lease reconcile: freed" in controller.log()


def ride_out(controller, probes: int) -> None:
    """The outage itself, which the controller must ride out: it lasts until the degraded
    marker shows `probes` more failed write probes (each one refreshes its `checked_at`), and
    at every look the process is alive and /healthz says degraded."""
    marker = controller.data_dir / "database-degraded.json"
    seen: set[str] = set()

    def more_failed_probes() -> bool:
        assert controller.process.poll() is None, controller.log()
        status, body = health(controller)
        assert (status, body["status"]) == (503, "degraded"), body
        seen.add(json.loads(marker.read_text())["checked_at"])
        return len(seen) > probes

    wait_for(more_failed_probes, 120, f"{probes} failed write probes in the outage")


def set_read_only(path, on: bool, mode: int = 0o644) -> None:
    """chmod, or for root (whom permissions do not stop) the immutable attribute."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True)
    else:
        os.chmod(path, 0o444 if on else mode)


def _hold_write_lock(path, seconds: float, held: threading.Event) -> None:
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    held.set()
    time.sleep(seconds)
    db.execute("ROLLBACK")
    db.close()


@pytest.mark.slow
def test_store_a_held_write_lock_degrades_the_controller_and_it_resumes_by_itself(e2e):
    """Issue 11 item 5: another process holds SQLite's write lock for 45 s. The controller stays up,
    /healthz answers 503 naming `database.unwritable`, and it is ok again by itself."""
    controller, fake = e2e
    controller.env.update(FAST_PROBE)
    setup_fleet(controller, fake)
    start_and_settle(controller)
    held = threading.Event()
    holder = threading.Thread(
        target=_hold_write_lock, args=(controller.data_dir / "zoomies.db", 45, held)
    )
    holder.start()
    held.wait(30)
    status, body = wait_for(
        lambda: (h := health(controller))[0] == 503 and h, 60, "/healthz to say degraded"
    )
    assert body["status"] == "degraded"
    assert [p["key"] for p in body["problems"]] == ["database.unwritable"]
    holder.join()
    wait_for(lambda: health(controller)[0] == 200, 60, "/healthz to recover by itself")
    assert controller.process.poll() is None, controller.log()


@pytest.mark.slow
def test_store_a_read_only_database_file_degrades_and_recovers_without_a_restart(e2e):
    """Issue 11 item 5: the database file made read-only for OUTAGE_PROBES failed write
    probes (about 30 s): degraded all along, not an exit."""
    controller, fake = e2e
    controller.env.update(FAST_PROBE)
    setup_fleet(controller, fake)
    start_and_settle(controller)
    # The database and its log: a writer appends to the -wal and checkpoints into the file.
    # Not the -shm, which every connection has mapped into memory: once it is immutable, the
    # first write to a page of it not yet written kills the writing process with SIGBUS (the
    # kernel's doing, tried in isolation), which is chattr's effect on a mapping, not an
    # outage's. A controller killed that way left CI's log ending mid-outage.
    paths = [controller.data_dir / f"zoomies.db{suffix}" for suffix in ("", "-wal")]
    modes = {path: path.stat().st_mode for path in paths if path.exists()}
    for path in modes:
        set_read_only(path, True)
    try:
        status, body = wait_for(
            lambda: (h := health(controller))[0] == 503 and h, 60, "/healthz to say degraded"
        )
        assert body["status"] == "degraded", body
        ride_out(controller, OUTAGE_PROBES)
    finally:
        for path, mode in modes.items():
            set_read_only(path, False, mode)
    wait_for(lambda: health(controller)[0] == 200, 60, "/healthz to recover by itself")
    assert controller.process.poll() is None, controller.log()


HOLD_WRITE_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
"""


def degraded_then_ok(controller, outage_over) -> float:
    """The controller started into an outage: it stays up and /healthz says degraded, naming
    the problem, until `outage_over()` ends the outage; then it is ok by itself and runs a
    job (its workers and its agent started late, not never). Returns the seconds from the
    outage's end to /healthz ok."""
    _status, body = wait_for(
        lambda: (h := health(controller))[0] == 503 and h, 90, "/healthz to say degraded"
    )
    assert body["status"] == "degraded", body
    assert [p["key"] for p in body["problems"]] == ["database.unwritable"]
    assert controller.process.poll() is None, controller.log()
    outage_over()
    ended = time.monotonic()
    wait_for(lambda: health(controller)[0] == 200, 90, "/healthz to recover by itself")
    resumed = time.monotonic() - ended
    assert controller.process.poll() is None, controller.log()
    return resumed


@pytest.mark.slow
def test_store_a_write_lock_held_at_startup_degrades_the_controller_until_it_is_let_go(e2e):
    """STORE-01, LEASE-03, issue 11 item 5: a second process holds SQLite's write lock (BEGIN
    IMMEDIATE) when the controller starts, for 40 s. It does not exit: degraded, then ok by
    itself, then a job runs."""
    controller, fake = e2e
    setup_fleet(controller, fake)
    start_and_settle(controller)
    controller.api("pools", method="POST", json=POOL)
    controller.stop()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_WRITE_LOCK, str(controller.data_dir / "zoomies.db"), "40"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        controller.start(ready=False)
        resumed = degraded_then_ok(controller, lambda: holder.wait(timeout=60))
    finally:
        holder.kill()
        holder.wait(timeout=10)
    print(f"drill: write lock held at startup; ok {resumed:.1f} s after it was let go")
    job_id = fake.queue_job(repo="acme/app", labels=LABELS, duration=1, conclusion="success")
    wait_for(lambda: fake.job(job_id)["status"] == "completed", 120, "a job after the outage")


@pytest.mark.slow
def test_store_a_read_only_database_at_startup_degrades_the_controller_until_it_is_writable(e2e):
    """STORE-04, issue 11 item 5: the database and its WAL files are read-only when the
    controller starts (it was killed, so they are all there). It does not exit: degraded
    through STARTUP_OUTAGE_PROBES failed tries (about 30 s), ok by itself once they are
    writable, then a job runs."""
    controller, fake = e2e
    setup_fleet(controller, fake)
    start_and_settle(controller)
    controller.api("pools", method="POST", json=POOL)
    controller.kill()
    paths = [controller.data_dir / f"zoomies.db{suffix}" for suffix in ("", "-wal", "-shm")]
    modes = {path: path.stat().st_mode for path in paths if path.exists()}
    for path in modes:
        set_read_only(path, True)

    def writable_again() -> None:
        ride_out(controller, STARTUP_OUTAGE_PROBES)
        for path, mode in modes.items():
            set_read_only(path, False, mode)

    try:
        controller.start(ready=False)
        resumed = degraded_then_ok(controller, writable_again)
    finally:
        for path, mode in modes.items():
            set_read_only(path, False, mode)
    print(f"drill: read-only database at startup; ok {resumed:.1f} s after it was writable")
    job_id = fake.queue_job(repo="acme/app", labels=LABELS, duration=1, conclusion="success")
    wait_for(lambda: fake.job(job_id)["status"] == "completed", 120, "a job after the outage")
