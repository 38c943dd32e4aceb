"""The spawn backstop and the provision-failure deferral (ESC-11, ESC-14..18, ESC-20..25).

Run by the capacity step, which holds the capacity lease, so one controller at a time
acts (ESC-19). Every step a provision whose host has joined becomes active, tied to that
host, and the join clears its destination's failure count (ESC-07, ESC-23): the deferral
must end with the join, not up to a minute later. The sweep proper runs at most once a
minute across controllers, on a durable mark (ESC-14, `claim_sweep`), as the peer's does:

* a provision whose machine never joined within the spawn timeout gets a `scale_down`
  event with reason `spawn-timeout`, counts as a provision failure for its destination,
  and increments the provision-timeout counter;
* a joined provision whose host has gone silent is timed from its last heartbeat (or join):
  the sweep that first reads it as unseen starts the absence clock, seeing the host again
  clears it (both logged), and a later sweep tears it down with reason
  `heartbeat-timeout` once the absence has lasted the stranded window (ESC-16, ESC-18,
  `_time_absence`). A host that is heartbeating is never swept, however long it runs;
* a teardown whose delivery failed is started again after the cooldown, to the destination
  recorded at spawn time, and its spawn record is kept until then (ESC-10, ESC-11);
* a spawn record whose teardown was delivered is deleted; the provision's outcome record
  outlives it by at least a day (ESC-21);
* pending claim codes are deleted an hour after they expire (ESC-20).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, Q

from accounts import audit
from capacity import actions, metrics
from capacity.config import CapacityConfig
from capacity.models import (
    Attempt,
    AttemptState,
    ClaimCode,
    ProvisionFailures,
    ProvisionOutcome,
    Spawn,
    SpawnState,
)
from capacity.planner import SCALE_DOWN, Reading
from fleet.models import Host
from zoomies_site.core.models import Lease

log = logging.getLogger("zoomies.capacity.backstop")

# ESC-14: the peer's "once a minute". The mark is a Lease row whose acquired_at is the last
# sweep's time and which nobody ever holds: one timestamp taken by a compare-and-set needs
# no model of its own, and like the controller's lost-lease mark it survives restarts.
SWEEP_INTERVAL = timedelta(minutes=1)
SWEEP_MARK = "capacity.backstop_swept"

SPAWN_TIMEOUT = "spawn-timeout"
HEARTBEAT_TIMEOUT = "heartbeat-timeout"
CLAIM_RETENTION = timedelta(hours=1)  # ESC-20: expired codes go an hour after expiry
# ESC-21: 288 spawn timeouts of 5 min; outcome_retention() grows with a raised timeout.
OUTCOME_RETENTION = timedelta(days=1)


def deferral_for(failures: int, base: timedelta, ceiling: timedelta) -> timedelta:
    """ESC-22: the base after the first failure, doubled per further one, capped."""
    wait = base
    for _ in range(max(0, failures - 1)):
        if wait >= ceiling:
            break
        wait *= 2
    return min(wait, ceiling)


def record_provision_failure(
    destination_url: str, *, cause: str, now: datetime, config: CapacityConfig
) -> ProvisionFailures:
    """Count one more consecutive failure and arm the next deferral (ESC-22, ESC-25).

    The deferral is sized from the settings as they are now; one already running keeps
    the length it was armed with (ESC-26).
    """
    with transaction.atomic(durable=True):
        row, _ = ProvisionFailures.objects.select_for_update().get_or_create(
            destination_url=destination_url
        )
        row.consecutive += 1
        wait = deferral_for(
            row.consecutive, config.provision_backoff_base, config.provision_backoff_max
        )
        row.deferred_until = now + wait
        row.last_failure_at = now
        row.last_cause = cause
        row.save()
        audit.record(
            actor=actions.ACTOR,
            action="capacity.provision_failed",
            target=row,
            detail={"consecutive": row.consecutive, "deferred_for_s": wait.total_seconds()},
            at=now,
        )
    if row.consecutive >= config.max_consecutive_failures:
        log.warning(
            "provisioning is failing consistently at %s: %d consecutive failures, the last: %s",
            destination_url,
            row.consecutive,
            cause,
        )
    return row


def clear_provision_failures(destination_url: str) -> None:
    """Any successful join clears the count (ESC-23)."""
    ProvisionFailures.objects.filter(destination_url=destination_url).update(
        consecutive=0, deferred_until=None
    )


def _teardown(spawn: Spawn, reason: str, *, now: datetime, config: CapacityConfig) -> Attempt:
    """Start the spawn's scale_down attempt to the destination it was spawned through."""
    destination = spawn.destination_url or config.destination_url
    pool_id = spawn.pool_id or 0
    reading = Reading(
        pool_id=pool_id,
        pool_name=spawn.pool.name if spawn.pool else "",
        host_selector=tuple(sorted((spawn.pool.host_selector or {}).items())) if spawn.pool else (),
        backend=spawn.pool.backend if spawn.pool else "",
        platform=(spawn.pool.platform or None) if spawn.pool else None,
        # A teardown asks for no slots: the machine it names was never counted (it did not
        # join, or it went silent), so the pair still reads as the pool's target.
        required_runner_slots=0,
        current_capacity=0,
        queued_job_count=0,
        oldest_queue_age_seconds=0,
    )
    text = (
        f"{spawn.host_name} never joined within {actions_span(config.spawn_timeout)}"
        if reason == SPAWN_TIMEOUT
        else f"{spawn.host_name} unseen for {actions_span(config.stranded_window)}"
    )
    attempt = actions.start_attempt(
        type=SCALE_DOWN,
        reading=reading,
        reason=text,
        destination_url=destination,
        now=now,
        subject=spawn.host_name,
        extra={
            "host_name": spawn.host_name,
            "reason": reason,
            "spawn_event_id": spawn.attempt.event_id,
        },
    )
    Spawn.objects.filter(pk=spawn.pk).update(teardown=attempt)
    return attempt


def actions_span(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    return f"{seconds // 60} min" if seconds % 60 == 0 and seconds >= 60 else f"{seconds} s"


def record_outcome(spawn: Spawn, outcome: str, now: datetime) -> None:
    """The provision's durable outcome; call inside the transaction that moved the spawn."""
    ProvisionOutcome.objects.update_or_create(
        host_name=spawn.host_name,
        defaults={
            "event_id": spawn.attempt.event_id,
            "destination_url": spawn.destination_url,
            "outcome": outcome,
            "recorded_at": now,
        },
    )


def outcome_retention(config: CapacityConfig) -> timedelta:
    """ESC-21: a day at least, longer in proportion when the spawn timeout is raised."""
    return max(OUTCOME_RETENTION, config.spawn_timeout * 288)


def end_spawn(spawn: Spawn, expected: str, new: str, reason: str, now: datetime) -> bool:
    """Compare-and-set a spawn from `expected` to an end state, with its audit row."""
    with transaction.atomic(durable=True):
        moved = Spawn.objects.filter(pk=spawn.pk, state=expected).update(
            state=new, ended_at=now, reason=reason
        )
        if moved:
            record_outcome(spawn, new, now)
            audit.record(
                actor=actions.ACTOR,
                action=f"capacity.spawn.{new}",
                target=spawn,
                detail={"host_name": spawn.host_name, "reason": reason},
                at=now,
            )
    return bool(moved)


def adopt_joined_hosts(now: datetime) -> list[str]:
    """Spawns whose host has joined become active, tied to that host (ESC-07, ESC-23).

    Read from rows on every step, so a join served by any process is adopted, and any
    successful join clears its destination's failure count.
    """
    adopted = []
    pending = Spawn.objects.filter(state=SpawnState.PROVISIONING).select_related("attempt")
    hosts = {
        h.name: h
        for h in Host.objects.filter(
            name__in=list(pending.values_list("host_name", flat=True)), joined_at__isnull=False
        )
    }
    for spawn in pending:
        host = hosts.get(spawn.host_name)
        if host is None or host.joined_at < spawn.created_at:
            continue
        with transaction.atomic(durable=True):
            moved = Spawn.objects.filter(pk=spawn.pk, state=SpawnState.PROVISIONING).update(
                state=SpawnState.ACTIVE, host=host, joined_at=host.joined_at
            )
            if moved:
                record_outcome(spawn, ProvisionOutcome.Outcome.JOINED, now)
                audit.record(
                    actor=actions.ACTOR,
                    action="capacity.spawn.joined",
                    target=spawn,
                    detail={"host_name": spawn.host_name, "host_id": host.pk},
                    at=now,
                )
        if moved:
            clear_provision_failures(spawn.destination_url)
            adopted.append(spawn.host_name)
    return adopted


def claim_sweep(now: datetime) -> bool:
    """ESC-14: True if a sweep is due at `now`, claimed for this caller alone.

    Due once the last sweep, by any controller, is at least SWEEP_INTERVAL old: `lte`, not
    `leases.acquire`'s strict `expires_at < now`, which would refuse at exactly a minute and
    let a 10 s step drift the cadence to 70 s. A mark ahead of `now` (a controller whose
    clock runs fast swept last) holds this one off until its own clock has passed it, rather
    than letting both sweep.
    """
    Lease.objects.get_or_create(name=SWEEP_MARK)
    return bool(
        Lease.objects.filter(name=SWEEP_MARK)
        .filter(Q(acquired_at__isnull=True) | Q(acquired_at__lte=now - SWEEP_INTERVAL))
        .update(acquired_at=now)
    )


def run(now: datetime, *, config: CapacityConfig) -> list[int]:
    """The backstop's share of a capacity step; the ids of the teardown attempts it started.

    Joins are adopted every step; the sweep runs only when `claim_sweep` says it is due.
    """
    adopt_joined_hosts(now)
    started = sweep(now, config=config) if claim_sweep(now) else []
    in_flight = (
        Spawn.objects.filter(state__in=[SpawnState.PROVISIONING, SpawnState.ACTIVE])
        .values("destination_url")
        .annotate(n=Count("pk"))
    )
    seen_destinations = set()
    for row in in_flight:
        metrics.PROVISIONS_IN_FLIGHT.labels(destination=row["destination_url"]).set(row["n"])
        seen_destinations.add(row["destination_url"])
    if config.destination_url not in seen_destinations:
        metrics.PROVISIONS_IN_FLIGHT.labels(destination=config.destination_url).set(0)
    return started


def sweep(now: datetime, *, config: CapacityConfig) -> list[int]:
    """One backstop sweep (call it through `run`, which keeps it to once a minute)."""
    started: list[int] = []
    timeout_cut = now - config.spawn_timeout
    for spawn in Spawn.objects.filter(
        state=SpawnState.PROVISIONING, joined_at__isnull=True, created_at__lte=timeout_cut
    ).select_related("pool", "attempt"):
        if ProvisionOutcome.objects.filter(
            host_name=spawn.host_name, outcome=ProvisionOutcome.Outcome.JOINED
        ).exists():
            continue  # ESC-27: it joined (through any process): never a failure
        moved = end_spawn(spawn, SpawnState.PROVISIONING, SpawnState.TIMED_OUT, SPAWN_TIMEOUT, now)
        if not moved:
            continue  # joined meanwhile: a provision that joined is never a failure (ESC-27)
        destination = spawn.destination_url or config.destination_url
        metrics.PROVISION_TIMEOUTS.labels(destination=destination).inc()
        record_provision_failure(
            destination,
            cause=f"{spawn.host_name} never joined within {actions_span(config.spawn_timeout)}",
            now=now,
            config=config,
        )
        started.append(_teardown(spawn, SPAWN_TIMEOUT, now=now, config=config).pk)

    started += _time_absence(now, config=config)

    # ESC-11: a teardown that failed is started again once its cooldown has passed.
    for spawn in Spawn.objects.filter(
        state__in=[SpawnState.TIMED_OUT, SpawnState.STRANDED],
        teardown__state=AttemptState.FAILED,
        teardown__started_at__lte=now - config.cooldown,
    ).select_related("pool"):
        started.append(_teardown(spawn, spawn.reason, now=now, config=config).pk)

    # A spawn whose teardown was delivered has done its work; its outcome record stays.
    done = Spawn.objects.filter(
        state__in=[SpawnState.TIMED_OUT, SpawnState.STRANDED],
        teardown__state=AttemptState.DELIVERED,
    )
    for spawn in done:
        with transaction.atomic(durable=True):
            ProvisionOutcome.objects.filter(host_name=spawn.host_name).update(spawn_gone_at=now)
            Spawn.objects.filter(pk=spawn.pk).delete()
    ProvisionOutcome.objects.filter(
        spawn_gone_at__isnull=False, spawn_gone_at__lte=now - outcome_retention(config)
    ).delete()

    ClaimCode.objects.filter(
        redeemed_at__isnull=True, expires_at__lte=now - CLAIM_RETENTION
    ).delete()
    return started


def _time_absence(now: datetime, *, config: CapacityConfig) -> list[int]:
    """The absence clocks of joined provisions (ESC-16..18); the teardowns started.

    The peer starts its clock when it first sees an agent unregistered. Ours is the host's
    last heartbeat (or join, if later): the moment it stopped being seen, which the row
    records, so the absence is counted from there and a silent host is torn down when the
    stranded window has passed since it was last seen, not that plus the time it took to
    notice. A sweep notices once the host has missed `heartbeat_timeout` (when the
    scheduler, too, stops placing there), sets `unseen_since` to that sweep's time and logs
    the start; seeing the host again clears both.

    No teardown follows a single observation: the sweep that notices never tears down, and
    a later one does only once the absence has lasted the stranded window (never less than
    the flap grace, as the peer floors it) and it has been watched for the flap grace. The
    second guard is for an outage: a controller back after an hour reads every host as an
    hour silent, and gives their agents the flap grace to report in before acting.

    The unseen gauge counts the provisions being timed: unseen for at least the flap grace
    and not yet past the stranded window (the peer's reap_unseen).
    """
    started: list[int] = []
    window = max(config.stranded_window, config.flap_grace)
    timed = 0
    for spawn in Spawn.objects.filter(state=SpawnState.ACTIVE).select_related("host", "pool"):
        host = spawn.host
        if host is not None:
            marks = [t for t in (host.last_heartbeat_at, host.joined_at) if t is not None]
            last_seen = max(marks) if marks else spawn.joined_at
        else:
            last_seen = spawn.joined_at  # the host row is gone: seen last when it joined
        absence = now - last_seen if last_seen is not None else window
        if absence < config.heartbeat_timeout:
            if spawn.unseen_since is not None:
                Spawn.objects.filter(pk=spawn.pk).update(unseen_since=None)
                log.info("absence clock cleared: %s at %s", spawn.host_name, spawn.destination_url)
            continue
        if config.flap_grace <= absence < window:
            timed += 1
        if spawn.unseen_since is None:
            Spawn.objects.filter(pk=spawn.pk).update(unseen_since=now)
            log.info(
                "starting absence clock: %s at %s, unseen for %s",
                spawn.host_name,
                spawn.destination_url,
                actions_span(absence),
            )
            continue
        if absence < window or now - spawn.unseen_since < config.flap_grace:
            continue
        if end_spawn(spawn, SpawnState.ACTIVE, SpawnState.STRANDED, HEARTBEAT_TIMEOUT, now):
            started.append(_teardown(spawn, HEARTBEAT_TIMEOUT, now=now, config=config).pk)
    metrics.REAP_UNSEEN.set(timed)
    return started
