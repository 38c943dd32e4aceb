"""Prometheus series for events, deliveries and claims (ESC-30, ESC-31)."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, generate_latest

from tests.capacity.conftest import make_pool, queue_jobs

pytestmark = pytest.mark.django_db


def value(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_esc30_events_by_type_and_reason_and_deliveries_by_outcome(loop, receiver):
    emitted = value(
        "zoomies_capacity_events_emitted_total", type="capacity_demand", reason="scale-from-zero"
    )
    scale_ups = value("zoomies_capacity_scale_up_emitted_total", destination=receiver.url)
    refused = value("zoomies_capacity_delivery_tries_total", outcome="refused")
    accepted = value("zoomies_capacity_delivery_tries_total", outcome="accepted")
    failed = value("zoomies_capacity_deliveries_total", outcome="failed")
    delivered = value("zoomies_capacity_deliveries_total", outcome="delivered")
    make_pool()
    queue_jobs(1, at=loop.clock.now)
    receiver.down = True
    loop.step()
    loop.step(seconds=2)
    loop.step(seconds=4)  # three refusals: failed
    receiver.down = False
    loop.step(minutes=5)  # the next attempt: delivered
    assert (
        value(
            "zoomies_capacity_events_emitted_total",
            type="capacity_demand",
            reason="scale-from-zero",
        )
        == emitted + 2
    )
    assert value("zoomies_capacity_scale_up_emitted_total", destination=receiver.url) == (
        scale_ups + 2
    )
    assert value("zoomies_capacity_delivery_tries_total", outcome="refused") == refused + 3
    assert value("zoomies_capacity_delivery_tries_total", outcome="accepted") == accepted + 1
    assert value("zoomies_capacity_deliveries_total", outcome="failed") == failed + 1
    assert value("zoomies_capacity_deliveries_total", outcome="delivered") == delivered + 1


def test_esc31_every_series_is_exposed():
    text = generate_latest(REGISTRY).decode()
    for name in (
        "zoomies_capacity_events_emitted_total",
        "zoomies_capacity_scale_up_emitted_total",
        "zoomies_capacity_scale_down_emitted_total",
        "zoomies_capacity_delivery_tries_total",
        "zoomies_capacity_deliveries_total",
        "zoomies_capacity_provision_timeouts_total",
        "zoomies_capacity_claim_refusals_total",
        "zoomies_capacity_spawn_refusals_total",
        "zoomies_capacity_cap_lock_failures_total",
        "zoomies_capacity_provisions_in_flight",
        "zoomies_capacity_reap_unseen_provisions",
        "zoomies_capacity_reap_blocked",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
