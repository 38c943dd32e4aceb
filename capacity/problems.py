"""What the problems list says about capacity delivery (CAP-15).

Computed from the rows: a (pool, event type) whose latest attempt failed all its tries is
the `capacity_demand.delivery_failed` problem until a later attempt is delivered.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef

from capacity.models import Attempt, AttemptState

KEY = "capacity_demand.delivery_failed"


def capacity_problems(now: datetime) -> list[dict]:
    # One query: failed attempts with no later attempt for the same pool, type and subject.
    later = Attempt.objects.filter(
        pool_key=OuterRef("pool_key"),
        type=OuterRef("type"),
        subject=OuterRef("subject"),
        started_at__gt=OuterRef("started_at"),
    )
    failed = list(
        Attempt.objects.filter(state=AttemptState.FAILED)
        .exclude(Exists(later))
        .order_by("-started_at", "-pk")
    )
    if not failed:
        return []
    lines = [
        f"{a.type} {a.event_id} for pool {a.reading.get('pool_name') or a.pool_key}"
        f"{' host ' + a.subject if a.subject else ''}: {a.last_error}"
        for a in failed[:10]
    ]
    return [
        {
            "key": KEY,
            "severity": "error",
            "title": f"{len(failed)} capacity event(s) could not be delivered after 3 tries",
            "detail": (
                "; ".join(lines) + ". Nothing more is sent for these until the cooldown "
                "(capacity_demand.cooldown) has passed. Check the receiver at "
                f"{failed[0].destination_url}."
            ),
        }
    ]
