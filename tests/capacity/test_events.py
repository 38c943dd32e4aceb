"""The event on the wire: body, headers, signature (CAP-09..12)."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from capacity import events
from capacity.planner import Reading

AT = datetime(2026, 9, 5, 12, 0, tzinfo=UTC)
SECRET = "k3Jx9-QpL2vNw8RtYb4ZcM7sHd1FgA6e"
READING = Reading(
    pool_id=123,
    pool_name="zoomies-linux-x64",
    host_selector=(("zone", "eu-west-1"),),
    backend="docker",
    platform="linux/x64",
    required_runner_slots=3,
    current_capacity=8,
    queued_job_count=3,
    oldest_queue_age_seconds=74,
)


def body(reading=READING, **kw) -> dict:
    doc = events.event_document(
        event_id="random-id", type="capacity_demand", at=AT, reading=reading, detail="why", **kw
    )
    return json.loads(events.render(doc))


def test_cap09_the_body_has_the_contracts_fields_in_its_order_and_types():
    doc = body()
    contract = [
        "schema_version",
        "event_id",
        "type",
        "timestamp",
        "pool_id",
        "host_selector",
        "backend",
        "required_runner_slots",
        "current_capacity",
        "queued_job_count",
        "oldest_queue_age_seconds",
    ]
    assert list(doc)[: len(contract)] == contract
    assert {k: doc[k] for k in contract} == {
        "schema_version": 1,
        "event_id": "random-id",
        "type": "capacity_demand",
        "timestamp": "2026-09-05T12:00:00Z",
        "pool_id": "123",
        "host_selector": {"zone": "eu-west-1"},
        "backend": "docker",
        "required_runner_slots": 3,
        "current_capacity": 8,
        "queued_job_count": 3,
        "oldest_queue_age_seconds": 74,
    }


def test_cap09_the_timestamp_is_utc_whatever_zone_the_clock_had():
    east = AT.astimezone(timezone(timedelta(hours=5)))
    assert events.timestamp(east) == "2026-09-05T12:00:00Z"
    with pytest.raises(ValueError):
        events.timestamp(datetime(2026, 9, 5, 12, 0))  # noqa: DTZ001 (naive on purpose)


def test_cap10_the_target_is_current_plus_required_in_slots():
    doc = body()
    assert doc["target_runner_slots"] == doc["current_capacity"] + doc["required_runner_slots"]
    down = body(reading=Reading(**{**READING.__dict__, "required_runner_slots": -2}))
    assert down["current_capacity"] + down["required_runner_slots"] == 6


def test_cap11_added_fields_leave_schema_version_1():
    doc = body(extra={"claim_code": "x", "host_name": "zoomies-spawn-1"})
    assert doc["schema_version"] == 1 and doc["claim_code"] == "x"
    with pytest.raises(ValueError):
        body(extra={"schema_version": 2})


def test_cap06_a_scale_from_zero_body_names_what_is_missing():
    reading = Reading(
        **{
            **READING.__dict__,
            "current_capacity": 0,
            "missing": (("backend", "docker"), ("host_selector", (("gpu", "a100"),))),
        }
    )
    assert body(reading=reading)["missing"] == {
        "backend": "docker",
        "host_selector": {"gpu": "a100"},
    }
    assert "missing" not in body()


def test_cap12_headers_carry_id_timestamp_and_the_hmac_of_the_exact_body():
    raw = events.render(
        events.event_document(
            event_id="e1", type="capacity_demand", at=AT, reading=READING, detail="d"
        )
    )
    hdrs = events.headers(event_id="e1", stamp="2026-09-05T12:00:00Z", body=raw, secret=SECRET)
    expected = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
    assert hdrs["X-Zoomies-Signature-256"] == expected
    assert hdrs["X-Zoomies-Signature-256"] == hdrs["X-Zoomies-Signature-256"].lower()
    assert hdrs["X-Zoomies-Event-ID"] == "e1"
    assert hdrs["X-Zoomies-Timestamp"] == "2026-09-05T12:00:00Z"
    assert events.verify(raw, expected, SECRET)
    # One byte more (even whitespace) is another body.
    assert not events.verify(raw + b" ", expected, SECRET)
    assert not events.verify(raw, None, SECRET)
