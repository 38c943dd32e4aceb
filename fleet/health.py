"""The host silence ladder, judged on the housekeeping tick (HOST-03, HOST-04).

A host is late, then unhealthy, then lost, in that order. Silence is counted from the later
of its last heartbeat and its last join, so a host that has just joined again is not judged
by the heartbeats of its previous registration.

Each host is judged in a transaction of its own that reads the host again (locked on
PostgreSQL; on SQLite the IMMEDIATE transaction already holds the write lock), so a
heartbeat that lands after the tick's listing but before the judgement always wins: the
move is a compare-and-set on the health and the heartbeat marks the judgement was made
from, and runners are failed only by the transaction that made or confirmed the loss.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction

from fleet.models import Host
from fleet.runner_side import runner_side
from fleet.states import HostHealth
from fleet.transitions import transition_host_health
from zoomies_site.core import registry
from zoomies_site.core.registry import format_duration

log = logging.getLogger("zoomies.fleet")

ACTOR = "system:housekeeping"


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
    timeout: timedelta = registry.get("agent.heartbeat_timeout")
    lost_after: timedelta = registry.get("host.lost_after")
    reasons: list[str] = []
    for host in Host.objects.order_by("pk"):
        reasons += judge_host(host, now=now, timeout=timeout, lost_after=lost_after)
    return reasons


def judge_host(
    listed: Host, *, now: datetime, timeout: timedelta, lost_after: timedelta
) -> list[str]:
    """Judge one host's silence; `listed` is the row as the tick read it, possibly stale.

    The listed row only spares a transaction for a host that is plainly not silent (its
    marks only move forward, so a fresher row can only be less silent); everything decided
    is decided from the row read again inside the transaction, which is durable: the
    health move and the failures of a lost host's runners commit together.
    """
    since = silent_since(listed)
    if since is None or now - since < timeout:
        return []
    if now - since < lost_after and listed.health != HostHealth.HEALTHY:
        return []  # already unhealthy, not yet lost: nothing to do
    reasons: list[str] = []
    with transaction.atomic(durable=True):
        host = Host.objects.select_for_update().filter(pk=listed.pk).first()
        since = silent_since(host) if host is not None else None
        if host is None or since is None:
            return []
        silence = now - since
        if silence >= lost_after:
            target = HostHealth.LOST
        elif silence >= timeout and host.health == HostHealth.HEALTHY:
            target = HostHealth.UNHEALTHY
        else:
            return []  # a heartbeat or a join landed since the listing
        if host.health != target:
            moved = _move(host, target, now=now, silence=silence)
            if not moved:
                return []  # a heartbeat won the race: the host is not silent after all
            reasons += moved
        if target == HostHealth.LOST:
            # Made or confirmed lost by this transaction, so no heartbeat can be in between.
            # Runs on every tick, not only on the move: a runner recorded on a lost host
            # after the move (or one whose failure lost a race) is still failed.
            reasons += runner_side().host_lost(
                host, now=now, actor=ACTOR, why=f"no heartbeat for {format_duration(lost_after)}"
            )
    for reason in reasons:
        log.warning("%s", reason)
    return reasons


def _move(host: Host, health: str, *, now: datetime, silence: timedelta) -> list[str]:
    """Compare-and-set the health from what `host` (read in this transaction) says.

    Guarded on the heartbeat and join marks as well as the health: the silence was computed
    from them, so a heartbeat recorded since makes the count 0 instead of losing the host.
    """
    quiet = format_duration(timedelta(seconds=int(silence.total_seconds())))
    reason = f"host {host.name} {health}: no heartbeat for {quiet}"
    moved = transition_host_health(
        host.pk,
        health,
        now=now,
        actor=ACTOR,
        reason=reason,
        guard={"last_heartbeat_at": host.last_heartbeat_at, "joined_at": host.joined_at},
    )
    return [reason] if moved else []
