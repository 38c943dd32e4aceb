"""The spawn backstop and the provision-failure deferral on a moved clock (ESC-10, ESC-11,
ESC-14..19, ESC-21..25, ESC-27, ESC-28, ESC-30, ESC-31).

The sweep runs at most once a minute (ESC-14), so each timing is asserted at the first
once-a-minute sweep at or after it is due, with the steps in between doing nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone
from prometheus_client import REGISTRY

from capacity import claims
from capacity.backstop import (
    SWEEP_MARK,
    deferral_for,
    outcome_retention,
    record_provision_failure,
)
from capacity.models import (
    Attempt,
    AttemptState,
    ProvisionFailures,
    ProvisionOutcome,
    Spawn,
    SpawnState,
)
from capacity.snapshot import build
from fleet.models import Host
from tests.capacity.conftest import Loop, make_pool, queue_jobs
from zoomies_site.core.models import Lease

pytestmark = pytest.mark.django_db


@pytest.fixture
def claiming(loop):
    loop.config = dataclasses.replace(loop.config, claim_codes=True)
    loop.clock.now = timezone.now().replace(microsecond=0)
    return loop


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def last_swept():
    return Lease.objects.get(name=SWEEP_MARK).acquired_at


def events_of(receiver, type):
    return [json.loads(a.body) for a in receiver.arrivals if json.loads(a.body)["type"] == type]


def start_scale_up(loop):
    make_pool()
    queue_jobs(1, at=loop.clock.now)
    loop.step()
    return Spawn.objects.get()


def join_spawn(spawn, at):
    """The machine joined under the spawn's name (the claim path is tested in test_claims)."""
    return Host.objects.create(
        name=spawn.host_name,
        capacity=1,
        backends=["podman"],  # another backend: the pool's demand stays, the clock is ours
        platform="linux/x64",
        joined_at=at,
        last_heartbeat_at=at,
    )


def test_esc14_esc15_a_provision_not_joined_within_5_minutes_is_torn_down_at_the_next_sweep(
    claiming, receiver
):
    destination = receiver.url
    timeouts = sample("zoomies_capacity_provision_timeouts_total", destination=destination)
    downs = sample(
        "zoomies_capacity_scale_down_emitted_total", destination=destination, reason="spawn-timeout"
    )
    spawn = start_scale_up(claiming)
    claiming.step(minutes=5, seconds=-1)  # a sweep, one second early
    spawn.refresh_from_db()
    assert spawn.state == SpawnState.PROVISIONING and not events_of(receiver, "scale_down")
    claiming.step(seconds=1)  # due, but a second after the last sweep: not swept yet
    spawn.refresh_from_db()
    assert spawn.state == SpawnState.PROVISIONING
    claiming.step(seconds=59)  # a minute after the last sweep: the next one
    spawn.refresh_from_db()
    assert spawn.state == SpawnState.TIMED_OUT
    [down] = events_of(receiver, "scale_down")
    assert (down["reason"], down["host_name"]) == ("spawn-timeout", spawn.host_name)
    assert down["spawn_event_id"] == spawn.attempt.event_id
    assert sample("zoomies_capacity_provision_timeouts_total", destination=destination) == (
        timeouts + 1
    )
    assert (
        sample(
            "zoomies_capacity_scale_down_emitted_total",
            destination=destination,
            reason="spawn-timeout",
        )
        == downs + 1
    )


def test_esc14_the_sweep_runs_at_most_once_a_minute_across_controllers(claiming, receiver):
    """The last-swept mark is a database row, so a second controller (a second `Loop`,
    sharing nothing in memory) stepping within the minute does not sweep either; the sweep
    is due at exactly a minute, not at the step after it."""
    start = claiming.clock.now
    spawn = start_scale_up(claiming)
    assert last_swept() == start  # the first step ever sweeps
    claiming.step(minutes=4, seconds=50)
    assert last_swept() == claiming.clock.now
    other = Loop(claiming.clock, claiming.config)
    report = other.step(seconds=10)  # past the spawn timeout, 10 s after the last sweep
    assert report.teardowns == [] and last_swept() == start + timedelta(minutes=4, seconds=50)
    assert Spawn.objects.get(pk=spawn.pk).state == SpawnState.PROVISIONING
    for _ in range(4):  # the controllers take turns at the capacity lease, 10 s apart
        assert claiming.step(seconds=10).teardowns == []
    assert Spawn.objects.get(pk=spawn.pk).state == SpawnState.PROVISIONING
    report = other.step(seconds=10)  # a minute to the second after the last sweep
    assert last_swept() == claiming.clock.now
    assert Spawn.objects.get(pk=spawn.pk).state == SpawnState.TIMED_OUT
    [teardown] = Attempt.objects.filter(type="scale_down")
    assert report.teardowns == [teardown.pk]
    assert claiming.step(seconds=10).teardowns == []  # 10 s after a sweep: nothing
    assert last_swept() == claiming.clock.now - timedelta(seconds=10)


def test_esc27_a_provision_that_joined_is_never_a_failure(claiming, receiver):
    spawn = start_scale_up(claiming)
    join_spawn(spawn, claiming.clock.now + timedelta(minutes=4))
    claiming.step(minutes=4, seconds=59)
    claiming.step(minutes=30)
    spawn.refresh_from_db()
    assert spawn.state == SpawnState.ACTIVE
    assert not events_of(receiver, "scale_down")
    assert not ProvisionFailures.objects.filter(consecutive__gt=0).exists()


def test_esc22_the_deferral_is_30s_doubling_to_15_minutes():
    base, ceiling = timedelta(seconds=30), timedelta(minutes=15)
    waits = [deferral_for(n, base, ceiling).total_seconds() for n in range(1, 9)]
    assert waits == [30, 60, 120, 240, 480, 900, 900, 900]


def test_esc22_esc28_consecutive_timeouts_defer_the_next_scale_up(claiming, receiver, caplog):
    """First attempt at once; after each timeout the next scale-up waits 30 s, then 60 s."""
    start_scale_up(claiming)
    claiming.step(minutes=5)  # timed out: deferred 30 s, though the cooldown has passed
    assert len(events_of(receiver, "capacity_demand")) == 1
    plan = claiming.step(seconds=29).plan
    assert len(events_of(receiver, "capacity_demand")) == 1
    [held] = plan.held
    assert "deferred until" in held.reason and "1 consecutive provision failure" in held.reason
    assert "never joined" in plan.statuses[0].waiting_for  # ESC-28: the cause, not labels
    claiming.step(seconds=1)
    assert len(events_of(receiver, "capacity_demand")) == 2
    claiming.step(minutes=5)  # the second provision times out: 60 s now
    claiming.step(seconds=59)
    assert len(events_of(receiver, "capacity_demand")) == 2
    claiming.step(seconds=1)
    assert len(events_of(receiver, "capacity_demand")) == 3
    assert ProvisionFailures.objects.get().consecutive == 2


def test_esc23_a_successful_join_clears_the_failure_count(claiming, receiver):
    start_scale_up(claiming)
    claiming.step(minutes=5)
    claiming.step(seconds=30)
    second = Spawn.objects.get(state=SpawnState.PROVISIONING)
    join_spawn(second, claiming.clock.now)
    claiming.step(seconds=1)
    row = ProvisionFailures.objects.get()
    assert (row.consecutive, row.deferred_until) == (0, None)


def test_esc24_deferral_is_per_destination(config, clock):
    record_provision_failure("https://a.example/hook", cause="x", now=clock.now, config=config)
    a = dataclasses.replace(config, destination_url="https://a.example/hook")
    b = dataclasses.replace(config, destination_url="https://b.example/hook")
    assert build(clock.now, a).scale_up_deferred_until == clock.now + timedelta(seconds=30)
    assert build(clock.now, b).scale_up_deferred_until is None


def test_esc25_at_5_failures_the_refusal_names_repeated_failure_and_logs_it(config, clock, caplog):
    for _ in range(4):
        record_provision_failure(config.destination_url, cause="boot", now=clock.now, config=config)
    assert "failing consistently" not in caplog.text
    record_provision_failure(config.destination_url, cause="boot", now=clock.now, config=config)
    assert "provisioning is failing consistently" in caplog.text
    snapshot = build(clock.now, config)
    assert snapshot.scale_up_deferral_reason.startswith("provisioning is failing repeatedly")


def test_esc26_a_running_deferral_keeps_its_length_when_the_base_changes(config, clock):
    record_provision_failure(config.destination_url, cause="x", now=clock.now, config=config)
    until = ProvisionFailures.objects.get().deferred_until
    faster = dataclasses.replace(config, provision_backoff_base=timedelta(seconds=1))
    assert build(clock.now, faster).scale_up_deferred_until == until
    record_provision_failure(config.destination_url, cause="x", now=clock.now, config=faster)
    assert ProvisionFailures.objects.get().deferred_until == clock.now + timedelta(seconds=2)


def test_esc16_esc18_a_silent_host_is_torn_down_at_the_first_sweep_after_30_minutes_unseen(
    claiming, receiver, caplog
):
    """The absence counts from the last heartbeat, not from the sweep that noticed it: the
    host last heard at +0:15 goes at the +31:00 sweep, the first at or after +30:15."""
    caplog.set_level(logging.INFO, logger="zoomies.capacity.backstop")
    start = claiming.clock.now
    spawn = start_scale_up(claiming)
    host = join_spawn(spawn, start)
    Host.objects.filter(pk=host.pk).update(last_heartbeat_at=start + timedelta(seconds=15))
    torn_at = None
    while claiming.clock.now < start + timedelta(minutes=32):  # the ticker's 10 s steps
        claiming.step(seconds=10)
        spawn.refresh_from_db()
        if claiming.clock.now == start + timedelta(minutes=2):  # 1 min 45 s: noticed
            assert spawn.unseen_since == claiming.clock.now
            assert f"starting absence clock: {host.name} at {receiver.url}" in caplog.text
        if claiming.clock.now == start + timedelta(minutes=30):  # a sweep at 29 min 45 s
            assert last_swept() == claiming.clock.now and spawn.state == SpawnState.ACTIVE
        if spawn.state == SpawnState.STRANDED:
            torn_at = claiming.clock.now
            break
    assert torn_at == start + timedelta(minutes=31)
    downs = [e for e in events_of(receiver, "scale_down") if e["host_name"] == host.name]
    assert [d["reason"] for d in downs] == ["heartbeat-timeout"]


def test_esc18_seeing_the_host_again_restarts_the_clock(claiming, receiver, caplog):
    caplog.set_level(logging.INFO, logger="zoomies.capacity.backstop")
    start = claiming.clock.now
    spawn = start_scale_up(claiming)
    host = join_spawn(spawn, start)
    claiming.step(minutes=2)
    assert Spawn.objects.get(pk=spawn.pk).unseen_since == claiming.clock.now
    claiming.step(minutes=18)
    Host.objects.filter(pk=host.pk).update(last_heartbeat_at=claiming.clock.now)
    claiming.step(minutes=1)
    assert Spawn.objects.get(pk=spawn.pk).unseen_since is None
    assert f"absence clock cleared: {spawn.host_name} at {receiver.url}" in caplog.text
    claiming.step(minutes=1)  # absent again: a new clock, from the heartbeat at +20 min
    assert Spawn.objects.get(pk=spawn.pk).unseen_since == claiming.clock.now
    claiming.step(minutes=27)  # +49 min: 29 min since that heartbeat, 49 since the first
    assert Spawn.objects.get(pk=spawn.pk).state == SpawnState.ACTIVE
    claiming.step(minutes=1)
    assert Spawn.objects.get(pk=spawn.pk).state == SpawnState.STRANDED


def test_esc18_no_teardown_on_a_single_observation_even_after_a_long_controller_outage(
    claiming, receiver, caplog
):
    """Back after two hours away, the controller reads the host as two hours silent; it
    tears down only once the absence has been watched for the flap grace."""
    caplog.set_level(logging.INFO, logger="zoomies.capacity.backstop")
    spawn = start_scale_up(claiming)
    join_spawn(spawn, claiming.clock.now)
    claiming.step(seconds=10)  # adopted
    assert claiming.step(hours=2).teardowns == []  # the first look after the outage
    spawn.refresh_from_db()
    assert (spawn.state, spawn.unseen_since) == (SpawnState.ACTIVE, claiming.clock.now)
    assert f"starting absence clock: {spawn.host_name} at {receiver.url}, unseen for" in (
        caplog.text
    )
    claiming.step(minutes=1)  # a second look, within the flap grace of the first
    assert Spawn.objects.get(pk=spawn.pk).state == SpawnState.ACTIVE
    claiming.step(minutes=1)
    assert Spawn.objects.get(pk=spawn.pk).state == SpawnState.STRANDED


def test_esc18_a_host_that_reports_in_within_the_flap_grace_after_an_outage_is_kept(
    claiming, receiver
):
    spawn = start_scale_up(claiming)
    host = join_spawn(spawn, claiming.clock.now)
    claiming.step(seconds=10)
    claiming.step(hours=2)
    claiming.step(minutes=1)
    beat = claiming.clock.now + timedelta(seconds=30)  # its agent reconnects 90 s after
    Host.objects.filter(pk=host.pk).update(last_heartbeat_at=beat)
    claiming.step(minutes=1)
    spawn.refresh_from_db()
    assert (spawn.state, spawn.unseen_since) == (SpawnState.ACTIVE, None)
    assert spawn.host_name not in {e["host_name"] for e in events_of(receiver, "scale_down")}


def test_esc17_a_heartbeating_host_is_never_swept(claiming, receiver):
    spawn = start_scale_up(claiming)
    host = join_spawn(spawn, claiming.clock.now)
    for _ in range(24):  # four hours, looked at every ten minutes, heartbeats as usual
        claiming.clock.advance(minutes=10)
        beat = claiming.clock.now - timedelta(seconds=30)
        Host.objects.filter(pk=host.pk).update(last_heartbeat_at=beat)
        claiming.step()
    assert Spawn.objects.get(pk=spawn.pk).state == SpawnState.ACTIVE
    assert spawn.host_name not in {e["host_name"] for e in events_of(receiver, "scale_down")}


def test_esc18_esc31_the_unseen_gauge_counts_provisions_past_the_flap_grace_being_timed(
    claiming, receiver
):
    """Unseen for at least the flap grace (2 min) and not yet the stranded window (30 min),
    both counted from the last heartbeat; one noticed sooner is timed but not counted."""
    start = claiming.clock.now
    spawn = start_scale_up(claiming)
    host = join_spawn(spawn, start)
    Host.objects.filter(pk=host.pk).update(last_heartbeat_at=start + timedelta(seconds=30))
    readings = {}
    for minute in (1, 2, 3, 30, 31):
        claiming.clock.now = start + timedelta(minutes=minute)
        claiming.step()
        unseen_since = Spawn.objects.get(pk=spawn.pk).unseen_since
        readings[minute] = (sample("zoomies_capacity_reap_unseen_provisions"), unseen_since)
        if minute == 1:
            assert sample("zoomies_capacity_provisions_in_flight", destination=receiver.url) == 1
    noticed = start + timedelta(minutes=2)  # 90 s silent: agent.heartbeat_timeout
    assert readings == {
        1: (0, None),
        2: (0, noticed),
        3: (1, noticed),
        30: (1, noticed),
        31: (0, noticed),  # torn down: no longer being timed
    }
    assert Spawn.objects.get(pk=spawn.pk).state == SpawnState.STRANDED


def test_esc10_esc11_a_failed_teardown_keeps_its_record_and_goes_again_where_it_was_spawned(
    claiming, receiver, tmp_path, clock
):
    spawn = start_scale_up(claiming)
    receiver.down = True
    claiming.step(minutes=5)  # timed out; the teardown's first try fails
    claiming.step(seconds=2)
    claiming.step(seconds=4)
    teardown = Attempt.objects.get(type="scale_down")
    assert teardown.state == AttemptState.FAILED
    # The operator points new provisions elsewhere; this teardown still goes to the receiver.
    claiming.config = dataclasses.replace(claiming.config, destination_url="http://127.0.0.1:9/")
    receiver.down = False
    claiming.step(minutes=5)
    again = Attempt.objects.filter(type="scale_down").exclude(pk=teardown.pk).get()
    assert again.destination_url == receiver.url and again.state == AttemptState.DELIVERED
    assert Spawn.objects.filter(pk=spawn.pk).exists()
    assert len(events_of(receiver, "scale_down")) == 4


def test_esc12_a_spawn_over_the_cap_is_refused_and_counted_until_the_backstop_frees_it(
    claiming, receiver
):
    claiming.config = dataclasses.replace(
        claiming.config, max_provisions=1, spawn_timeout=timedelta(minutes=10)
    )
    refusals = sample("zoomies_capacity_spawn_refusals_total")
    start_scale_up(claiming)
    report = claiming.step(minutes=5)  # the cooldown is over, the machine has not joined
    assert report.refused and "at the cap of 1" in report.refused[0]
    assert Attempt.objects.filter(type="capacity_demand").count() == 1
    assert Spawn.objects.count() == 1
    assert sample("zoomies_capacity_spawn_refusals_total") == refusals + 1
    claiming.step(minutes=5)  # the backstop times it out: it no longer counts
    claiming.step(seconds=30)  # ... after the deferral its one failure armed
    assert Spawn.objects.filter(state=SpawnState.PROVISIONING).count() == 1
    assert Attempt.objects.filter(type="capacity_demand").count() == 2


@pytest.mark.parametrize(
    "error, reason",
    [("database is locked", "contended"), ("server closed the connection", "unreachable")],
)
def test_esc13_a_cap_check_that_cannot_run_refuses_without_a_signal_and_retries(
    claiming, receiver, monkeypatch, error, reason
):

    real = claims.provisions_in_flight

    def failing():
        raise OperationalError(error)

    before = sample("zoomies_capacity_cap_lock_failures_total", reason=reason)
    monkeypatch.setattr(claims, "provisions_in_flight", failing)
    make_pool()
    queue_jobs(1, at=claiming.clock.now)
    report = claiming.step()
    assert report.refused and reason in report.refused[0]
    assert not Attempt.objects.exists() and not Spawn.objects.exists()  # nothing written
    assert receiver.arrivals == []
    assert sample("zoomies_capacity_cap_lock_failures_total", reason=reason) == before + 1
    monkeypatch.setattr(claims, "provisions_in_flight", real)
    claiming.step(seconds=1)  # offered again on the next pass, with no cooldown in the way
    assert Spawn.objects.count() == 1 and len(receiver.arrivals) == 1


def test_esc21_the_outcome_outlives_the_spawn_record_by_a_day(claiming, receiver):

    claiming.config = dataclasses.replace(claiming.config, claim_codes=True)
    spawn = start_scale_up(claiming)
    claiming.step(minutes=5)  # timed out; the teardown is delivered in this step
    claiming.step(seconds=10)  # not a sweep: the record stays
    assert Spawn.objects.filter(pk=spawn.pk).exists()
    claiming.step(seconds=50)  # the next sweep: the spawn record goes
    assert not Spawn.objects.filter(pk=spawn.pk).exists()
    outcome = ProvisionOutcome.objects.get(host_name=spawn.host_name)
    assert outcome.outcome == "timed_out" and outcome.spawn_gone_at == claiming.clock.now
    claiming.step(days=1, minutes=-1)
    assert ProvisionOutcome.objects.filter(host_name=spawn.host_name).exists()
    claiming.step(minutes=1)  # the sweep a day to the second after the record went
    assert not ProvisionOutcome.objects.filter(host_name=spawn.host_name).exists()
    slower = dataclasses.replace(claiming.config, spawn_timeout=timedelta(minutes=10))
    assert outcome_retention(slower) == timedelta(days=2)


def test_esc27_the_outcome_record_is_checked_before_a_failure_is_reported(claiming, receiver):
    """A provision another process saw join (its outcome says so) is never a failure."""

    spawn = start_scale_up(claiming)
    ProvisionOutcome.objects.create(
        host_name=spawn.host_name,
        event_id=spawn.attempt.event_id,
        destination_url=spawn.destination_url,
        outcome="joined",
        recorded_at=claiming.clock.now,
    )
    claiming.step(minutes=5)
    assert Spawn.objects.get(pk=spawn.pk).state == SpawnState.PROVISIONING
    assert not ProvisionFailures.objects.exists()
    assert spawn.host_name not in {e["host_name"] for e in events_of(receiver, "scale_down")}
