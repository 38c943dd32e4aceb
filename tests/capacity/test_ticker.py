"""CAP-18: the controller's ticker enqueues the capacity step as a django-q2 task on time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from capacity import loop, tasks
from zoomies_site import ticker
from zoomies_site.core import controller_lock, leases
from zoomies_site.core.models import Lease


@pytest.mark.django_db
def test_cap18_the_ticker_enqueues_the_capacity_step_every_interval(monkeypatch, registry_defaults):
    enqueued = []
    monkeypatch.setattr(ticker, "enqueue", lambda func, *args: enqueued.append(func))
    start = datetime(2026, 9, 5, 12, 0, tzinfo=UTC)
    t = ticker.default_ticker(start)
    t.step(start)
    t.step(start + timedelta(seconds=5))
    t.step(start + timedelta(seconds=10))
    assert enqueued.count("capacity.tasks.capacity_step_task") == 2


@pytest.mark.django_db
def test_esc14_esc19_the_step_task_runs_only_on_the_lease_holder(monkeypatch, registry_defaults):

    ran = []
    monkeypatch.setattr("capacity.loop.step", lambda now, **kw: ran.append(now) or _Report())
    assert leases.acquire(
        "capacity", holder="another", now=timezone.now(), ttl=timedelta(minutes=1)
    )
    assert tasks.capacity_step_task() == 0 and ran == []
    # ESC-19: the reap-blocked gauge reads 1 for exactly the time it stands down.
    assert REGISTRY.get_sample_value("zoomies_capacity_reap_blocked") == 1
    leases.release("capacity", holder="another", force=True)
    tasks.capacity_step_task()
    assert len(ran) == 1
    assert REGISTRY.get_sample_value("zoomies_capacity_reap_blocked") == 0


@pytest.mark.django_db
def test_esc19_the_backstop_stands_down_while_the_controller_lease_is_lost(
    monkeypatch, registry_defaults
):
    """The peer's "connected to no known peer": another controller took this one's lease
    (controller.lease_lost). The step still runs (scale-ups, deliveries) but no provision is
    timed out or torn down, and the gauge reads 1 until a fresh acquire clears the mark."""
    asked = []
    monkeypatch.setattr(
        "capacity.loop.step", lambda now, **kw: asked.append(kw["run_backstop"]) or _Report()
    )
    tasks.capacity_step_task()
    assert asked == [True]
    assert REGISTRY.get_sample_value("zoomies_capacity_reap_blocked") == 0
    controller_lock.record_lease_lost(holder="other-host:42", now=timezone.now())
    tasks.capacity_step_task()
    assert asked == [True, False]
    assert REGISTRY.get_sample_value("zoomies_capacity_reap_blocked") == 1
    Lease.objects.filter(name=controller_lock.LOST_MARK).delete()  # what a fresh acquire does
    tasks.capacity_step_task()
    assert asked == [True, False, True]
    assert REGISTRY.get_sample_value("zoomies_capacity_reap_blocked") == 0


@pytest.mark.django_db
def test_esc19_a_step_told_to_stand_down_tears_nothing_down(monkeypatch, config):
    assert config.enabled
    swept = []
    monkeypatch.setattr("capacity.backstop.run", lambda now, **kw: swept.append(now) or [])
    loop.step(timezone.now(), dispatch=lambda _id: None, config=config, run_backstop=False)
    assert swept == []
    loop.step(timezone.now(), dispatch=lambda _id: None, config=config)
    assert len(swept) == 1


class _Report:
    started: list = []
