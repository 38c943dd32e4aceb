"""runners.webhook_inbox: on SQLite a delivery is kept in the inbox file, answered, and then
recorded in the database by the applier, which forgets it only once the database has it.

The database is held back by a second process holding SQLite's write lock, as in
tests/runners/test_webhook_writer.py (the writer's direct path, PostgreSQL's).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from concurrent.futures import wait

import pytest
from django.db import connection

from runners import webhook_inbox, webhook_writer, webhooks
from runners.models import Job, WebhookDelivery
from runners.states import JobStatus
from tests.runners.test_webhook_writer import (
    BUDGET,
    database_held,
    delivery,
    request_for,
)
from tests.runners.test_webhook_writer import post as post  # the fixture: both routes
from tests.runners.test_webhooks import job_payload
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
# The inbox is SQLite's: with PostgreSQL the writer records directly, which the last test
# here and tests/runners/test_webhook_writer.py show on that pass.
sqlite_only = pytest.mark.skipif(
    bool(os.environ.get("ZOOMIES_DATABASE_URL")), reason="the inbox is used on SQLite only"
)


@pytest.fixture(autouse=True)
def _setup(github_settings, monkeypatch, settings, _acme_is_configured):
    from tests.runners.conftest import WEBHOOK_SECRET  # noqa: PLC0415

    github_settings.set(webhook_secrets=WEBHOOK_SECRET)
    settings.WEBHOOK_INBOX = True  # production's default (tests/conftest.py turns it off)
    monkeypatch.setattr(webhook_writer, "ANSWER_BUDGET", BUDGET)


@pytest.fixture
def _acme_is_configured(db):
    from tests.runners.conftest import acme_installation  # noqa: PLC0415

    acme_installation()


def recorded(delivery_id: str) -> int:
    return WebhookDelivery.objects.filter(delivery_id=delivery_id).count()


def kept() -> list[tuple[str, str | None]]:
    """(delivery id, failed) of every delivery the inbox file holds, read from outside."""
    path = webhook_inbox.path()
    if not path.exists():
        return []
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT delivery_id, failed FROM delivery ORDER BY seq").fetchall()
    finally:
        db.close()


@sqlite_only
def test_hook02_a_held_database_does_not_turn_a_delivery_away_it_is_kept_and_recorded_once(post):
    """HOOK-02, HOOK-04: with the database's write lock held by another process, a delivery
    is answered 200 while the lock is still held (the inbox has it, durably), is not in the
    database yet, and is recorded once the lock goes, once; a redelivery is a duplicate
    whether it comes while the delivery is kept or after it was recorded."""
    body, headers = delivery(5_500_001)
    delivery_id = headers["X-GitHub-Delivery"]
    with database_held() as holder:
        status, answer = post(body, headers)
        assert holder.poll() is None  # answered while the database was still held
        assert (status, answer) == (
            200, {"ok": True, "delivery": delivery_id, "event": "workflow_job"}
        )  # fmt: skip
        assert kept() == [(delivery_id, None)]
        assert recorded(delivery_id) == 0
        again = post(body, headers)  # GitHub's redelivery while it is only kept
        assert again == (200, {"duplicate": True, "delivery": delivery_id})
    wait_until(lambda: recorded(delivery_id) == 1, 30, "the kept delivery recorded")
    wait_until(lambda: not kept(), 10, "the inbox to forget what the database has")
    assert Job.objects.get(github_id=5_500_001).status == JobStatus.QUEUED
    assert post(body, headers) == (200, {"duplicate": True, "delivery": delivery_id})
    assert recorded(delivery_id) == 1 and not kept()


@sqlite_only
def test_a_held_inbox_answers_503_in_time_and_the_delivery_is_never_recorded():
    """Issue 21 item 19 holds for the inbox too: when the inbox itself cannot be written by
    the answer's due time, the delivery is answered 503 and nothing of it is kept."""
    request = request_for(5_510_000)
    webhook_inbox.Inbox(webhook_inbox.path()).close()  # the file exists, to be locked
    holder = sqlite3.connect(webhook_inbox.path(), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        future = webhook_writer.submit(request)
        done, _ = wait([future], timeout=BUDGET + webhook_writer.LATE_GRACE + 5)
        assert done, "not answered by its due time"
        assert webhook_writer.settle(future, request.delivery_id).status == 503
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    webhook_writer.writer.stop()
    assert webhook_inbox.settle(10)
    assert kept() == [] and recorded(request.delivery_id) == 0
    assert not Job.objects.filter(github_id=5_510_000).exists()


KEEP_AND_DIE = """
import os, signal, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoomies_site.settings")
django.setup()
from django.db import connection
from runners import webhook_inbox, webhooks
from django.utils import timezone
connection.settings_dict["NAME"] = sys.argv[1]
inbox = webhook_inbox.Inbox(webhook_inbox.path())
kept = []
for line in sys.stdin:
    delivery_id, body = line.rstrip("\\n").split(" ", 1)
    parsed = webhooks.parse(body=body.encode(), event="workflow_job", delivery_id=delivery_id,
                            now=timezone.now())
    kept.append((parsed, body.encode()))
print([a.status for a in inbox.keep(kept, wait=5)[0]], flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # before any applier of this process could record them
"""


@sqlite_only
def test_deliveries_kept_by_a_process_killed_before_recording_them_are_recorded_by_the_next():
    """A killed controller loses nothing it answered: a process keeps three deliveries,
    answers them and is killed with SIGKILL before recording any; this process's applier,
    started as a server's start starts it, records each one once, in order, and the job's
    later moves win (queued, in_progress, completed: never backwards)."""
    import json  # noqa: PLC0415

    lines = [
        f"{action}-5520000 {json.dumps(job_payload(action, job_id=5_520_000))}\n"
        for action in ("queued", "in_progress", "completed")
    ]
    child = subprocess.run(
        [sys.executable, "-c", KEEP_AND_DIE, str(connection.settings_dict["NAME"])],
        input="".join(lines), capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert child.stdout.strip() == "[200, 200, 200]"
    assert [d for d, _ in kept()] == ["queued-5520000", "in_progress-5520000", "completed-5520000"]
    assert not Job.objects.filter(github_id=5_520_000).exists()

    webhook_inbox.applier().wake()  # zoomies_site/server.py does this at every start
    wait_until(lambda: not kept(), 30, "the next process to record what the killed one kept")
    assert Job.objects.get(github_id=5_520_000).status == JobStatus.COMPLETED
    assert WebhookDelivery.objects.filter(delivery_id__endswith="-5520000").count() == 3


@sqlite_only
def test_a_kept_delivery_that_fails_to_record_is_set_aside_not_lost_and_tried_at_the_next_start(
    monkeypatch,
):
    """One delivery whose recording fails (a fault of ours) neither stops the others nor is
    dropped: it stays in the inbox marked failed, still answers redeliveries as a duplicate,
    and the next start's applier records it once the fault is gone."""
    real = webhooks._record_one

    def faulty(delivery, burst):
        if delivery.payload["workflow_job"]["id"] == 5_530_001:
            raise RuntimeError("a bug in recording this one")
        return real(delivery, burst)

    monkeypatch.setattr(webhooks, "_record_one", faulty)
    # New queued jobs are written together, in one statement; one a savepoint here, so that
    # one of them can fail alone.
    monkeypatch.setattr(webhooks, "_new_queued_jobs", lambda deliveries, burst: [])
    futures = [webhook_writer.submit(request_for(5_530_000 + i)) for i in range(3)]
    wait(futures, timeout=30)
    assert [f.result().status for f in futures] == [200, 200, 200]
    wait_until(lambda: len(kept()) == 1 and kept()[0][1], 30, "the failing one set aside")
    assert set(Job.objects.values_list("github_id", flat=True)) >= {5_530_000, 5_530_002}
    assert not Job.objects.filter(github_id=5_530_001).exists()
    (failed_id, error) = kept()[0]
    assert "a bug in recording this one" in error

    webhook_writer.writer.stop()
    webhook_inbox.stop_appliers()
    monkeypatch.undo()  # the fault fixed, the server restarted
    webhook_inbox.applier().wake()
    wait_until(lambda: not kept(), 30, "the set-aside delivery recorded at the next start")
    assert recorded(failed_id) == 1
    assert Job.objects.filter(github_id=5_530_001).count() == 1


@sqlite_only
def test_a_burst_kept_together_is_recorded_in_order_and_each_once():
    """Many deliveries at once (GitHub sends them concurrently): each answered 200 once, each
    recorded once, none left in the inbox."""
    requests = [request_for(5_540_000 + i) for i in range(40)]
    futures = [webhook_writer.submit(r) for r in requests]
    wait(futures, timeout=30)
    assert [f.result().body.get("ok") for f in futures] == [True] * 40
    wait_until(lambda: not kept(), 30, "the burst recorded")
    assert (
        WebhookDelivery.objects.filter(delivery_id__in=[r.delivery_id for r in requests]).count()
        == 40
    )
    assert Job.objects.filter(github_id__range=(5_540_000, 5_540_039)).count() == 40
    # What the writer handed over parsed is let go once recorded, however the two met.
    assert webhook_inbox.settle(10)
    assert not webhook_inbox.applier()._parsed


@sqlite_only
def test_a_batch_that_fails_outside_any_deliverys_savepoint_is_recorded_one_by_one(monkeypatch):
    """A fault of ours that fails a whole batch (outside the savepoint of any one delivery)
    neither kills the applier nor holds up the deliveries behind it: the batch is recorded a
    delivery at a time, and only the one at fault is set aside."""
    real = webhooks._new_queued_jobs

    def faulty(deliveries, burst):
        if any(d.payload["workflow_job"]["id"] == 5_550_001 for d in deliveries):
            raise RuntimeError("a bug outside the savepoints")
        return real(deliveries, burst)

    monkeypatch.setattr(webhooks, "_new_queued_jobs", faulty)
    futures = [webhook_writer.submit(request_for(5_550_000 + i)) for i in range(3)]
    wait(futures, timeout=30)
    assert [f.result().status for f in futures] == [200, 200, 200]
    wait_until(lambda: len(kept()) == 1 and kept()[0][1], 30, "the one at fault set aside")
    assert "a bug outside the savepoints" in kept()[0][1]
    assert set(Job.objects.values_list("github_id", flat=True)) >= {5_550_000, 5_550_002}
    assert webhook_inbox.applier().alive()
    later = webhook_writer.submit(request_for(5_550_010))  # the applier still records
    assert later.result(timeout=30).status == 200
    wait_until(lambda: Job.objects.filter(github_id=5_550_010).exists(), 30, "a later one")


@sqlite_only
def test_an_inbox_left_with_deliveries_is_drained_at_start_even_with_the_inbox_turned_off(
    settings,
):
    """Deliveries an earlier process kept were answered 200 and GitHub will not send them
    again: a server that starts with the inbox turned off still records them."""
    from django.utils import timezone  # noqa: PLC0415

    inbox = webhook_inbox.Inbox(webhook_inbox.path())
    request = request_for(5_560_000)
    parsed = webhooks.parse(body=request.body, event="workflow_job",
                            delivery_id=request.delivery_id, now=timezone.now())  # fmt: skip
    inbox.keep([(parsed, request.body)], wait=5)
    inbox.close()
    settings.WEBHOOK_INBOX = False
    assert webhook_inbox.drain_at_start()
    wait_until(lambda: not kept(), 30, "the kept delivery recorded")
    assert recorded(request.delivery_id) == 1


def test_the_inbox_is_sqlites_and_can_be_turned_off(settings, tmp_path):
    """On SQLite the inbox is on by default; WEBHOOK_INBOX=False (ZOOMIES_WEBHOOK_INBOX=0)
    records before answering, as PostgreSQL always does, whatever the setting says. The
    default is read where production reads it: a process on production's settings, with the
    variable unset and with it 0 (this process's settings are the suite's, tests/conftest.py)."""
    ask = (
        "import django; django.setup(); from runners import webhook_inbox; "
        "print(webhook_inbox.enabled())"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZOOMIES_")}
    env |= {"DJANGO_SETTINGS_MODULE": "zoomies_site.settings", "ZOOMIES_DATA_DIR": str(tmp_path)}
    said = [
        subprocess.run(
            [sys.executable, "-c", ask], env=env | extra, cwd=os.getcwd(),
            capture_output=True, text=True, timeout=60,
        ).stdout.strip()
        for extra in ({}, {"ZOOMIES_WEBHOOK_INBOX": "0"})
    ]  # fmt: skip
    assert said == ["True", "False"]
    assert webhook_inbox.enabled() == (connection.vendor == "sqlite")
    settings.WEBHOOK_INBOX = False
    assert not webhook_inbox.enabled()


@sqlite_only
def test_the_inbox_is_counted_in_the_metrics_while_it_holds_deliveries():
    """`GET /metrics` shows what the inbox holds, waiting and set aside, so an operator sees
    deliveries answered and not yet recorded; none when there is no inbox file."""
    from django.utils import timezone  # noqa: PLC0415

    from zoomies_site import metrics_view  # noqa: PLC0415

    assert b"zoomies_webhook_inbox_deliveries" not in metrics_view.exposition()
    inbox = webhook_inbox.Inbox(webhook_inbox.path())
    requests = [request_for(5_570_000 + i) for i in range(3)]
    parsed = [
        (webhooks.parse(body=r.body, event="workflow_job", delivery_id=r.delivery_id,
                        now=timezone.now()), r.body)
        for r in requests
    ]  # fmt: skip
    _, kept_now = inbox.keep(parsed, wait=5)
    inbox.fail(kept_now[0].seq, "RuntimeError: for the count")
    inbox.close()
    text = metrics_view.exposition().decode()
    assert 'zoomies_webhook_inbox_deliveries{state="waiting"} 2.0' in text
    assert 'zoomies_webhook_inbox_deliveries{state="set_aside"} 1.0' in text
    assert webhook_inbox.drain_at_start()  # recorded, so the test leaves no inbox behind
    wait_until(lambda: not kept(), 30, "the kept deliveries recorded")
    text = metrics_view.exposition().decode()
    assert 'zoomies_webhook_inbox_deliveries{state="waiting"} 0.0' in text
