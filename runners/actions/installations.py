"""Installation actions: the rate-limit stand-down (POLL-05..09), with its audit rows.

The poller, the reconcile pass and the registration reap decide when an installation is
rate limited and until when (`runners.poller.standdown_until`); these write it.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from accounts import audit
from runners.models import Installation
from zoomies_site import metrics


def stand_down_installation(
    installation: Installation, *, until: datetime, reason: str, now: datetime, actor: str
) -> datetime:
    """Hold every GitHub call for `installation` until `until`; returns `until`.

    The caller's copy is updated too, so the rest of its sweep sees the hold.
    """
    reason = reason[:300]
    with transaction.atomic(durable=True):
        Installation.objects.filter(pk=installation.pk).update(
            standdown_until=until, standdown_reason=reason
        )
        audit.record(
            actor=actor,
            action="installation.stand_down",
            target=installation,
            detail={"until": until.isoformat(), "reason": reason},
            at=now,
        )
    installation.standdown_until = until
    installation.standdown_reason = reason
    metrics.standdown(actor)
    return until


def clear_standdown(installation: Installation, *, now: datetime, actor: str) -> bool:
    """Forget a stand-down that has run out; True if this call cleared it.

    A compare-and-set on the stored time, so a newer stand-down set meanwhile stays.
    """
    until = installation.standdown_until
    if until is None or until > now:
        return False
    with transaction.atomic(durable=True):
        cleared = Installation.objects.filter(pk=installation.pk, standdown_until=until).update(
            standdown_until=None, standdown_reason=""
        )
        if cleared:
            audit.record(
                actor=actor,
                action="installation.stand_down_over",
                target=installation,
                detail={"was_until": until.isoformat()},
                at=now,
            )
    if cleared:
        installation.standdown_until = None
        installation.standdown_reason = ""
    else:  # a newer stand-down was set meanwhile: the caller's copy should see it
        installation.refresh_from_db(fields=["standdown_until", "standdown_reason"])
    return bool(cleared)
