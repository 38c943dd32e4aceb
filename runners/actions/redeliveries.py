"""Redelivery actions: the asked-for guids, the pass's reading point and its hold, with audit.

`runners.redelivery` decides (through the pure `runners.redelivery_plan`) and calls GitHub;
these write what it asked and how far it read. A redelivery is claimed in the database
before GitHub is asked, so no guid is asked for twice, even across a restart: a process that
dies between the claim and the call leaves the claim (`asking`), and that guid is not asked
for again (at most once; the safety sweep finds the jobs such a delivery was about).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction

from accounts import audit
from runners.models import RedeliveryOutcome, RedeliveryRequest, RedeliveryState
from runners.redelivery_plan import Decision

STATE_NAME = "app"  # the App's one webhook
# Requests are kept a day past GitHub's window: after it GitHub no longer lists the delivery.
KEEP_REQUESTS = timedelta(days=1)


def redelivery_state() -> RedeliveryState:
    """The pass's one state row, made on first use."""
    state, _ = RedeliveryState.objects.get_or_create(name=STATE_NAME)
    return state


def claim_redelivery(decision: Decision, *, now: datetime) -> RedeliveryRequest | None:
    """Claim a guid before asking GitHub; None if it was claimed already (by another pass)."""
    delivery = decision.delivery
    try:
        with transaction.atomic(durable=True):
            return RedeliveryRequest.objects.create(
                guid=delivery.guid,
                github_delivery_id=delivery.id,
                event=delivery.event[:64],
                action=(delivery.action or "")[:64],
                delivered_at=delivery.delivered_at,
                failed_status=f"{delivery.status} ({delivery.status_code})"[:200],
                reason=decision.reason[:300],
                outcome=RedeliveryOutcome.ASKING,
                asked_at=now,
            )
    except IntegrityError:
        return None


def settle_redelivery(
    request: RedeliveryRequest, *, asked: bool, message: str, now: datetime, actor: str
) -> None:
    """GitHub answered: 202 (`asked`) or a refusal; the outcome and its audit row."""
    outcome = RedeliveryOutcome.ASKED if asked else RedeliveryOutcome.REFUSED
    with transaction.atomic(durable=True):
        RedeliveryRequest.objects.filter(pk=request.pk).update(
            outcome=outcome, message=message[:300]
        )
        audit.record(
            actor=actor,
            action="github.redelivery_asked" if asked else "github.redelivery_refused",
            target=request,
            detail={
                "guid": request.guid,
                "delivery_id": request.github_delivery_id,
                "event": request.event,
                "action": request.action,
                "failed": request.failed_status,
                "reason": request.reason,
                **({"message": message[:300]} if message else {}),
            },
            at=now,
        )
    request.outcome = outcome


def release_redelivery(request: RedeliveryRequest) -> None:
    """Drop a claim whose call was not made or not answered, so a later pass asks again."""
    RedeliveryRequest.objects.filter(pk=request.pk, outcome=RedeliveryOutcome.ASKING).delete()


def hold_redelivery(*, until: datetime, reason: str, now: datetime, actor: str) -> datetime:
    """A rate limit on the App's own calls: no pass asks GitHub anything until `until`."""
    reason = reason[:300]
    with transaction.atomic(durable=True):
        state = redelivery_state()
        RedeliveryState.objects.filter(pk=state.pk).update(held_until=until, held_reason=reason)
        audit.record(
            actor=actor,
            action="github.redelivery_held",
            target=state,
            detail={"until": until.isoformat(), "reason": reason},
            at=now,
        )
    return until


def record_redelivery_pass(
    *, seen_until: datetime | None, now: datetime, window: timedelta
) -> None:
    """A pass ended: where the next one reads back to, an expired hold forgotten, and the
    requests for deliveries GitHub no longer lists dropped."""
    state = redelivery_state()
    changes: dict[str, object] = {"last_pass_at": now}
    if seen_until is not None:
        changes["seen_until"] = seen_until
    if state.held_until is not None and state.held_until <= now:
        changes.update(held_until=None, held_reason="")
    with transaction.atomic(durable=True):
        RedeliveryState.objects.filter(pk=state.pk).update(**changes)
        RedeliveryRequest.objects.filter(delivered_at__lt=now - window - KEEP_REQUESTS).delete()
