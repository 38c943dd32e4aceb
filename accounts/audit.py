"""The one way an audit row is written: inside the caller's transaction.

Never from a signal: a signal misses writes made outside a request (most transitions are), and
writing in the action's own transaction makes a change and its audit row commit together.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from accounts.models import AuditLog


def record(
    *,
    actor: str,
    action: str,
    target: Any = None,
    detail: dict | None = None,
    at: datetime | None = None,
) -> AuditLog:
    target_type = target._meta.model_name if target is not None else ""
    target_id = str(target.pk) if target is not None else ""
    return AuditLog.objects.create(
        at=at or timezone.now(),
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        detail=detail or {},
    )


def record_many(*, actor: str, action: str, targets: list[Any], detail: dict | None = None) -> int:
    """One row per target, in one INSERT: a bulk change audits every row it touched."""
    at = timezone.now()
    rows = [
        AuditLog(
            at=at,
            actor=actor,
            action=action,
            target_type=target._meta.model_name,
            target_id=str(target.pk),
            detail=detail or {},
        )
        for target in targets
    ]
    return len(AuditLog.objects.bulk_create(rows))
