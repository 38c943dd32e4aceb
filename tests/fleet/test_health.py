"""The silence ladder on a moved clock: late, unhealthy at 90 s (HOST-03), lost at 5 min
with its live runners failed and a running job marked the fleet's failure (HOST-04).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from accounts.models import AuditLog
from fleet import actions
from fleet import health as health_module
from fleet.health import check_host_health, judge_host
from fleet.models import Host
from fleet.selectors import hosts_for_scheduling
from runners.housekeeping import fleet_step as housekeeping_step
from runners.models import Job
from tests.fleet.conftest import T0, join, later, make_runner

pytestmark = pytest.mark.usefixtures("registry_defaults")


def health(host: Host) -> str:
    host.refresh_from_db()
    return host.health


@pytest.mark.django_db
def test_host03_healthy_at_89_seconds_unhealthy_at_91():
    host, _ = join("h1")
    actions.record_heartbeat(host=host, facts={}, now=T0)
    assert check_host_health(later(89)) == []
    assert health(host) == "healthy"
    assert [h.name for h in hosts_for_scheduling()] == ["h1"]
    assert check_host_health(later(91)) == ["host h1 unhealthy: no heartbeat for 1m31s"]
    assert health(host) == "unhealthy"
    assert list(hosts_for_scheduling()) == []  # no new runners on it
    assert check_host_health(later(92)) == []  # idempotent
    assert AuditLog.objects.filter(action="host.unhealthy", actor="system:housekeeping").exists()


@pytest.mark.django_db
def test_host03_silence_counts_from_the_join_when_there_was_no_heartbeat():
    host, _ = join("h1")
    assert host.last_heartbeat_at is None
    assert check_host_health(later(89)) == []
    assert check_host_health(later(91))
    assert health(host) == "unhealthy"


@pytest.mark.django_db
def test_host04_lost_after_five_minutes_fails_live_runners_and_marks_a_running_job():
    host, _ = join("h1")
    other, _ = join("h2")
    actions.record_heartbeat(host=host, facts={}, now=T0)
    busy = make_runner(host, "busy")
    idle = make_runner(host, "idle")
    ended = make_runner(host, "removed")
    elsewhere = make_runner(other, "idle")
    job = Job.objects.create(
        github_id=7,
        repository="acme/app",
        status="in_progress",
        runner=busy,
        runner_name=busy.name,
        created_at=T0,
        updated_at=T0,
    )
    done_job = Job.objects.create(
        github_id=8,
        repository="acme/app",
        status="completed",
        conclusion="success",
        runner=idle,
        runner_name=idle.name,
        created_at=T0,
        updated_at=T0,
    )
    actions.record_heartbeat(host=other, facts={}, now=later(minutes=5))

    assert check_host_health(later(minutes=4, seconds=59)) == [
        "host h1 unhealthy: no heartbeat for 4m59s"
    ]
    assert busy.__class__.objects.get(pk=busy.pk).state == "busy"

    reasons = check_host_health(later(minutes=5, seconds=1))
    assert reasons[0] == "host h1 lost: no heartbeat for 5m1s"
    assert health(host) == "lost"
    message = "host h1 lost: no heartbeat for 5m"
    for runner in (busy, idle):
        runner.refresh_from_db()
        assert (runner.state, runner.message) == ("failed", message)
        assert f"runner {runner.name} failed: {message}" in reasons
    ended.refresh_from_db()
    elsewhere.refresh_from_db()
    assert (ended.state, elsewhere.state) == ("removed", "idle")
    job.refresh_from_db()
    done_job.refresh_from_db()
    assert job.fleet_failure == "its runner's host was lost"
    assert done_job.fleet_failure == ""
    # Idempotent: the next tick changes nothing.
    assert check_host_health(later(minutes=5, seconds=31)) == []
    assert health(other) == "healthy"


@pytest.mark.django_db
def test_host04_a_healthy_host_silent_past_five_minutes_goes_straight_to_lost():
    host, _ = join("h1")
    runner = make_runner(host, "provisioning")
    reasons = check_host_health(later(minutes=6))
    assert health(host) == "lost"
    assert any(r.startswith(f"runner {runner.name} failed") for r in reasons)
    # A lost host that heartbeats again is healthy; its failed runners stay failed.
    actions.record_heartbeat(host=host, facts={}, now=later(minutes=7))
    assert health(host) == "healthy"
    runner.refresh_from_db()
    assert runner.state == "failed"


@pytest.mark.django_db
def test_housekeeping_step_runs_the_ladder_and_the_task_sweep():
    host, _ = join("h1")
    assert housekeeping_step(later(minutes=2)) == ["host h1 unhealthy: no heartbeat for 2m"]


# -- a heartbeat racing the judgement ------------------------------------------------------


def heartbeat_after_the_listing(monkeypatch, host: Host, at) -> None:
    """Record a heartbeat for `host` right after the tick first looks at its listed row:
    the race a real heartbeat wins between the listing and the judgement."""

    real = health_module.silent_since
    fired = []

    def silent_since(row: Host):
        answer = real(row)
        if row.pk == host.pk and not fired:
            fired.append(True)
            actions.record_heartbeat(host=Host.objects.get(pk=host.pk), facts={}, now=at)
        return answer

    monkeypatch.setattr(health_module, "silent_since", silent_since)


@pytest.mark.django_db
def test_host04_a_heartbeat_landing_after_the_tick_read_the_host_keeps_it_and_its_runners(
    monkeypatch,
):
    """HOST-04: the tick listed the host silent for 6 min, then a heartbeat arrived before the
    judgement: the host stays healthy and none of its runners is failed."""
    host, _ = join("h1")
    actions.record_heartbeat(host=host, facts={}, now=T0)
    busy = make_runner(host, "busy")
    heartbeat_after_the_listing(monkeypatch, host, later(minutes=5, seconds=50))

    assert check_host_health(later(minutes=6)) == []
    assert health(host) == "healthy"
    busy.refresh_from_db()
    assert busy.state == "busy"
    assert not AuditLog.objects.filter(action="host.lost").exists()


@pytest.mark.django_db
def test_host03_a_heartbeat_landing_after_the_tick_read_the_host_keeps_it_healthy(monkeypatch):
    """HOST-03: the same race one rung lower: no unhealthy move from a stale listing."""
    host, _ = join("h1")
    actions.record_heartbeat(host=host, facts={}, now=T0)
    heartbeat_after_the_listing(monkeypatch, host, later(95))

    assert check_host_health(later(100)) == []
    assert health(host) == "healthy"
    assert not AuditLog.objects.filter(action="host.unhealthy").exists()


@pytest.mark.django_db
def test_host04_judging_a_stale_row_rereads_the_host_before_losing_it():
    """HOST-04: the per-host judgement handed the row as the tick listed it, with a heartbeat
    recorded since, decides from the fresh row: no move and no failed runner."""

    host, _ = join("h1")
    actions.record_heartbeat(host=host, facts={}, now=T0)
    idle = make_runner(host, "idle")
    stale = Host.objects.get(pk=host.pk)
    actions.record_heartbeat(host=host, facts={}, now=later(minutes=5, seconds=59))

    reasons = judge_host(
        stale,
        now=later(minutes=6),
        timeout=timedelta(seconds=90),
        lost_after=timedelta(minutes=5),
    )
    assert reasons == []
    assert health(host) == "healthy"
    idle.refresh_from_db()
    assert idle.state == "idle"
    # With no heartbeat since, the same stale row does lose the host and fail its runner.
    reasons = judge_host(
        stale,
        now=later(minutes=12),
        timeout=timedelta(seconds=90),
        lost_after=timedelta(minutes=5),
    )
    assert reasons[0] == "host h1 lost: no heartbeat for 6m1s"
    idle.refresh_from_db()
    assert idle.state == "failed"
