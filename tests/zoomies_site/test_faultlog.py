"""Known database faults are one line per change, not a traceback per try (issue 21 item 22)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError

from zoomies_site import qbroker
from zoomies_site.ticker import Periodic, Ticker

T0 = datetime(2026, 12, 5, tzinfo=UTC)


def test_a_read_only_database_for_30_ticks_is_two_lines_and_no_traceback(caplog):
    """The 30 s read-only drill wrote `periodic reconcile failed` with a stack 30 times: now
    the first failure is one warning, the retries are quiet, the recovery one line."""
    caplog.set_level(logging.DEBUG, logger="zoomies.controller")
    outcomes = [OperationalError("attempt to write a readonly database")] * 30 + [None]

    def run(now):
        if (fault := outcomes.pop(0)) is not None:
            raise fault

    ticker = Ticker(jobs=[Periodic("reconcile", lambda: timedelta(0), run)])
    for second in range(31):
        ticker.step(T0 + timedelta(seconds=second))

    said = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.getMessage() for r in said] == [
        "periodic reconcile failed: the database refused (attempt to write a readonly "
        "database); retrying, quietly until it works",
        "periodic reconcile works again after 30 failed tries",
    ]
    assert not any(r.exc_info for r in caplog.records)


def test_a_fault_of_ours_keeps_its_traceback_every_time(caplog):
    """A bug is not the database's state: each one is logged with its stack."""
    caplog.set_level(logging.INFO, logger="zoomies.controller")

    def run(now):
        raise KeyError("a bug")

    ticker = Ticker(jobs=[Periodic("reconcile", lambda: timedelta(0), run)])
    for second in range(3):
        ticker.step(T0 + timedelta(seconds=second))
    failed = [r for r in caplog.records if r.getMessage() == "periodic reconcile failed"]
    assert len(failed) == 3 and all(r.exc_info for r in failed)


def test_the_task_queue_look_rides_out_a_database_fault_instead_of_killing_the_pusher(
    monkeypatch, caplog
):
    """django-q2's pusher dies on an exception from the broker (a traceback, a 10 s sleep,
    and the sentinel's 'reincarnated pusher' line): our broker's look answers "nothing yet"
    through a database fault and says so once."""
    caplog.set_level(logging.INFO, logger="zoomies.workers")
    monkeypatch.setattr(qbroker.Conf, "POLL", 0.01)
    broker = qbroker.WakeableORM.__new__(qbroker.WakeableORM)
    monkeypatch.setattr(broker, "_wake_listener", lambda: None)
    faults = iter([OperationalError("database is locked")] * 3)

    def take():
        if (fault := next(faults, None)) is not None:
            raise fault
        return [(1, "payload")]

    monkeypatch.setattr(broker, "_take", take)
    assert [broker.dequeue() for _ in range(4)] == [None, None, None, [(1, "payload")]]
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "the task queue's look for tasks failed: the database refused (database is locked); "
        "retrying, quietly until it works",
        "the task queue's look for tasks works again after 3 failed tries",
    ]


@pytest.fixture(autouse=True)
def _fresh_broker_faults(monkeypatch):
    monkeypatch.setattr(
        qbroker, "_faults", qbroker.FaultLog(qbroker._faults.log, qbroker._faults.what)
    )
