"""The webhook inbox: on SQLite, deliveries are kept durably in a file of their own first.

SQLite has one write lock for the whole database, and in a burst of jobs the reconcile pass,
the agents' takes, results and reports all queue for it: the webhook writer waited for it
behind them, so GitHub's deliveries were answered slowly and the burst's jobs reached the
database late (docs/performance.md, round 9). The inbox is a second SQLite file beside the
database (`<database>-inbox`) that only the webhook path writes. The writer commits a burst's
verified deliveries there, which no other writer contends for, and answers them; the
applier thread then records them in the database (`runners.webhooks.record`, the same
savepoints, dedupe and job moves as before) in batches, and deletes them from the inbox only
after that commit. So:

* nothing is answered 2xx before it is durable (the inbox's commit, WAL as the database);
* a delivery id seen before is answered as a duplicate, from the database or the inbox
  (the writer holds the inbox's lock while it looks, and the applier deletes only under it);
* a killed process loses nothing: the next start's applier records what the inbox holds
  (`record` skips what was already recorded, so applying twice is harmless);
* a long write lock on the database no longer turns deliveries away: they wait here.

PostgreSQL has no file-wide write lock, and several web processes share it: there the writer
records directly, as before (`enabled()`).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection, connections

from runners import webhooks

log = logging.getLogger("zoomies.webhooks")

# The most deliveries the applier records in one transaction of the database.
APPLY_BATCH = 256
# After a failed apply (the database locked or gone) the applier waits this long, doubling
# to APPLY_BACKOFF_MAX, and tries the same deliveries again; none is dropped.
APPLY_BACKOFF = 0.05
APPLY_BACKOFF_MAX = 2.0
THREAD_NAME = "webhook-applier"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS delivery (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id TEXT NOT NULL UNIQUE,
    event TEXT NOT NULL,
    body BLOB NOT NULL,
    received_at TEXT NOT NULL,
    failed TEXT
)
"""


def enabled() -> bool:
    """The inbox is used on SQLite unless the settings turn it off (WEBHOOK_INBOX)."""
    return connection.vendor == "sqlite" and bool(getattr(settings, "WEBHOOK_INBOX", True))


def path() -> Path:
    """The inbox file: beside the database file, named after it (a test database has its own)."""
    return Path(f"{connection.settings_dict['NAME']}-inbox")


@dataclass(frozen=True)
class Kept:
    """A delivery the inbox holds: its order, and what `record` needs."""

    seq: int
    delivery: webhooks.Delivery


class Inbox:
    """One connection to the inbox file; each thread that uses the inbox opens its own."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.db = sqlite3.connect(file, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        # As the database's own setting (zoomies_site/settings.py): a commit survives the
        # process being killed; an operating system crash may lose the last moments of both.
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    def keep(
        self, deliveries: Sequence[tuple[webhooks.Delivery, bytes]], *, wait: float
    ) -> tuple[list[webhooks.Outcome], list[Kept]]:
        """Keep the new deliveries in one commit; an answer for each, in order: ok, or a
        duplicate of one recorded in the database or kept here; and what was kept. Waits
        for the inbox's lock at most `wait` seconds (sqlite3.OperationalError after that:
        nothing was kept)."""
        self.db.execute(f"PRAGMA busy_timeout = {max(int(wait * 1000), 1)}")
        self.db.execute("BEGIN IMMEDIATE")
        try:
            ids = [delivery.delivery_id for delivery, _ in deliveries]
            # Under the inbox's lock: the applier deletes a delivery from here only after the
            # database has it, and only under this lock, so each is in one place or the other.
            seen = recorded_ids(ids)
            answers = []
            kept = []
            for delivery, body in deliveries:
                inserted = 0
                if delivery.delivery_id not in seen:
                    cursor = self.db.execute(
                        "INSERT OR IGNORE INTO delivery (delivery_id, event, body, received_at)"
                        " VALUES (?, ?, ?, ?)",
                        (delivery.delivery_id, delivery.event, body,
                         delivery.received_at.isoformat()),
                    )  # fmt: skip
                    inserted = cursor.rowcount
                    if inserted:
                        kept.append(Kept(cursor.lastrowid or 0, delivery))
                seen.add(delivery.delivery_id)
                if inserted:
                    answers.append(
                        webhooks.Outcome(200, {"ok": True, "delivery": delivery.delivery_id,
                                               "event": delivery.event})
                    )  # fmt: skip
                else:
                    answers.append(
                        webhooks.Outcome(200, {"duplicate": True, "delivery": delivery.delivery_id})
                    )
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
        return answers, kept

    def pending(
        self, limit: int, *, parsed: dict[int, webhooks.Delivery] | None = None
    ) -> list[Kept]:
        """The oldest deliveries kept and not yet recorded, nor set aside: as `parsed` holds
        them (this process kept them), else parsed again from their bodies."""
        parsed = parsed or {}
        rows = self.db.execute(
            "SELECT seq, delivery_id, event, body, received_at FROM delivery"
            " WHERE failed IS NULL ORDER BY seq LIMIT ?",
            (limit,),
        ).fetchall()
        kept = []
        for seq, delivery_id, event, body, received_at in rows:
            known = parsed.get(seq)
            if known is not None and known.delivery_id == delivery_id:
                kept.append(Kept(seq, known))
                continue
            again = webhooks.parse(
                body=body, event=event, delivery_id=delivery_id,
                now=datetime.fromisoformat(received_at),
            )  # fmt: skip
            if isinstance(again, webhooks.Outcome):  # it parsed when it was kept
                self.fail(seq, f"its body no longer parses: {again.body}")
                continue
            kept.append(Kept(seq, again))
        return kept

    def done(self, seqs: Sequence[int]) -> None:
        """Forget deliveries the database has committed."""
        self.db.execute("PRAGMA busy_timeout = 30000")
        for start in range(0, len(seqs), 500):  # under SQLite's limit on bound parameters
            chunk = seqs[start : start + 500]
            marks = ",".join("?" * len(chunk))
            self.db.execute(f"DELETE FROM delivery WHERE seq IN ({marks})", chunk)  # noqa: S608

    def fail(self, seq: int, error: str) -> None:
        """Keep a delivery whose recording failed (a fault of ours), out of the way: the
        next start tries it again, and its id still answers redeliveries as duplicates."""
        self.db.execute("PRAGMA busy_timeout = 30000")
        self.db.execute("UPDATE delivery SET failed = ? WHERE seq = ?", (error[:2000], seq))

    def retry_failed(self) -> int:
        """Put every delivery set aside back in line (a start); how many there were."""
        self.db.execute("PRAGMA busy_timeout = 30000")
        return self.db.execute(
            "UPDATE delivery SET failed = NULL WHERE failed IS NOT NULL"
        ).rowcount


def recorded_ids(ids: Sequence[str]) -> set[str]:
    """The delivery ids of `ids` the database has recorded (a read: SQLite's WAL readers
    wait for no writer)."""
    from runners.models import WebhookDelivery  # noqa: PLC0415  # the apps are loaded by now

    # One plain statement a burst (the ORM's queryset costs more than the look-up itself).
    table = WebhookDelivery._meta.db_table
    found: set[str] = set()
    with connection.cursor() as cursor:
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            marks = ",".join(["%s"] * len(chunk))
            cursor.execute(
                f"SELECT delivery_id FROM {table} WHERE delivery_id IN ({marks})",  # noqa: S608
                chunk,
            )
            found.update(row[0] for row in cursor.fetchall())
    return found


class Applier:
    """The thread that records what the inbox keeps, oldest first, in batches."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # What this process kept, as parsed then, by seq: the applier need not parse it again.
        # Only seqs above the last batch's are taken: one the applier already recorded (it
        # found the row before the writer handed it over) would never be removed.
        self._parsed: dict[int, webhooks.Delivery] = {}
        self._recorded_upto = 0
        # Counted wakes: the applier is idle only if none came since it last looked.
        self._asked = 0
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def start(self) -> Applier:
        self._thread.start()
        return self

    def wake(self, kept: Sequence[Kept] = ()) -> None:
        """Look at the inbox now; `kept`: what the writer has just kept there, parsed."""
        with self._lock:
            self._parsed.update((k.seq, k.delivery) for k in kept if k.seq > self._recorded_upto)
            self._asked += 1
            self._idle.clear()
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Record what is kept (within `timeout`), then end the thread."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def wait_idle(self, timeout: float) -> bool:
        """True once the inbox holds nothing the applier can record now."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        inbox = Inbox(self.file)
        backoff = APPLY_BACKOFF
        try:
            # A start tries again what an earlier process set aside (the fault may be fixed).
            retried = inbox.retry_failed()
            if retried:
                log.warning("webhook inbox: trying again %d deliveries set aside before", retried)
            while True:
                with self._lock:
                    asked = self._asked
                try:
                    applied = self._apply(inbox)
                    backoff = APPLY_BACKOFF
                except (DatabaseError, sqlite3.Error) as exc:
                    # The database (or the inbox) is busy or gone: the same deliveries again,
                    # later; none is dropped.
                    log.warning("webhook inbox: recording failed, trying again in %.2f s: %s",
                                backoff, exc)  # fmt: skip
                    _close_connections()
                    if self._stopping.wait(backoff):
                        return
                    backoff = min(backoff * 2, APPLY_BACKOFF_MAX)
                    continue
                if applied:
                    continue  # more may be kept: look again at once
                with self._lock:
                    if self._asked == asked:
                        self._idle.set()
                if self._stopping.is_set():
                    return
                self._wake.wait()
                self._wake.clear()
        finally:
            inbox.close()
            _close_connections()

    def _apply(self, inbox: Inbox) -> int:
        """Record one batch; how many deliveries it held (0: nothing waits)."""
        with self._lock:
            parsed = dict(self._parsed)
        kept = inbox.pending(APPLY_BATCH, parsed=parsed)
        if not kept:
            return 0
        answers = _record(kept)
        recorded = []
        for item, answer in zip(kept, answers, strict=True):
            if isinstance(answer, Exception):
                # Logged where it failed; kept aside, so it neither blocks the rest nor is
                # lost, and tried again at the next start.
                inbox.fail(item.seq, f"{type(answer).__name__}: {answer}")
            else:
                recorded.append(item.seq)
        inbox.done(recorded)
        with self._lock:
            self._recorded_upto = max(self._recorded_upto, kept[-1].seq)
            for seq in [s for s in self._parsed if s <= self._recorded_upto]:
                del self._parsed[seq]
        return len(kept)


def _record(kept: Sequence[Kept]) -> list[webhooks.Outcome | Exception]:
    """`webhooks.record` for a batch; if it fails other than by the database (a fault of ours
    outside any one delivery's savepoint), each delivery alone, so that only the one at
    fault is set aside. A database error raises: the batch is tried again whole."""
    try:
        return webhooks.record([k.delivery for k in kept])
    except (DatabaseError, sqlite3.Error):
        raise
    except Exception:
        log.exception("webhook inbox: a batch of %d failed; recording each alone", len(kept))
    answers: list[webhooks.Outcome | Exception] = []
    for item in kept:
        try:
            answers.extend(webhooks.record([item.delivery]))
        except (DatabaseError, sqlite3.Error):
            raise
        except Exception as exc:
            log.exception("webhook inbox: delivery %s could not be recorded",
                          item.delivery.delivery_id)  # fmt: skip
            answers.append(exc)
    return answers


def _close_connections() -> None:
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


_lock = threading.Lock()
_appliers: dict[Path, Applier] = {}


def applier() -> Applier:
    """This process's applier for the current database's inbox, started on first use."""
    file = path()
    with _lock:
        found = _appliers.get(file)
        if found is None or not found.alive():
            found = _appliers[file] = Applier(file).start()
        return found


def counts_now() -> tuple[int, int] | None:
    """(waiting, set aside) in the current database's inbox, read without writing; None
    when there is no inbox (PostgreSQL, or no file yet). For the metrics' scrape."""
    if connection.vendor != "sqlite" or not path().exists():
        return None
    db = sqlite3.connect(f"file:{path()}?mode=ro", uri=True, timeout=5)
    try:
        waiting, failed = db.execute(
            "SELECT COUNT(*) - COUNT(failed), COUNT(failed) FROM delivery"
        ).fetchone()
        return waiting, failed
    except sqlite3.Error:
        return None  # not yet set up by its first writer
    finally:
        db.close()


def drain_at_start() -> bool:
    """At a server's start on SQLite: record what an earlier process kept and did not record
    (killed, or stopped with the database locked), even with the inbox turned off since, as
    those deliveries were answered 200 and GitHub will not send them again. True when an
    applier was started for it."""
    if connection.vendor != "sqlite":
        return False
    file = path()
    if not enabled() and not file.exists():
        return False
    found = counts_now()
    if found is not None:
        waiting, failed = found
        if waiting or failed:
            log.warning("webhook inbox: %d deliveries kept by an earlier process (%d set aside "
                        "then): recording them", waiting + failed, failed)  # fmt: skip
    applier().wake()
    return True


def stop_appliers(timeout: float = 30.0) -> list[Path]:
    """Stop this process's appliers, each after recording what it can within `timeout`;
    the inbox files they served."""
    with _lock:
        stopping = list(_appliers.values())
        _appliers.clear()
    for each in stopping:
        each.stop(timeout)
    return [each.file for each in stopping]


def settle(timeout: float = 10.0) -> bool:
    """Wait until this process's applier has recorded what the inbox holds (tests, and a
    stopping server). True when it has."""
    with _lock:
        running = [a for a in _appliers.values() if a.alive()]
    deadline = time.monotonic() + timeout
    return all(a.wait_idle(max(deadline - time.monotonic(), 0)) for a in running)
