"""The host silence ladder, judged on the housekeeping tick (HOST-03, HOST-04).

A host is late, then unhealthy, then lost, in that order. Silence is counted from the later
of its last heartbeat and its last join, so a host that has just joined again is not judged
by the heartbeats of its previous registration.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction

from accounts import audit
from fleet.actions import fail_live_runners
from fleet.models import Host
from fleet.states import HostHealth
from runners.models import Runner
from runners.states import LIVE_STATES
from zoomies_site.registry import format_duration

log = logging.getLogger("zoomies.fleet")

ACTOR = "system:housekeeping"
LOST_JOB_FAILURE = "its runner's host was lost"


def silent_since(host: Host) -> datetime | None:
    marks = [t for t in (host.last_heartbeat_at, host.joined_at) if t is not None]
    return max(marks) if marks else None


def check_host_health(now: datetime) -> list[str]:
    """Mark silent hosts unhealthy or lost and reclaim a lost host's runners; say what was done.

    Unhealthy after `agent.heartbeat_timeout` without a heartbeat (the scheduler places
    nothing new there); lost after `host.lost_after`, when every runner still live on it is
    failed and a job one of them was running is marked as the fleet's failure. Idempotent:
    a second call at the same `now` does nothing, and a lost host's stragglers are failed
    on any later tick.
    """
    from zoomies_site import registry

    timeout: timedelta = registry.get("agent.heartbeat_timeout")
    lost_after: timedelta = registry.get("host.lost_after")
    reasons: list[str] = []
    for host in Host.objects.order_by("pk"):
        since = silent_since(host)
        if since is None:
            continue  # never joined: nothing to be silent about
        silence = now - since
        if silence >= lost_after:
            reasons += _lose(host, now=now, silence=silence, lost_after=lost_after)
        elif silence >= timeout and host.health == HostHealth.HEALTHY:
            reasons += _move(host, HostHealth.UNHEALTHY, now=now, silence=silence)
    return reasons


def _move(host: Host, health: str, *, now: datetime, silence: timedelta) -> list[str]:
    quiet = format_duration(timedelta(seconds=int(silence.total_seconds())))
    reason = f"host {host.name} {health}: no heartbeat for {quiet}"
    with transaction.atomic():
        moved = (
            Host.objects.filter(pk=host.pk, health=host.health)
            .exclude(health=health)
            .update(health=health, health_changed_at=now)
        )
        if not moved:
            return []
        audit.record(
            actor=ACTOR,
            action=f"host.{health}",
            target=host,
            detail={"from": host.health, "to": health, "reason": reason},
            at=now,
        )
    log.warning("%s", reason)
    return [reason]


def _lose(host: Host, *, now: datetime, silence: timedelta, lost_after: timedelta) -> list[str]:
    reasons: list[str] = []
    if host.health != HostHealth.LOST:
        reasons += _move(host, HostHealth.LOST, now=now, silence=silence)
    # Runs on every tick, not only on the move: a runner recorded on a lost host after the
    # move (or one whose failure lost a race) is still failed, and no slot stays counted.
    if Runner.objects.filter(host=host, state__in=list(LIVE_STATES)).exists():
        with transaction.atomic():
            reasons += fail_live_runners(
                host,
                now=now,
                actor=ACTOR,
                message=f"host {host.name} lost: no heartbeat for {format_duration(lost_after)}",
                job_failure=LOST_JOB_FAILURE,
            )
    return reasons


def housekeeping_step(now: datetime) -> list[str]:
    """The fleet's share of one housekeeping tick: the silence ladder, then the task sweep."""
    from fleet.taskqueue import sweep_tasks

    return check_host_health(now) + sweep_tasks(now)
