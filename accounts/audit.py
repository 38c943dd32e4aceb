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
    entry = _entry(actor, action, target, detail, at or timezone.now())
    entry.save(force_insert=True)
    return entry


def record_many(*, actor: str, action: str, targets: list[Any], detail: dict | None = None) -> int:
    """One row per target, in one INSERT: a bulk change audits every row it touched."""
    at = timezone.now()
    rows = [_entry(actor, action, target, detail, at) for target in targets]
    return len(AuditLog.objects.bulk_create(rows))


def record_each(entries: list[tuple[str, str, Any, dict[str, Any] | None, datetime]]) -> int:
    """One row per (actor, action, target, detail, at), in one INSERT and in that order: a
    group of different changes, each audited as `record` would."""
    rows = [
        _entry(actor, action, target, detail, at) for actor, action, target, detail, at in entries
    ]
    return len(AuditLog.objects.bulk_create(rows)) if rows else 0


def _entry(actor: str, action: str, target: Any, detail: dict | None, at: datetime) -> AuditLog:
    return AuditLog(
        at=at,
        actor=actor,
        action=action,
        target_type=target._meta.model_name if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        detail=detail or {},
    )
