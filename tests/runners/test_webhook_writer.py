"""runners.webhook_writer: both routes of `POST /webhooks/github` record through one thread
that writes deliveries in bursts, and answer within the budget whatever the database does.

These are the writer's direct path, recorded before answered: PostgreSQL's, and SQLite's with
the webhook inbox turned off (WEBHOOK_INBOX). tests/runners/test_webhook_inbox.py has SQLite's
default, kept in the inbox first.

The database is held back by a second process: on SQLite it holds the write lock
(`BEGIN IMMEDIATE`), on PostgreSQL an EXCLUSIVE lock on the deliveries table, which any
insert there waits for.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, wait
from contextlib import contextmanager

import httpx
import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from runners import webhook_asgi, webhook_writer, webhooks
from runners.models import Job, WebhookDelivery
from runners.webhooks import sign
from tests.runners.conftest import WEBHOOK_SECRET, acme_installation, wakes_asked
from tests.runners.test_webhooks import URL, job_payload
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _acme_is_configured(db):
    """The example deliveries name installation 77: configured here, as their job's must be
    (issue 29 item 2)."""
    acme_installation()


BUDGET = 1.0  # short, so the tests do not wait out the real 5 s

HOLD_SQLITE = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
"""
HOLD_POSTGRES = """
import psycopg, sys
with psycopg.connect(sys.argv[1]) as db:
    db.execute("LOCK TABLE runners_webhookdelivery IN EXCLUSIVE MODE")
    print("held", flush=True)
    sys.stdin.readline()
    db.rollback()
"""


@pytest.fixture(autouse=True)
def _setup(github_settings, monkeypatch, settings):
    github_settings.set(webhook_secrets=WEBHOOK_SECRET)
    settings.WEBHOOK_INBOX = False
    monkeypatch.setattr(webhook_writer, "ANSWER_BUDGET", BUDGET)


@contextmanager
def database_held() -> Iterator[subprocess.Popen]:
    """A second process holding the database back until the block ends."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
        target = (
            f"postgresql://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        )
        script = HOLD_POSTGRES
    else:
        target, script = str(db["NAME"]), HOLD_SQLITE
    holder = subprocess.Popen(
        [sys.executable, "-c", script, target],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(30)


def delivery(job_id: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(job_payload("queued", job_id=job_id)).encode()
    return body, {
        "Content-Type": "application/json",
        "X-GitHub-Event": "workflow_job",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": sign(body, WEBHOOK_SECRET),
    }


def post_asgi(body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": URL, "raw_path": URL.encode(), "root_path": "",
        "query_string": b"", "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        + [(b"content-length", str(len(body)).encode())],
    }  # fmt: skip
    sent = [{"type": "http.request", "body": body, "more_body": False}]
    answered: list[dict] = []

    async def receive():
        return sent.pop(0) if sent else {"type": "http.disconnect"}

    async def send(message):
        answered.append(message)

    asyncio.run(webhook_asgi.application(scope, receive, send))
    start = next(m for m in answered if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in answered if m["type"] == "http.response.body")
    return start["status"], json.loads(content)


@pytest.fixture(params=["wsgi", "asgi"])
def post(request, live_server):
    """Post a delivery through one route: the Django view over WSGI, or the ASGI app."""
    if request.param == "asgi":
        return post_asgi

    def post_wsgi(body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
        answer = httpx.post(live_server.url + URL, content=body, headers=headers, timeout=10)
        return answer.status_code, answer.json()

    return post_wsgi


def test_hook02_a_held_database_is_answered_503_and_the_delivery_is_not_recorded_later(post):
    """HOOK-02, HOOK-04 (issue 11 item 1, issue 21 item 19): with the database held by another
    process, the delivery is answered 503 while the lock is still held (not after it), and a
    503 means "not recorded": once the lock goes nothing of it appears, so GitHub's log and
    ours agree. GitHub's redelivery then records it, once. Before issue 21 the delivery
    stayed queued and was recorded after its 503."""
    body, headers = delivery(5_100_001)
    with database_held() as holder:
        status, answer = post(body, headers)
        assert holder.poll() is None  # answered while the database was still held
    assert (status, answer) == (503, webhook_writer.BUSY.body)

    webhook_writer.writer.stop()  # returns once what was queued has been answered
    delivery_id = headers["X-GitHub-Delivery"]
    assert not WebhookDelivery.objects.filter(delivery_id=delivery_id).exists()
    assert not Job.objects.filter(github_id=5_100_001).exists()
    status, answer = post(body, headers)  # GitHub's redelivery: same id, same body
    assert (status, answer["ok"]) == (200, True)
    assert WebhookDelivery.objects.filter(delivery_id=delivery_id).count() == 1
    assert Job.objects.filter(github_id=5_100_001).count() == 1


def test_deliveries_queued_behind_a_held_burst_are_503_and_none_is_recorded_later():
    """Issue 21 item 19: a burst stuck behind a write lock, and the deliveries that queued
    behind it, are each answered 503 by their due time; when the lock lifts, not one of them
    is written (they were answered as failed), and none is left half-done."""
    with database_held():
        futures = [webhook_writer.submit(request_for(5_150_000 + i)) for i in range(5)]
        # Every one answered by its due time (with room for a loaded machine), the lock
        # still held: the writer stopped waiting for the database when the answer was due.
        done, _ = wait(futures, timeout=BUDGET + webhook_writer.LATE_GRACE + 5)
        assert len(done) == 5
    assert [webhook_writer.settle(f, None).status for f in futures] == [503] * 5
    webhook_writer.writer.stop()
    assert not Job.objects.filter(github_id__range=(5_150_000, 5_150_004)).exists()
    assert not WebhookDelivery.objects.exists()


def test_a_delivery_the_writer_never_began_is_withdrawn_when_its_route_gives_up(monkeypatch):
    """Issue 21 item 19: the route's last resort. A delivery still queued when its route's
    wait ends (the writer busy with another burst) is cancelled, so the writer skips it."""
    gate, taken = threading.Event(), threading.Event()
    real = webhook_writer.Writer._write

    def slow_write(self, items):
        taken.set()
        gate.wait(30)
        return real(self, items)

    monkeypatch.setattr(webhook_writer.Writer, "_write", slow_write)
    blocker = webhook_writer.submit(request_for(5_160_001))
    wait_until(taken.is_set)  # the writer holds this one: the next one stays queued
    queued = webhook_writer.submit(request_for(5_160_000))
    assert webhook_writer.past_due(queued)  # never begun: withdrawn
    gate.set()
    assert blocker.result(timeout=30).status == 200
    webhook_writer.writer.stop()
    assert not Job.objects.filter(github_id=5_160_000).exists()
    assert Job.objects.filter(github_id=5_160_001).exists()


def request_for(job_id: int) -> webhook_writer.Request:
    body, headers = delivery(job_id)
    return webhook_writer.Request(
        body=body,
        event=headers["X-GitHub-Event"],
        delivery_id=headers["X-GitHub-Delivery"],
        signature=headers["X-Hub-Signature-256"],
        received_at=timezone.now(),
        max_body=1024 * 1024,
    )


def test_hook04_deliveries_that_queue_behind_a_burst_are_written_as_one_and_wake_once(
    monkeypatch,
):
    """HOOK-04: what queued while a burst was writing is the next burst: one transaction and
    one reconcile wake for all of it, each delivery answered only once it has committed."""
    monkeypatch.setattr(webhook_writer, "ANSWER_BUDGET", 30.0)  # the hold is brief: no 503
    asked = wakes_asked()
    with database_held():
        first = webhook_writer.submit(request_for(5_200_000))
        wait_until(first.running)  # the writer took it alone and waits for the database
        rest = [webhook_writer.submit(request_for(5_200_001 + i)) for i in range(9)]
        assert not any(f.done() for f in (first, *rest))  # nothing answered before a commit
    answers = [f.result(timeout=30) for f in (first, *rest)]
    assert [a.status for a in answers] == [200] * 10
    assert Job.objects.filter(github_id__range=(5_200_000, 5_200_009)).count() == 10
    assert wakes_asked() == asked + 2  # one burst of 1, one of 9


def test_hook02_a_duplicate_or_a_failing_delivery_takes_no_other_delivery_of_its_burst(
    monkeypatch,
):
    """HOOK-02: each delivery of a burst is its own savepoint: a redelivery within the burst
    is a duplicate, and one whose write fails is rolled back alone and answered with its
    error, while the rest of the burst is recorded."""
    checked = [
        webhook_writer._check(request_for(5_300_000 + i), [WEBHOOK_SECRET]) for i in range(3)
    ]
    again = checked[0]
    real = webhooks.apply_job_update

    def failing_for_one(update, **kwargs):
        if update.github_id == 5_300_001:
            raise ValueError("this one breaks")
        return real(update, **kwargs)

    monkeypatch.setattr(webhooks, "apply_job_update", failing_for_one)
    # The one-by-one path; new queued jobs written together fail alone the same way
    # (tests/runners/test_webhook_bulk.py::test_a_row_that_breaks_the_group_fails_alone).
    monkeypatch.setattr(webhooks, "BULK_FROM", 10**6)
    answers = webhooks.record([*checked, again])

    assert answers[0] == webhooks.Outcome(
        200, {"ok": True, "delivery": again.delivery_id, "event": "workflow_job"}
    )
    assert isinstance(answers[1], ValueError)
    assert answers[2].status == 200
    assert answers[3] == webhooks.Outcome(200, {"duplicate": True, "delivery": again.delivery_id})
    assert set(Job.objects.values_list("github_id", flat=True)) == {5_300_000, 5_300_002}
    assert not WebhookDelivery.objects.filter(delivery_id=checked[1].delivery_id).exists()


def test_the_writer_writes_a_burst_again_on_a_fresh_connection_when_its_kept_one_broke(
    monkeypatch,
):
    """The writer keeps its connection between bursts; one that turns out broken (a
    PostgreSQL server restarted meanwhile) costs a second try, not the burst."""
    assert webhook_writer.submit(request_for(5_400_000)).result(timeout=30).status == 200
    real = webhooks.record
    calls = []

    def broken_once(deliveries):
        calls.append(len(deliveries))
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return real(deliveries)

    monkeypatch.setattr(webhooks, "record", broken_once)
    answer = webhook_writer.submit(request_for(5_400_001)).result(timeout=30)
    assert answer.status == 200
    assert calls == [1, 1]
    assert Job.objects.filter(github_id=5_400_001).count() == 1


def test_a_burst_of_answers_wakes_the_event_loop_once_and_every_route_sees_its_own():
    """The relay (runners/webhook_asgi.py): the writer answering 50 deliveries in a row
    costs one call into the loop, not 50; each route's waiter is done, a waiter whose
    future was done before it was watched too, and a closed loop raises nothing."""
    loop = asyncio.new_event_loop()
    calls = []
    real = loop.call_soon_threadsafe

    def counted(callback, *args):
        calls.append(callback)
        return real(callback, *args)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    relay = webhook_asgi._AnswerRelay()
    futures = [Future() for _ in range(50)]
    waiters = [relay.watch(f, loop) for f in futures]

    def answer_all() -> None:  # as the writer thread does, one after the other
        for i, future in enumerate(futures):
            future.set_result(i)

    writer = threading.Thread(target=answer_all)
    writer.start()
    writer.join()
    loop.run_until_complete(asyncio.wait_for(asyncio.gather(*waiters), 10))
    assert len(calls) == 1
    assert [f.result() for f in futures] == list(range(50))
    already = Future()
    already.set_result("early")
    loop.run_until_complete(asyncio.wait_for(relay.watch(already, loop), 10))
    assert len(calls) == 2
    loop.close()
    late = Future()
    relay.watch(late, loop)
    late.set_result(1)  # the loop closed before the answer: nothing raises, nothing is kept
    assert relay._ready == {}
