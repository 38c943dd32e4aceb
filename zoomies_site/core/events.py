"""The transactional outbox (EVT-02): `emit` writes an event row beside the change it
announces, inside the caller's transaction, so nothing rolled back is ever announced and
nothing committed is ever missed. The relay (`zoomies_site.stream`) tails these rows.

This module imports only the site's models and the wake bus, so any action may call it
without an import circle. A committed event wakes the relays of every web process at once
(`zoomies_site.core.wakebus`); their poll is the safety net.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from zoomies_site.core import wakebus
from zoomies_site.core.models import Event

# What the dashboard streams: the resources whose frames are their API GET shape.
RESOURCES = ("pool", "runner", "job", "host")
# How long rows are kept for a reconnecting browser; older ones are pruned by housekeeping.
RETENTION = timedelta(hours=1)


def emit(kind: str, obj: Any, *, at: datetime | None = None) -> Event:
    """Announce a change to `obj` (a pool, runner, job or host, or `Model(pk=...)`).

    Call it inside the action's transaction, after the write: the row commits or rolls
    back with the change. `kind` says what happened (`runner.busy`, `pool.deleted`).
    """
    resource = obj._meta.model_name
    if resource not in RESOURCES:
        raise ValueError(f"no event stream for {resource!r}")
    event = Event.objects.create(
        kind=kind,
        resource=resource,
        resource_id=str(obj.pk),
        created_at=at or timezone.now(),
    )
    wakebus.notify_on_commit(wakebus.EVENTS)  # the relays look at once, not at their poll
    return event


def emit_many(kind: str, model: type, pks, *, at: datetime | None = None) -> int:
    """One row per pk, in one INSERT: a bulk change announces every row it touched."""
    resource = model._meta.model_name
    if resource not in RESOURCES:
        raise ValueError(f"no event stream for {resource!r}")
    when = at or timezone.now()
    rows = [Event(kind=kind, resource=resource, resource_id=str(pk), created_at=when) for pk in pks]
    written = len(Event.objects.bulk_create(rows))
    wakebus.notify_on_commit(wakebus.EVENTS)
    return written


def emit_each(entries: list[tuple[str, Any, datetime]]) -> int:
    """One row per (kind, obj, at), in one INSERT and in that order: a group of different
    changes, each announced as `emit` would."""
    rows = []
    for kind, obj, at in entries:
        resource = obj._meta.model_name
        if resource not in RESOURCES:
            raise ValueError(f"no event stream for {resource!r}")
        rows.append(Event(kind=kind, resource=resource, resource_id=str(obj.pk), created_at=at))
    if not rows:
        return 0
    written = len(Event.objects.bulk_create(rows))
    wakebus.notify_on_commit(wakebus.EVENTS)
    return written


def prune_events(now: datetime, *, keep: timedelta = RETENTION) -> int:
    """Drop rows older than `keep`, but always the newest one, so ids never restart on
    SQLite (a reused id would look already seen to a browser resuming from it)."""
    newest = Event.objects.order_by("-pk").values_list("pk", flat=True).first()
    if newest is None:
        return 0
    deleted, _ = Event.objects.filter(created_at__lt=now - keep).exclude(pk=newest).delete()
    return deleted


def latest_id() -> int:
    return Event.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


class AdminEvents:
    """A ModelAdmin mixin: an add, change or delete made in the admin is announced like one
    made through the API (the admin's view runs it inside its own transaction)."""

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        emit(f"{obj._meta.model_name}.{'updated' if change else 'created'}", obj)

    def delete_model(self, request, obj):
        pk = obj.pk
        super().delete_model(request, obj)
        emit(f"{obj._meta.model_name}.deleted", type(obj)(pk=pk))

    def delete_queryset(self, request, queryset):
        model, pks = queryset.model, list(queryset.values_list("pk", flat=True))
        super().delete_queryset(request, queryset)
        emit_many(f"{model._meta.model_name}.deleted", model, pks)
