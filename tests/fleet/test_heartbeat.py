"""Heartbeats: the interval in every answer (HOST-01), the disk tolerance (HOST-08/09/10),
usage validated and stamped with the controller's receipt time (HOST-11).
"""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from fleet import actions
from fleet.models import Host
from tests.fleet.conftest import T0, join
from zoomies_site.core import registry

pytestmark = pytest.mark.usefixtures("registry_defaults")


def beat(host: Host, seconds: float = 30, **facts) -> dict:
    answer = actions.record_heartbeat(host=host, facts=facts, now=T0 + timedelta(seconds=seconds))
    host.refresh_from_db()
    return answer


@pytest.mark.django_db(transaction=True)
def test_host01_every_heartbeat_answer_carries_the_interval(agent_api, monkeypatch):
    host, token = join("h1")
    answer = agent_api.post("heartbeat", {"capacity": 6, "version": "0.2.0"}, token=token)
    assert answer.status_code == 200
    assert answer.json()["heartbeat_interval"] == 30 and answer.json()["cordoned"] is False
    host.refresh_from_db()
    assert (host.capacity, host.version) == (6, "0.2.0")
    assert host.last_heartbeat_at is not None

    monkeypatch.setenv(registry.env_name("agent.heartbeat_interval"), "20s")
    registry.reload()
    assert agent_api.post("heartbeat", {}, token=token).json()["heartbeat_interval"] == 20


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_without_a_valid_agent_token_is_401_and_bad_json_400(agent_api):
    _, token = join("h1")
    assert agent_api.post("heartbeat", {}).status_code == 401
    wrong = agent_api.post("heartbeat", {}, token="zat_not-a-token")
    assert wrong.status_code == 401 and wrong.json()["error"]
    assert wrong.headers["WWW-Authenticate"] == "Bearer"
    bad = httpx.post(
        agent_api.base + "heartbeat",
        content=b"[1, 2",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert bad.status_code == 400 and bad.json()["error"]
    huge = httpx.post(
        agent_api.base + "heartbeat",
        content=b" " * (2 * 1024 * 1024),
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert huge.status_code == 413


@pytest.mark.django_db
def test_host09_free_space_is_rewritten_only_past_5_percent_or_256_mb():
    """HOST-08, HOST-09: the disk figures sent on join and heartbeat, and their tolerance."""
    host, _ = join("h1", disk_total_mb=100_000, disk_free_mb=50_000)
    # 5 % of 50 000 is 2 500 MB: a smaller move is not written.
    beat(host, disk_total_mb=100_000, disk_free_mb=48_000)
    assert host.disk_free_mb == 50_000
    beat(host, disk_total_mb=100_000, disk_free_mb=47_400)
    assert host.disk_free_mb == 47_400
    # On a small figure the 256 MB floor is the larger tolerance.
    small, _ = join("h2", disk_total_mb=10_000, disk_free_mb=1_000)
    beat(small, disk_total_mb=10_000, disk_free_mb=800)
    assert small.disk_free_mb == 1_000
    beat(small, disk_total_mb=10_000, disk_free_mb=700)
    assert small.disk_free_mb == 700


@pytest.mark.django_db
def test_host10_a_size_records_free_space_even_zero_and_no_size_leaves_both():
    host, _ = join("h1", disk_total_mb=None, disk_free_mb=None)
    assert (host.disk_total_mb, host.disk_free_mb) == (None, None)
    beat(host, disk_total_mb=20_000, disk_free_mb=0)
    assert (host.disk_total_mb, host.disk_free_mb) == (20_000, 0)
    beat(host, disk_free_mb=15_000)  # no size: not a measurement
    assert (host.disk_total_mb, host.disk_free_mb) == (20_000, 0)
    beat(host)
    assert (host.disk_total_mb, host.disk_free_mb) == (20_000, 0)


@pytest.mark.django_db
def test_host11_usage_is_optional_validated_and_stamped_with_the_receipt_time():
    host, _ = join("h1")
    assert host.usage == {} and host.usage_at is None
    beat(host, 30, usage={"cpu_percent": 12.5, "memory_used_mb": 900, "load1": 0.4})
    assert host.usage == {"cpu_percent": 12.5, "memory_used_mb": 900, "load1": 0.4}
    assert host.usage_at == T0 + timedelta(seconds=30)
    # A bad sample is dropped, not the heartbeat: the last good one and its time stay.
    for bad in ({"cpu_percent": -1}, {"load1": "high"}, [1, 2], {"x": True}, {}):
        answer = beat(host, 60, usage=bad)
        assert answer["heartbeat_interval"] == 30
        assert host.usage["cpu_percent"] == 12.5
        assert host.usage_at == T0 + timedelta(seconds=30)
        assert host.last_heartbeat_at == T0 + timedelta(seconds=60)
    beat(host, 90)  # no usage at all: nothing about usage changes
    assert host.usage_at == T0 + timedelta(seconds=30)


@pytest.mark.django_db
def test_a_heartbeat_makes_an_unhealthy_or_lost_host_healthy():
    host, _ = join("h1")
    for health in ("unhealthy", "lost"):
        Host.objects.filter(pk=host.pk).update(health=health)
        beat(host)
        assert host.health == "healthy"
        assert host.health_changed_at == T0 + timedelta(seconds=30)


@pytest.mark.django_db
def test_a_cordoned_host_hears_so_on_its_heartbeat():
    host, _ = join("h1")
    assert actions.set_host_cordon(host=host, cordoned=True, now=T0, actor="user:ada")
    assert beat(host)["cordoned"] is True
