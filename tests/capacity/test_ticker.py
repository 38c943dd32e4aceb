"""CAP-18: the controller's ticker enqueues the capacity step as a django-q2 task on time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from capacity import tasks
from zoomies_site import ticker
from zoomies_site.core import leases


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


class _Report:
    started: list = []
