"""Webhook deliveries recorded in bursts by one long-lived thread (group commit).

Both routes of `POST /webhooks/github` (runners.webhook_asgi under daphne, the Django view
under WSGI) hand each delivery to `submit` and wait for its answer at most ANSWER_BUDGET
seconds (issue 11 item 1). One thread per process takes whatever has queued, checks each
delivery and records them all in ONE transaction (`runners.webhooks.record`), then answers
each. So under load a commit, the connection and the reconcile wake are paid once per
burst, not once per delivery (docs/performance.md has the profile); with one delivery at a
time it is the same single transaction as before.

Nothing is answered 2xx before its transaction has committed: a delivery is never lost
once answered 2xx. Nor is one answered 503 recorded afterwards (issue 21 item 19: under a
long write lock 41 of 42 deliveries answered 503 were recorded once it lifted, so GitHub's
log showed failures that had gone through, and one was lost). Each delivery carries the
time its answer is due; the writer bounds its wait for the database by that time (SQLite's
busy timeout, PostgreSQL's lock and statement timeouts), answers a delivery it reaches too
late with 503 without writing it, and the route waits a little past the due time for the
writer's own answer, cancelling a delivery the writer has not begun. So a 503 means "not
recorded": GitHub's redelivery (the operator's, or the hook-deliveries sweep) records it.
On SQLite (unless WEBHOOK_INBOX is off) the writer does not record a burst itself: it keeps
it in the webhook inbox, a file of its own, answers it, and the inbox's applier records it
(runners/webhook_inbox.py). The answer's rules above hold for the inbox's commit.
The thread keeps its database connection between bursts (it is ours, not one of Django's
request threads, which Django closes after each request); it closes it on any database
error and when stopped.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    connection,
    connections,
    transaction,
)

from runners import webhook_inbox, webhooks
from runners.github.config import webhook_max_body, webhook_secrets
from zoomies_site.core import metrics
from zoomies_site.core.registry import CACHE_SECONDS

log = logging.getLogger("zoomies.webhooks")

# Issue 11 item 1: the longest a delivery waits for the database before it is answered 503.
# GitHub gives up after 10 s and never redelivers by itself; a clear 503 well inside that is
# one the operator's redelivery (or the hook-deliveries sweep) can make good, a timeout is not.
ANSWER_BUDGET = 5.0
BUSY = webhooks.Outcome(
    503, {"error": "the database is busy; the delivery was not recorded in time, redeliver it"}
)
FAILED = webhooks.Outcome(500, {"error": "the delivery could not be processed"})
# The route waits this much past a delivery's due time for the writer's own answer: the
# writer has stopped waiting for the database by then, but a commit may be finishing.
LATE_GRACE = 2.0
# The latest a route answers, whatever the writer does: GitHub gives up after 10 s.
LAST_ANSWER = 9.0
# A delivery the writer reaches with less time than this left is not begun: answered 503.
MIN_WRITE_SECONDS = 0.05
# The most deliveries one transaction takes: a burst larger than this is written in several,
# so no single transaction holds SQLite's write lock for long.
MAX_BURST = 64
THREAD_NAME = "webhook-writer"


@dataclass(frozen=True)
class Request:
    """What the routes read from HTTP: the raw body and the GitHub headers."""

    body: bytes
    event: str | None
    delivery_id: str | None
    signature: str | None
    received_at: datetime
    max_body: int
    # time.monotonic() by which the delivery is answered; the writer writes it by then or not
    # at all. By default the budget from now (the routes pass their own).
    answer_by: float = field(default_factory=lambda: time.monotonic() + ANSWER_BUDGET)


class TooLate(OperationalError):
    """The delivery's answer was due before the database took it: answered 503, unwritten."""


_STOP = object()


class Writer:
    """The thread that records deliveries; started by the first `submit`."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # The writer thread's own connection to the inbox (a thread a timed-out stop left
        # behind keeps its own).
        self._local = threading.local()

    def submit(self, request: Request) -> Future[webhooks.Outcome]:
        """Queue a delivery; the future holds its answer once its burst has committed."""
        future: Future[webhooks.Outcome] = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, args=(self._queue,), name=THREAD_NAME, daemon=True
                )
                self._thread.start()
            self._queue.put((request, future))
        return future

    def stop(self, timeout: float = 30.0) -> None:
        """Answer what is queued, close the thread's connection and end it."""
        with self._lock:
            thread, self._thread = self._thread, None
            # The next submit starts a thread on a queue of its own.
            stopping, self._queue = self._queue, queue.SimpleQueue()
            stopping.put(_STOP)
        if thread is not None:
            thread.join(timeout)

    def _run(self, inbox: queue.SimpleQueue[Any]) -> None:
        try:
            while True:
                burst = [inbox.get()]
                while len(burst) < MAX_BURST:
                    try:
                        burst.append(inbox.get_nowait())
                    except queue.Empty:
                        break
                items = [item for item in burst if item is not _STOP]
                try:
                    if items:
                        self._write(items)
                except Exception as exc:  # a fault of ours: answer, and keep the thread
                    log.exception("webhook writer: a burst of %d failed", len(items))
                    for _, future in items:
                        if not future.done():
                            future.set_exception(exc)
                if len(items) < len(burst):
                    return
        finally:
            self._close_inbox()
            _close_connections()

    def _write(self, items: list[tuple[Request, Future[webhooks.Outcome]]]) -> None:
        items = [
            (request, future) for request, future in items if future.set_running_or_notify_cancel()
        ]
        now = time.monotonic()
        late = [(r, f) for r, f in items if r.answer_by - now < MIN_WRITE_SECONDS]
        for _, future in late:
            future.set_exception(TooLate("its answer was due before the database took it"))
        items = [(r, f) for r, f in items if r.answer_by - now >= MIN_WRITE_SECONDS]
        if not items:
            return
        try:
            secrets = webhook_secrets()
            remember_max_body(webhook_max_body())
        except Exception as exc:  # the settings could not be read: nothing is checked
            _close_connections()
            for _, future in items:
                future.set_exception(exc)
            return
        to_record: list[tuple[webhooks.Delivery, Future[webhooks.Outcome]]] = []
        bodies: dict[str, bytes] = {}
        for request, future in items:
            try:
                checked = _check(request, secrets)
            except Exception as exc:
                future.set_exception(exc)
                continue
            if isinstance(checked, webhooks.Outcome):
                future.set_result(checked)  # refused: nothing to write
            else:
                to_record.append((checked, future))
                bodies[checked.delivery_id] = request.body
        if not to_record:
            return
        answer_by = min(request.answer_by for request, _ in items)
        if webhook_inbox.enabled():
            self._keep(to_record, bodies, answer_by)
            return
        try:
            answers = _record([delivery for delivery, _ in to_record], answer_by=answer_by)
        except Exception as exc:
            for _, future in to_record:
                future.set_exception(exc)
            return
        for answer, (_, future) in zip(answers, to_record, strict=True):
            if isinstance(answer, Exception):
                future.set_exception(answer)
            else:
                future.set_result(answer)

    def _keep(
        self,
        to_record: list[tuple[webhooks.Delivery, Future[webhooks.Outcome]]],
        bodies: dict[str, bytes],
        answer_by: float,
    ) -> None:
        """On SQLite: keep the burst in the inbox (runners.webhook_inbox), answer it, and wake
        the applier that records it in the database."""
        try:
            left = answer_by - time.monotonic()
            if left < MIN_WRITE_SECONDS:
                raise TooLate("its answer was due before the inbox took it")
            file = webhook_inbox.path()
            inbox = getattr(self._local, "inbox", None)
            if inbox is None or inbox.file != file:
                self._close_inbox()
                inbox = self._local.inbox = webhook_inbox.Inbox(file)
            answers, kept = inbox.keep(
                [(delivery, bodies[delivery.delivery_id]) for delivery, _ in to_record],
                wait=left,
            )
        except (sqlite3.Error, DatabaseError) as exc:
            self._close_inbox()
            _close_connections()
            error = exc if isinstance(exc, DatabaseError) else OperationalError(str(exc))
            for _, future in to_record:
                future.set_exception(error)
            return
        if kept:
            webhook_inbox.applier().wake(kept)
        for answer, (_, future) in zip(answers, to_record, strict=True):
            future.set_result(answer)

    def _close_inbox(self) -> None:
        inbox = getattr(self._local, "inbox", None)
        if inbox is not None:
            inbox.close()
            self._local.inbox = None


def _check(request: Request, secrets: list[str]) -> webhooks.Outcome | webhooks.Delivery:
    return webhooks.check(
        body=request.body,
        event=request.event,
        delivery_id=request.delivery_id,
        signature=request.signature,
        secrets=secrets,
        now=request.received_at,
        max_body=request.max_body,
    )


def _record(
    deliveries: list[webhooks.Delivery], *, answer_by: float
) -> list[webhooks.Outcome | Exception]:
    """`webhooks.record` on this thread's kept connection, and once more on a fresh one if
    that failed on a connection kept from an earlier burst (a PostgreSQL server restarted
    since) and time is left. Either try waits for the database only until `answer_by`."""
    kept = any(conn.connection is not None for conn in connections.all(initialized_only=True))
    try:
        _bound_database_waits(answer_by)
        return webhooks.record(deliveries)
    except TooLate:
        raise
    except (OperationalError, InterfaceError) as exc:
        _close_connections()
        if not kept:
            raise
        log.warning(
            "webhook writer: a burst of %d failed (%s); writing it again", len(deliveries), exc
        )
    except DatabaseError:
        _close_connections()
        raise
    try:
        _bound_database_waits(answer_by)
        return webhooks.record(deliveries)
    except DatabaseError:
        _close_connections()
        raise


def _bound_database_waits(answer_by: float) -> None:
    """This thread's connection waits for locks (and runs a statement) no longer than until
    `answer_by`; TooLate if that has passed. The connection is the writer's alone, so the
    setting stays with it and is simply set again for the next burst."""
    left = answer_by - time.monotonic()
    if left < MIN_WRITE_SECONDS:
        raise TooLate("its answer was due before the database took it")
    connection.ensure_connection()
    millis = max(int(left * 1000), 1)
    if connection.vendor == "sqlite":
        connection.connection.execute(f"PRAGMA busy_timeout = {millis}")
    elif connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, false),"
                " set_config('statement_timeout', %s, false)",
                [f"{millis}ms", f"{millis}ms"],
            )


def _close_connections() -> None:
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


# The size cap as the writer last read it, so the ASGI route can refuse an oversize body
# before reading it without a database read of its own: (time.monotonic() read, bytes).
_max_body: tuple[float, int] | None = None


def remember_max_body(value: int) -> int:
    global _max_body
    _max_body = (time.monotonic(), value)
    return value


def known_max_body() -> int | None:
    """The cap read within the registry's own cache period, or None (read it afresh)."""
    known = _max_body
    if known is None or time.monotonic() - known[0] >= CACHE_SECONDS:
        return None
    return known[1]


writer = Writer()


def submit(request: Request) -> Future[webhooks.Outcome]:
    return writer.submit(request)


def settle(future: Future[webhooks.Outcome], delivery_id: str | None) -> webhooks.Outcome:
    """The answer for a finished future: its outcome, a 503 for a database error, else 500."""
    try:
        outcome = future.result(timeout=0)
    except DatabaseError as exc:
        log.warning("webhook delivery %s answered 503: %s", delivery_id, exc)
        outcome = BUSY
    except Exception:
        log.exception("webhook delivery %s failed", delivery_id)
        outcome = FAILED
    metrics.webhook_delivery(outcome.status, outcome.body)
    return outcome


def busy(delivery_id: str | None, *, unknown: bool = False) -> webhooks.Outcome:
    """The 503 for a delivery not recorded within the budget. `unknown`: the writer was
    still inside its transaction at the last moment to answer (a commit stuck past every
    bound), so it may yet be recorded; a redelivery is then a duplicate (HOOK-02)."""
    if unknown:
        log.error("webhook delivery %s answered 503 while its write was still in progress: "
                  "it may yet be recorded", delivery_id)  # fmt: skip
    else:
        log.warning("webhook delivery %s answered 503: not recorded within %.0f s",
                    delivery_id, ANSWER_BUDGET)  # fmt: skip
    metrics.webhook_delivery(BUSY.status, BUSY.body)
    return BUSY


def past_due(future: Future[webhooks.Outcome]) -> bool:
    """A route's wait ran past the due time and the grace: True if the delivery was never
    begun and is now withdrawn (answer 503, it will not be written); False if the writer
    holds it (wait for its answer)."""
    return future.cancel()


def answer(request: Request) -> webhooks.Outcome:
    """The synchronous route's answer (the WSGI view): recorded within ANSWER_BUDGET, or 503.

    Inside a transaction of the caller's (a test's, or ATOMIC_REQUESTS) the delivery is
    recorded on the caller's connection instead: the writer's connection could not see the
    caller's uncommitted rows, nor the caller the writer's.
    """
    if transaction.get_connection().in_atomic_block:
        return _inline(request)
    future = submit(request)
    done, _ = wait([future], timeout=request.answer_by - time.monotonic() + LATE_GRACE)
    if not done:
        if past_due(future):
            return busy(request.delivery_id)
        last = request.answer_by - ANSWER_BUDGET + LAST_ANSWER
        done, _ = wait([future], timeout=max(last - time.monotonic(), 0))
        if not done:
            return busy(request.delivery_id, unknown=True)
    return settle(future, request.delivery_id)


def _inline(request: Request) -> webhooks.Outcome:
    future: Future[webhooks.Outcome] = Future()
    try:
        checked = _check(request, webhook_secrets())
        if isinstance(checked, webhooks.Outcome):
            future.set_result(checked)
        else:
            (recorded,) = webhooks.record([checked])
            if isinstance(recorded, Exception):
                future.set_exception(recorded)
            else:
                future.set_result(recorded)
    except Exception as exc:
        future.set_exception(exc)
    return settle(future, request.delivery_id)
