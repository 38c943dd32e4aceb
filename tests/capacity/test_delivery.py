"""Delivery against the reference receiver over HTTP, on a moved clock (CAP-12..18).

Each of the contract's three receiver-facing behaviours has a test here that a naive
sender would fail: a retry from the next pass after a 500, a new event id per try, and an
increment instead of a reading.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from accounts.models import AuditLog
from capacity import actions, events
from capacity.loop import step
from capacity.models import Attempt, AttemptState, Try
from capacity.problems import capacity_problems
from fleet.models import AgentTask, Host
from runners.models import Runner
from tests.capacity.conftest import SECRET, make_host, make_pool, queue_jobs
from tests.e2e.harness import free_port

pytestmark = pytest.mark.django_db


def scale_from_zero(clock, jobs=2):
    pool = make_pool()
    queue_jobs(jobs, at=clock.now)
    return pool


def test_cap12_the_receiver_sees_a_signed_body_with_the_contracts_headers(loop, receiver, clock):
    scale_from_zero(clock)
    loop.step()
    [arrival] = receiver.arrivals
    assert arrival.status == 204
    body = json.loads(arrival.body)
    assert body["schema_version"] == 1 and body["type"] == "capacity_demand"
    assert arrival.headers["x-zoomies-event-id"] == body["event_id"]
    assert arrival.headers["x-zoomies-timestamp"] == body["timestamp"] == "2026-09-05T12:00:00Z"
    assert events.verify(arrival.body, arrival.headers["x-zoomies-signature-256"], SECRET)
    assert Attempt.objects.get().state == AttemptState.DELIVERED


def test_cap05_cap06_scale_from_zero_reaches_the_receiver_and_a_matching_host_clears_it(
    loop, receiver, clock
):
    scale_from_zero(clock)
    loop.step()
    body = json.loads(receiver.arrivals[0].body)
    assert body["missing"] == {"backend": "docker", "platform": "linux/x64"}
    assert (body["required_runner_slots"], body["current_capacity"]) == (2, 0)
    assert receiver.reference.targets() == {body["pool_id"]: 2}
    make_host(capacity=4)
    loop.step(minutes=6)  # past the cooldown: nothing more to ask for
    assert len(receiver.arrivals) == 1


def test_cap13_a_500_gets_no_new_attempt_from_the_next_passes(loop, receiver, clock):
    """CAP-13/CAP-15: always 500; a pass every second for just under the cooldown.

    A naive sender starts a new delivery each pass that still sees the shortfall; Zoomies
    makes one attempt of three tries and then waits out the cooldown.
    """
    scale_from_zero(clock)
    receiver.down = True
    loop.step()
    for _ in range(299):
        loop.step(seconds=1)
    assert len(receiver.arrivals) == 3
    assert len({a.event_id for a in receiver.arrivals}) == 1
    attempt = Attempt.objects.get()
    assert (attempt.state, attempt.tries) == (AttemptState.FAILED, 3)
    loop.step(seconds=1)  # the cooldown has passed: a new attempt, a new event id
    assert len(receiver.arrivals) == 4 and receiver.arrivals[3].event_id != attempt.event_id


def test_cap14_every_try_of_an_attempt_has_one_event_id_and_the_same_bytes(loop, receiver, clock):
    """CAP-14: 500, 500, then the reference: three arrivals, one id, identical bodies; the
    receiver deduplicates, so a fourth copy changes nothing. Backoff 2 s, then 4 s."""
    scale_from_zero(clock)
    receiver.script = [500, 500]
    loop.step()
    loop.step(seconds=1)
    assert len(receiver.arrivals) == 1  # the backoff has not passed
    loop.step(seconds=1)
    assert len(receiver.arrivals) == 2
    loop.step(seconds=3)
    assert len(receiver.arrivals) == 2
    loop.step(seconds=1)
    assert len(receiver.arrivals) == 3
    assert len({a.event_id for a in receiver.arrivals}) == 1
    assert len({a.body for a in receiver.arrivals}) == 1
    assert len({a.headers["x-zoomies-signature-256"] for a in receiver.arrivals}) == 1
    assert [a.status for a in receiver.arrivals] == [500, 500, 204]
    tries = list(Try.objects.order_by("number").values_list("number", "outcome", "status_code"))
    assert tries == [(1, "refused", 500), (2, "refused", 500), (3, "accepted", 204)]
    assert receiver.reference.event_ids() == [receiver.arrivals[0].event_id]


def test_cap15_three_failures_are_recorded_raised_as_a_problem_and_left(loop, receiver, clock):
    scale_from_zero(clock)
    receiver.down = True
    loop.step()
    loop.step(seconds=2)
    loop.step(seconds=4)
    attempt = Attempt.objects.get()
    assert attempt.state == AttemptState.FAILED and "HTTP 500" in attempt.last_error
    [problem] = [
        p for p in capacity_problems(clock.now) if p["key"] == "capacity_demand.delivery_failed"
    ]
    assert problem["severity"] == "error" and attempt.event_id in problem["detail"]
    assert AuditLog.objects.filter(action="capacity_demand.delivery_failed").count() == 1
    # Delivered at the next attempt: the problem clears.
    receiver.down = False
    loop.step(minutes=5)
    assert not [
        p for p in capacity_problems(clock.now) if p["key"] == "capacity_demand.delivery_failed"
    ]


def test_cap16_an_unmet_shortfall_is_sent_again_under_a_new_id_with_the_same_reading(
    loop, receiver, clock
):
    """CAP-16: a naive sender adds what it asked before; the reading stays the same and so
    does the reference receiver's target."""
    pool = make_pool()
    host = make_host(capacity=2)

    for i in range(2):
        Runner.objects.create(
            name=f"zoomies-r-{i}",
            pool=pool,
            host=host,
            state="busy",
            created_at=clock.now,
            state_changed_at=clock.now,
        )
    queue_jobs(3, at=clock.now)
    loop.step()
    loop.step(minutes=5)
    first, second = (json.loads(a.body) for a in receiver.arrivals)
    assert first["event_id"] != second["event_id"]
    for key in ("required_runner_slots", "current_capacity", "queued_job_count"):
        assert first[key] == second[key], key
    assert (second["required_runner_slots"], second["current_capacity"]) == (3, 2)
    assert receiver.reference.targets() == {str(pool.pk): 5}
    assert second["oldest_queue_age_seconds"] == first["oldest_queue_age_seconds"] + 300


def test_cap13_a_receiver_down_for_three_cooldowns_sees_one_attempt_per_cooldown(
    loop, receiver, clock
):
    """Exactly three tries per cooldown per pool and type, a pass every 5 s for 15 min."""
    scale_from_zero(clock)
    receiver.down = True
    loop.step()
    for _ in range(15 * 12 - 1):
        loop.step(seconds=5)
    ids = [a.event_id for a in receiver.arrivals]
    assert len(ids) == 9 and len(set(ids)) == 3
    assert all(ids.count(i) == 3 for i in set(ids))
    starts = list(Attempt.objects.order_by("started_at").values_list("started_at", flat=True))
    assert [(b - a).total_seconds() for a, b in zip(starts, starts[1:], strict=False)] == [300, 300]


def test_cap17_a_try_in_flight_when_the_sender_vanished_counts_as_unanswered(loop, receiver, clock):
    """CAP-17 (rebuilt from rows): a try claimed and never finished is recovered after its
    lease, and the attempt carries on with its next try under the same event id."""

    scale_from_zero(clock)

    step(clock.now, dispatch=lambda _id: None, config=loop.config)
    attempt = Attempt.objects.get()
    claimed = actions.claim_try(attempt.pk, now=clock.now, timeout=loop.config.timeout)
    assert claimed.number == 1  # ... and the process that claimed it dies here
    loop.step(seconds=5)
    assert Attempt.objects.get().state == AttemptState.SENDING  # its lease has not run out
    loop.step(seconds=6)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.PENDING and attempt.tries == 1
    loop.step(seconds=2)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.DELIVERED and attempt.tries == 2
    assert [a.event_id for a in receiver.arrivals] == [attempt.event_id]
    assert list(Try.objects.order_by("number").values_list("outcome", flat=True)) == [
        "unanswered",
        "accepted",
    ]


def test_cap01_without_a_destination_nothing_is_planned_or_sent(loop, receiver, clock):

    scale_from_zero(clock)
    loop.config = dataclasses.replace(loop.config, destination_url="")
    loop.step()
    assert receiver.arrivals == [] and not Attempt.objects.exists()


def test_cap08_a_scale_down_opportunity_is_advisory_and_touches_nothing(loop, receiver, clock):
    """CAP-07/CAP-08: idle slots for the cooldown become one event; no host, runner or
    agent task is changed because of it."""

    pool = make_pool()
    host = make_host(capacity=4)
    Runner.objects.create(
        name="zoomies-r-1",
        pool=pool,
        host=host,
        state="busy",
        created_at=clock.now,
        state_changed_at=clock.now,
    )
    before = list(Host.objects.values())
    loop.step()
    assert receiver.arrivals == []  # seen, not yet for the cooldown
    loop.step(minutes=5)
    [arrival] = receiver.arrivals
    body = json.loads(arrival.body)
    assert body["type"] == "scale_down_opportunity"
    assert (body["required_runner_slots"], body["current_capacity"]) == (-3, 4)
    assert receiver.reference.targets() == {str(pool.pk): 1}
    assert list(Host.objects.values()) == before
    assert not AgentTask.objects.exists()
    assert Runner.objects.get().state == "busy"


@pytest.mark.parametrize("outcome", ["accepted", "refused", "unanswered"])
def test_cap13_whatever_the_outcome_one_attempt_per_cooldown(loop, receiver, clock, outcome):
    """CAP-13: passes every 10 s for a cooldown and a half; two attempts, 300 s apart."""

    scale_from_zero(clock)
    if outcome == "refused":
        receiver.down = True
    if outcome == "unanswered":  # nothing listens there: every try goes unanswered
        loop.config = dataclasses.replace(
            loop.config, destination_url=f"http://127.0.0.1:{free_port()}/"
        )
    loop.step()
    for _ in range(44):
        loop.step(seconds=10)
    attempts = list(Attempt.objects.order_by("started_at"))
    assert len(attempts) == 2
    assert (attempts[1].started_at - attempts[0].started_at).total_seconds() == 300
    outcomes = set(Try.objects.filter(attempt=attempts[0]).values_list("outcome", flat=True))
    assert outcomes == {outcome}


def test_cap13_cap14_a_receiver_down_past_the_cooldown_sees_one_attempt_per_pool_and_type(
    loop, receiver, clock
):
    """Issue 13's acceptance: two pools short of hosts and a third with idle excess, the
    receiver down for three cooldowns, a pass every 5 s. Each (pool, type) has its own
    cooldown: one attempt of three tries, under one event id, per cooldown for each, and
    none of them holds another."""
    make_pool()
    make_pool("zoomies-linux-arm64", labels=["linux-arm64"], platform="linux/arm64")
    queue_jobs(1, at=clock.now)
    queue_jobs(1, at=clock.now, labels=("self-hosted", "linux-arm64"))
    make_pool("zoomies-proc", labels=["proc"], backend="process")
    make_host("zoomies-idle", capacity=4, backends=["process"])
    receiver.down = True
    loop.step()
    for _ in range(15 * 12 - 1):
        loop.step(seconds=5)
        Host.objects.update(last_heartbeat_at=clock.now)  # the idle host stays alive
    by_key: dict[tuple[str, str], list[str]] = {}
    for arrival in receiver.arrivals:
        body = json.loads(arrival.body)
        by_key.setdefault((body["pool_name"], body["type"]), []).append(arrival.event_id)
    assert set(by_key) == {
        ("zoomies-linux-x64", "capacity_demand"),
        ("zoomies-linux-arm64", "capacity_demand"),
        ("zoomies-proc", "scale_down_opportunity"),
    }
    for key, ids in by_key.items():
        assert all(ids.count(i) == 3 for i in ids), key  # three tries, one event id each
        starts = list(
            Attempt.objects.filter(event_id__in=set(ids))
            .order_by("started_at")
            .values_list("started_at", flat=True)
        )
        gaps = [(b - a).total_seconds() for a, b in zip(starts, starts[1:], strict=False)]
        assert gaps and all(gap == 300 for gap in gaps), (key, gaps)
    # The demand pools asked at once and every cooldown after: 0, 5 and 10 minutes.
    assert len(set(by_key["zoomies-linux-x64", "capacity_demand"])) == 3
    assert len(set(by_key["zoomies-linux-arm64", "capacity_demand"])) == 3
