"""CAP-01, CAP-02, CAP-18: configuration and where deliveries run."""

from __future__ import annotations

import pytest
from django.db import transaction
from django_q.models import OrmQ

import capacity.tasks
from capacity.config import load, secret_weakness
from capacity.delivery import deliver
from capacity.loop import enqueue_delivery, step
from capacity.models import Attempt
from tests.capacity.conftest import SECRET, make_pool, queue_jobs
from zoomies_site.core import registry


@pytest.mark.parametrize(
    "weak",
    [
        "short",
        "a" * 64,
        "password" * 8,
        "abcdefghij" * 4,
        "0123456789abcdef0123456789abcdef",  # 32 hex characters: about 128 bits at best
    ],
)
def test_cap02_a_short_or_low_entropy_secret_is_refused(weak):
    assert secret_weakness(weak) is not None


def test_cap02_a_generated_secret_passes():
    assert secret_weakness(SECRET) is None


@pytest.mark.django_db
def test_cap02_a_weak_secret_is_a_startup_error_and_not_quoted(registry_defaults, monkeypatch):
    monkeypatch.setenv("ZOOMIES_CAPACITY_DEMAND_DESTINATION_URL", "https://scaler.example/hook")
    monkeypatch.setenv("ZOOMIES_CAPACITY_DEMAND_SIGNING_SECRET", "hunter2hunter2")
    registry.reload()
    found = [f for f in registry.validate() if "capacity_demand" in f.key]
    assert found and all(f.is_error for f in found)
    assert "hunter2" not in repr([f.as_dict() for f in found])


@pytest.mark.django_db
def test_cap02_a_destination_without_a_secret_is_a_startup_error(registry_defaults, monkeypatch):
    monkeypatch.setenv("ZOOMIES_CAPACITY_DEMAND_DESTINATION_URL", "https://scaler.example/hook")
    registry.reload()
    keys = {f.key for f in registry.validate() if f.is_error}
    assert "config.capacity_demand_secret_missing" in keys
    monkeypatch.setenv("ZOOMIES_CAPACITY_DEMAND_SIGNING_SECRET", SECRET)
    registry.reload()
    assert not [f for f in registry.validate() if "capacity_demand" in f.key]


@pytest.mark.django_db
def test_cap01_settings_come_from_the_registry(registry_defaults, monkeypatch):
    monkeypatch.setenv("ZOOMIES_CAPACITY_DEMAND_DESTINATION_URL", "https://scaler.example/hook")
    monkeypatch.setenv("ZOOMIES_CAPACITY_DEMAND_SIGNING_SECRET", SECRET)
    monkeypatch.setenv("ZOOMIES_CAPACITY_DEMAND_POOLS", "zoomies-gpu,7")
    registry.reload()
    config = load()
    assert config.enabled and config.pools == ("zoomies-gpu", "7")


@pytest.mark.django_db
def test_cap18_a_step_hands_each_due_try_to_a_django_q2_task(config, clock):

    make_pool()
    queue_jobs(1, at=clock.now)
    report = step(clock.now, config=config)
    assert report.started and report.dispatched == report.started
    # The deliveries' own rows: a reconcile wake queued by something else (CI on PostgreSQL
    # once saw a second row here) is not what this test is about, but it is named if seen.
    queued = [row.task for row in OrmQ.objects.all()]
    deliveries = [t for t in queued if t["func"] == "capacity.tasks.deliver_task"]
    assert len(deliveries) == 1, [t["func"] for t in queued]
    assert deliveries[0]["args"] == tuple(report.started)


@pytest.mark.django_db
def test_cap18_a_delivery_refuses_to_run_inside_a_transaction(loop, clock):

    make_pool()
    queue_jobs(1, at=clock.now)
    step(clock.now, dispatch=lambda _id: None, config=loop.config)
    attempt = Attempt.objects.get()
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        deliver(attempt.pk, clock=clock, config=loop.config)


def test_cap18_enqueue_names_the_task_module():

    assert callable(capacity.tasks.deliver_task) and callable(enqueue_delivery)
