"""The reference receiver, over HTTP on loopback (CAP-19..21)."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from capacity import events
from capacity.receiver_reference import MAX_BODY, Receiver, serve
from tests.capacity.conftest import SECRET
from tests.capacity.receiver import MovableClock


@pytest.fixture
def running(tmp_path):

    clock = MovableClock(datetime(2026, 9, 5, 12, 0, tzinfo=UTC))
    calls = []

    def set_target(db, pool_id, target, event_id):
        calls.append((pool_id, target, event_id))
        if pool_id == "broken":
            raise RuntimeError("the autoscaler is down")
        db.execute(
            "INSERT OR REPLACE INTO targets (pool_id, target, event_id) VALUES (?, ?, ?)",
            (pool_id, target, event_id),
        )

    receiver = Receiver(SECRET, str(tmp_path / "r.db"), clock=clock, set_target=set_target)
    server = serve(receiver)
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    yield receiver, url, clock, calls
    server.shutdown()
    server.server_close()


def post(url, doc=None, *, raw=None, secret=SECRET, signature=None):
    body = raw if raw is not None else json.dumps(doc).encode()
    hdrs = {"X-Zoomies-Signature-256": signature or events.signature(body, secret)}
    return httpx.post(url, content=body, headers=hdrs, timeout=5)


def event(**kw):
    doc = {
        "schema_version": 1,
        "event_id": "e-1",
        "type": "capacity_demand",
        "timestamp": "2026-09-05T12:00:00Z",
        "pool_id": "7",
        "host_selector": {},
        "backend": "docker",
        "required_runner_slots": 3,
        "current_capacity": 8,
        "queued_job_count": 3,
        "oldest_queue_age_seconds": 74,
    }
    doc.update(kw)
    return doc


def test_cap20_a_good_event_sets_the_target_to_current_plus_required(running):
    receiver, url, _, _ = running
    assert post(url, event()).status_code == 204
    assert receiver.targets() == {"7": 11}
    down = event(event_id="e-2", type="scale_down_opportunity", required_runner_slots=-2)
    assert post(url, down).status_code == 204
    assert receiver.targets() == {"7": 6}


def test_cap19_refusals_each_with_the_contracts_status(running):
    receiver, url, _, calls = running
    assert post(url, event(), secret="another-secret-entirely").status_code == 401
    assert post(url, event(), signature="sha256=" + "0" * 64).status_code == 401
    assert post(url, raw=b"{not json").status_code == 400
    assert post(url, event(event_id="")).status_code == 400
    assert post(url, event(schema_version=2)).status_code == 400
    assert post(url, raw=b"x" * (MAX_BODY + 1)).status_code == 400
    assert calls == [] and receiver.event_ids() == []


def test_cap21_a_timestamp_outside_the_skew_window_is_rejected(running):
    receiver, url, clock, _ = running
    clock.advance(minutes=6)
    assert post(url, event()).status_code == 400
    clock.advance(minutes=-12)
    assert post(url, event()).status_code == 400
    clock.advance(minutes=10)  # 4 min after the stamp: inside the window
    assert post(url, event()).status_code == 204


def test_cap20_a_duplicate_event_id_is_answered_and_not_applied_twice(running):
    receiver, url, _, calls = running
    assert post(url, event()).status_code == 204
    assert post(url, event()).status_code == 204
    assert len(calls) == 1 and receiver.event_ids() == ["e-1"]


def test_cap20_the_event_id_is_unique_in_the_database(running, tmp_path):
    receiver, url, _, _ = running
    post(url, event())
    with sqlite3.connect(tmp_path / "r.db") as db, pytest.raises(sqlite3.IntegrityError):
        db.execute(
            "INSERT INTO events (event_id, type, pool_id, received_at) VALUES ('e-1', '', '', '')"
        )


def test_cap20_a_failed_autoscaler_is_503_and_keeps_nothing_so_a_retry_can_apply(running):
    receiver, url, _, calls = running
    assert post(url, event(pool_id="broken")).status_code == 503
    assert receiver.event_ids() == []
    assert post(url, event(pool_id="broken")).status_code == 503
    assert len(calls) == 2


def test_cap21_event_ids_are_kept_at_least_the_senders_cooldown(running):
    receiver, url, clock, calls = running
    assert receiver.retention >= timedelta(minutes=5)
    post(url, event())
    clock.advance(minutes=4)
    post(url, event(event_id="e-2", timestamp="2026-09-05T12:04:00Z"))
    assert receiver.event_ids() == ["e-1", "e-2"]
