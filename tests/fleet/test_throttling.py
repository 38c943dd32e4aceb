"""The throttle and the pressure hold, applied (HOST-13, HOST-15..17, HOST-19): samples
arrive as the agent sends them (the heartbeat's usage, the agent's sampling seam), the
controller's step moves the level on a moved clock, and the scheduler's snapshot places by
the throttled capacity and holds new starts while a fresh sample is short."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet.actions import record_heartbeat
from fleet.models import Host
from fleet.throttling import capacity_of, hold_of, throttle_step
from runners.actions import pools as pool_actions
from runners.models import Job
from runners.reconcile import build_snapshot
from runners.scheduler import decide
from runners.waits import job_wait_reasons
from zoomies_site.metrics_view import exposition

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
BUSY = {"cpu_percent": 99.0, "load1": 9.0, "memory_used_mb": 4000}  # 4 cores: 2.25 per core
CALM = {"cpu_percent": 10.0, "load1": 0.5, "memory_used_mb": 4000}
SHORT_OF_MEMORY = {"cpu_percent": 10.0, "load1": 0.5, "memory_used_mb": 15800}


@pytest.fixture
def host(registry_defaults):
    return Host.objects.create(
        name="zoomies-h1", capacity=8, cpus=4.0, memory_mb=16000, backends=["process"],
        last_heartbeat_at=T0 - timedelta(minutes=1),
    )  # fmt: skip


def beat(host: Host, usage: dict, at: datetime) -> dict:
    return record_heartbeat(host=Host.objects.get(pk=host.pk), facts={"usage": usage}, now=at)


def level(host: Host) -> int:
    return Host.objects.get(pk=host.pk).throttle_level


def test_host15_host16_host17_the_ladder_climbs_holds_comes_down_and_resets(host):
    at = T0
    for expected in (1, 1, 2, 2, 3, 3, 3):  # a level per 2 min while overwhelmed, at most 3
        beat(host, BUSY, at)
        throttle_step(at)
        assert level(host) == expected, at
        at += timedelta(minutes=1)
    assert capacity_of(Host.objects.get(pk=host.pk)) == 2  # a quarter of 8 left
    # HOST-20: the level's CPU factor rides on the next heartbeat answer, floored at 0.5.
    assert beat(host, BUSY, at)["cpu_factor"] == 0.5
    at += timedelta(minutes=1)
    snapshot_host = {h.id: h for h in build_snapshot(at).hosts}[host.pk]
    assert snapshot_host.capacity == 2
    for _minute in range(11):  # calm: one level down per 5 unbroken minutes
        beat(host, CALM, at)
        throttle_step(at)
        at += timedelta(minutes=1)
    assert level(host) == 1
    assert "calm" in Host.objects.get(pk=host.pk).throttle_reason
    assert beat(host, CALM, at)["cpu_factor"] == 0.75
    throttle_step(at + timedelta(minutes=10))  # the samples stopped: reset, full capacity
    assert level(host) == 0
    assert {h.id: h for h in build_snapshot(at).hosts}[host.pk].capacity == 8


def test_host19_nothing_a_heartbeat_carries_sets_a_level(host):
    """The agent's word is a measurement; only the controller's step, from measurements,
    moves the throttle."""
    beat(host, {**CALM, "throttle_level": 3, "level": 3}, T0)
    assert level(host) == 0
    throttle_step(T0)
    assert level(host) == 0
    beat(host, BUSY, T0 + timedelta(minutes=1))
    assert level(host) == 0  # not until the step looks
    throttle_step(T0 + timedelta(minutes=1))
    assert level(host) == 1


def test_host13_a_short_sample_holds_new_starts_and_the_job_says_why_until_it_lifts(host):
    pool_actions.create_pool(
        {"name": "zoomies-p", "labels": ["p"], "backend": "process"}, actor="t", now=T0
    )
    Job.objects.create(
        github_id=1, repository="acme/app", labels=["self-hosted", "p"], status="queued",
        created_at=T0, updated_at=T0,
    )  # fmt: skip
    beat(host, SHORT_OF_MEMORY, T0)
    snapshot = build_snapshot(T0 + timedelta(seconds=5))
    plan = decide(snapshot)
    assert plan.creates == ()
    reason = next(iter(job_wait_reasons(snapshot, plan).values()))
    assert "zoomies-h1 under pressure: memory short" in reason, reason
    beat(host, CALM, T0 + timedelta(seconds=20))
    assert len(decide(build_snapshot(T0 + timedelta(seconds=25))).creates) == 1


def gauge(name: str) -> dict[tuple, float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition().decode())
        for sample in family.samples
        if sample.name == name
    }


def test_a_throttled_hosts_level_and_cpu_factor_are_gauges(host):
    """Issue 25 item 5: /metrics names each throttled host with its level and CPU factor;
    a host at rest adds no series."""
    assert gauge("zoomies_host_throttle_level") == {}
    at = T0
    for _ in range(3):  # levels 1 and 2
        beat(host, BUSY, at)
        throttle_step(at)
        at += timedelta(minutes=1)
    assert gauge("zoomies_host_throttle_level") == {(("host", "zoomies-h1"),): 2.0}
    assert gauge("zoomies_host_cpu_factor") == {(("host", "zoomies-h1"),): 0.5}


def test_host13_with_host_throttling_off_nothing_is_held(host, registry_defaults):
    registry_defaults.set("scheduler.host_throttling", "false")
    beat(host, SHORT_OF_MEMORY, T0)
    assert hold_of(Host.objects.get(pk=host.pk), T0 + timedelta(seconds=5)) == ""
