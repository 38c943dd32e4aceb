"""Build the planner's snapshot from rows (runners', fleet's and our own) and the clock.

The scheduling half is the reconcile pass's own snapshot builder, so the planner and the
scheduler judge the same rows the same way; this module adds the capacity state.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Max

from capacity.config import CapacityConfig
from capacity.models import Attempt, ExcessClock, ProvisionFailures
from capacity.planner import (
    CAPACITY_DEMAND,
    SCALE_DOWN_OPPORTUNITY,
    CapacitySettings,
    CapacitySnapshot,
    LastAttempt,
)
from capacity.planner import ExcessClock as ExcessClockView
from runners.reconcile import build_snapshot as build_scheduling_snapshot


def build(now: datetime, config: CapacityConfig) -> CapacitySnapshot:
    scheduling = build_scheduling_snapshot(now)
    clocks = tuple(
        ExcessClockView(pool_id=c.pool_id, since=c.since, slots=c.slots)
        for c in ExcessClock.objects.all()
    )
    latest = (
        Attempt.objects.filter(type__in=[CAPACITY_DEMAND, SCALE_DOWN_OPPORTUNITY], subject="")
        .values("pool_key", "type")
        .annotate(at=Max("started_at"))
    )
    attempts = tuple(
        LastAttempt(pool_id=int(row["pool_key"]), type=row["type"], at=row["at"])
        for row in latest
        if row["pool_key"].isdigit()
    )
    deferred_until = None
    deferral_reason = ""
    failures = ProvisionFailures.objects.filter(destination_url=config.destination_url).first()
    if failures is not None and failures.deferred_until is not None:
        deferred_until = failures.deferred_until
        deferral_reason = deferral_text(failures, config.max_consecutive_failures)
    return CapacitySnapshot(
        now=now,
        scheduling=scheduling,
        settings=CapacitySettings(cooldown=config.cooldown, pools=config.pools),
        excess_clocks=clocks,
        last_attempts=attempts,
        scale_up_deferred_until=deferred_until,
        scale_up_deferral_reason=deferral_reason,
    )


def deferral_text(failures: ProvisionFailures, threshold: int) -> str:
    """Why scale-ups to a destination are deferred; at the threshold it says so (ESC-25)."""
    n = failures.consecutive
    text = f"{n} consecutive provision failure{'s' * (n != 1)} at {failures.destination_url}"
    if failures.last_cause:
        text += f", the last: {failures.last_cause}"
    if n >= threshold:
        text = "provisioning is failing repeatedly: " + text
    return text
