"""Prometheus series of the capacity layer (ESC-30, ESC-31), after the peer's event scaler.

Counters count what happened in this process; with several processes prometheus_client
aggregates them through PROMETHEUS_MULTIPROC_DIR (zoomies_site/core/metrics.py sets it), and the
gauges say how they combine there.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

EVENTS_EMITTED = Counter(
    "zoomies_capacity_events_emitted_total",
    "Capacity events for which a delivery attempt started, by type and reason.",
    ["type", "reason"],
)
SCALE_UP_EMITTED = Counter(
    "zoomies_capacity_scale_up_emitted_total",
    "Scale-up (capacity_demand) events emitted, per destination.",
    ["destination"],
)
SCALE_DOWN_EMITTED = Counter(
    "zoomies_capacity_scale_down_emitted_total",
    "Scale-down events emitted, per destination and teardown reason.",
    ["destination", "reason"],
)
DELIVERY_TRIES = Counter(
    "zoomies_capacity_delivery_tries_total",
    "Delivery tries by outcome: accepted, refused or unanswered.",
    ["outcome"],
)
DELIVERIES = Counter(
    "zoomies_capacity_deliveries_total",
    "Delivery attempts finished, by outcome: delivered or failed (all three tries).",
    ["outcome"],
)
PROVISION_TIMEOUTS = Counter(
    "zoomies_capacity_provision_timeouts_total",
    "Provisions whose machine never joined within the spawn timeout, per destination.",
    ["destination"],
)
SPAWN_REFUSALS = Counter(
    "zoomies_capacity_spawn_refusals_total",
    "Scale-ups refused by the provision cap (capacity_demand.max_provisions).",
)
CAP_LOCK_FAILURES = Counter(
    "zoomies_capacity_cap_lock_failures_total",
    "Cap checks that could not run, by reason (unreachable, contended); never a capacity signal.",
    ["reason"],
)
CLAIM_REFUSALS = Counter(
    "zoomies_capacity_claim_refusals_total",
    "Claim-code redemptions refused, by reason (unknown, expired, spent).",
    ["reason"],
)
PROVISIONS_IN_FLIGHT = Gauge(
    "zoomies_capacity_provisions_in_flight",
    "Provisions provisioning or active, per destination.",
    ["destination"],
    multiprocess_mode="livemax",
)
REAP_UNSEEN = Gauge(
    "zoomies_capacity_reap_unseen_provisions",
    "Joined provisions unseen for the flap grace and not yet the stranded window, being timed.",
    multiprocess_mode="livemax",
)
REAP_BLOCKED = Gauge(
    "zoomies_capacity_reap_blocked",
    "1 while the backstop stands down: another holds the capacity lease or took the controller's.",
    multiprocess_mode="livemax",
)


def event_emitted(type: str, reason: str, destination: str = "") -> None:
    EVENTS_EMITTED.labels(type=type, reason=reason).inc()
    if type == "capacity_demand":
        SCALE_UP_EMITTED.labels(destination=destination).inc()
    elif type == "scale_down":
        SCALE_DOWN_EMITTED.labels(destination=destination, reason=reason).inc()


def delivery_try(outcome: str) -> None:
    DELIVERY_TRIES.labels(outcome=outcome).inc()


def delivery_finished(outcome: str) -> None:
    DELIVERIES.labels(outcome=outcome).inc()
