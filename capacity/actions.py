"""Every state change of the capacity layer: one durable transaction and an audit row each.

No network call happens inside any of them (CAP-18): a try is claimed in one transaction,
sent with none open, and its outcome recorded in another.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F

from accounts import audit
from capacity import events, machines, metrics
from capacity.models import Attempt, AttemptState, ExcessClock, Try, TryOutcome
from capacity.planner import ClearExcessClock, Emit, Reading, SetExcessClock
from fleet.models import Machine
from fleet.states import MachineState

log = logging.getLogger("zoomies.capacity")

ACTOR = "system:capacity"
MAX_TRIES = 3  # the contract's "up to three times", inside one attempt (CAP-14)
# A try whose controller vanished is recovered once its lease passes: the try's timeout
# plus this margin for the request to be written and the answer recorded.
LEASE_MARGIN = timedelta(seconds=5)


def new_event_id() -> str:
    """A fresh, unguessable event id: each attempt has its own (CAP-16)."""
    return secrets.token_hex(16)


def reading_json(reading: Reading) -> dict:
    return {
        "pool_id": reading.pool_id,
        "pool_name": reading.pool_name,
        "required_runner_slots": reading.required_runner_slots,
        "current_capacity": reading.current_capacity,
        "queued_job_count": reading.queued_job_count,
        "oldest_queue_age_seconds": reading.oldest_queue_age_seconds,
        "missing": [[k, events.plain(v)] for k, v in reading.missing],
    }


def start_attempt(
    *,
    type: str,
    reading: Reading,
    reason: str,
    destination_url: str,
    now: datetime,
    subject: str = "",
    extra: dict | None = None,
    actor: str = ACTOR,
    also: Callable[[Attempt], None] | None = None,
) -> Attempt:
    """Record a new attempt with its event id and exact body; its first try is due now.

    The row is what the cooldown keys on from this moment, whether or not any try is ever
    answered (CAP-13). `also` runs inside the same transaction (a spawn record and its
    claim, or a refusal that rolls the whole attempt back).
    """
    event_id = new_event_id()
    document = events.event_document(
        event_id=event_id, type=type, at=now, reading=reading, detail=reason, extra=extra
    )
    body = events.render(document)
    with transaction.atomic(durable=True):
        attempt = Attempt.objects.create(
            event_id=event_id,
            type=type,
            pool_id=reading.pool_id if reading.pool_id else None,
            pool_key=str(reading.pool_id),
            subject=subject,
            destination_url=destination_url,
            body=body.decode(),
            stamp=events.timestamp(now),
            reason=reason,
            reading=reading_json(reading),
            state=AttemptState.PENDING,
            started_at=now,
            next_try_at=now,
        )
        audit.record(
            actor=actor,
            action=f"capacity.{type}.attempt",
            target=attempt,
            detail={"event_id": event_id, "reason": reason, "pool": reading.pool_name},
            at=now,
        )
        if also is not None:
            also(attempt)
    metrics.event_emitted(type, _metric_reason(type, reading, extra), destination_url)
    return attempt


def _metric_reason(type: str, reading: Reading, extra: dict | None) -> str:
    if extra and "reason" in extra:
        return str(extra["reason"])
    if type == "capacity_demand":
        return "scale-from-zero" if reading.scale_from_zero else "hosts-full"
    return "excess-idle"


def start_emit(
    emit: Emit, *, destination_url: str, now: datetime, extra=None, also=None
) -> Attempt:
    return start_attempt(
        type=emit.type,
        reading=emit.reading,
        reason=emit.reason,
        destination_url=destination_url,
        now=now,
        extra=extra,
        also=also,
    )


def apply_clock(move: SetExcessClock | ClearExcessClock) -> None:
    """Start, narrow or clear a pool's excess clock (CAP-07). Bookkeeping: no audit row."""
    with transaction.atomic(durable=True):
        if isinstance(move, SetExcessClock):
            ExcessClock.objects.update_or_create(
                pool_id=move.pool_id, defaults={"since": move.since, "slots": move.slots}
            )
        else:
            ExcessClock.objects.filter(pool_id=move.pool_id).delete()


@dataclass(frozen=True)
class ClaimedTry:
    attempt_id: int
    number: int
    event_id: str
    destination_url: str
    body: bytes
    stamp: str


def claim_try(attempt_id: int, *, now: datetime, timeout: timedelta) -> ClaimedTry | None:
    """Take the attempt's next try if it is due and nobody else has: a compare-and-set.

    None when the try is not due, the attempt is finished, or another worker won.
    """
    with transaction.atomic(durable=True):
        taken = Attempt.objects.filter(
            pk=attempt_id,
            state=AttemptState.PENDING,
            next_try_at__lte=now,
            tries__lt=MAX_TRIES,
        ).update(
            state=AttemptState.SENDING,
            tries=F("tries") + 1,
            lease_until=now + timeout + LEASE_MARGIN,
        )
        if not taken:
            return None
        attempt = Attempt.objects.get(pk=attempt_id)
        Try.objects.create(attempt=attempt, number=attempt.tries, started_at=now)
    return ClaimedTry(
        attempt_id=attempt.pk,
        number=attempt.tries,
        event_id=attempt.event_id,
        destination_url=attempt.destination_url,
        body=attempt.body.encode(),
        stamp=attempt.stamp,
    )


def retry_wait(number: int, backoff: timedelta) -> timedelta:
    """The wait after failed try `number`: the backoff, doubled after the second."""
    return backoff * (2 ** (number - 1))


def record_try(
    attempt_id: int,
    number: int,
    *,
    outcome: str,
    status_code: int | None,
    error: str,
    now: datetime,
    backoff: timedelta,
    actor: str = ACTOR,
) -> Attempt | None:
    """Record what try `number` came to, and move the attempt on.

    Accepted: delivered. Otherwise another try after the backoff, or after the third the
    attempt is failed and stays failed until the cooldown lets a new attempt start (CAP-15).
    None when the try is no longer the attempt's current one (recovered meanwhile).
    """
    accepted = outcome == TryOutcome.ACCEPTED
    with transaction.atomic(durable=True):
        Try.objects.filter(attempt_id=attempt_id, number=number, finished_at=None).update(
            finished_at=now, outcome=outcome, status_code=status_code, error=error[:2000]
        )
        current = Attempt.objects.filter(pk=attempt_id, state=AttemptState.SENDING, tries=number)
        if accepted:
            moved = current.update(
                state=AttemptState.DELIVERED, finished_at=now, lease_until=None, last_error=""
            )
        elif number < MAX_TRIES:
            moved = current.update(
                state=AttemptState.PENDING,
                next_try_at=now + retry_wait(number, backoff),
                lease_until=None,
                last_error=error[:2000],
            )
        else:
            moved = current.update(
                state=AttemptState.FAILED,
                finished_at=now,
                next_try_at=None,
                lease_until=None,
                last_error=error[:2000],
            )
        if not moved:
            return None
        attempt = Attempt.objects.get(pk=attempt_id)
        if attempt.state in (AttemptState.DELIVERED, AttemptState.FAILED):
            audit.record(
                actor=actor,
                action=(
                    "capacity.delivered"
                    if attempt.state == AttemptState.DELIVERED
                    else "capacity_demand.delivery_failed"
                ),
                target=attempt,
                detail={
                    "event_id": attempt.event_id,
                    "type": attempt.type,
                    "tries": attempt.tries,
                    "error": attempt.last_error,
                },
                at=now,
            )
    metrics.delivery_try(outcome)
    if attempt.state == AttemptState.FAILED:
        metrics.delivery_finished("failed")
        log.warning(
            "capacity_demand.delivery_failed: %s %s for pool %s failed %d tries: %s",
            attempt.type,
            attempt.event_id,
            attempt.pool_key,
            attempt.tries,
            attempt.last_error,
        )
    elif attempt.state == AttemptState.DELIVERED:
        metrics.delivery_finished("delivered")
    return attempt


def recover_stale(*, now: datetime, backoff: timedelta) -> list[int]:
    """Tries whose sender vanished (a killed controller) count as unanswered (CAP-17).

    The attempt then carries on from its rows: the next try under the same event id, or
    failed after the third.
    """
    recovered = []
    stale = Attempt.objects.filter(state=AttemptState.SENDING, lease_until__lt=now)
    for attempt_id, tries in stale.values_list("pk", "tries"):
        if record_try(
            attempt_id,
            tries,
            outcome=TryOutcome.UNANSWERED,
            status_code=None,
            error="the controller stopped during this try (its lease ran out)",
            now=now,
            backoff=backoff,
        ):
            recovered.append(attempt_id)
    return recovered


# -- rented machines: an operator's word ----------------------------------------------------


class NotQuarantined(Exception):
    """Only a quarantined machine is released: any other has a loop that still owns it."""


def release_quarantined(machine_id: int, *, now: datetime, actor: str) -> Machine:
    """Release a quarantined machine (MACH-08): its row goes to deleted and its resource is
    left at the provider (issue 23 item 7). The API and the dashboard both call this.

    The state is checked first to answer the API's 409 in words; `machines.release` moves
    only a quarantined machine itself, so a deleting one is never recorded deleted without
    the inspect that proves it gone (MACH-09).
    """
    machine = Machine.objects.get(pk=machine_id)
    if machine.state != MachineState.QUARANTINED:
        raise NotQuarantined(
            f"machine {machine.name} is {machine.state}: only a quarantined machine is released"
        )
    machines.release(machine, now=now, actor=actor)
    machine.refresh_from_db()
    return machine
