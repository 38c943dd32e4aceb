"""Site-wide rows: operator settings stored in the database, and leases."""

from __future__ import annotations

from django.db import models


class SettingValue(models.Model):
    """The database layer of the settings registry: one operator-set value per key."""

    key = models.CharField(max_length=100, unique=True)
    value = models.JSONField()
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        # Never the value: a secret's sealed form has no business in logs or page titles.
        return self.key


class Lease(models.Model):
    """A named lease row: who holds a once-at-a-time loop, and until when."""

    name = models.CharField(max_length=64, unique=True)
    holder = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    acquired_at = models.DateTimeField(null=True, blank=True)
    # A wake that arrives while the holder works marks the lease dirty; the holder runs again.
    dirty = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder or 'nobody'}"


class Event(models.Model):
    """One row of the transactional outbox (EVT-02): a change to announce, written in the
    same transaction as the change itself, so a rolled-back change is never announced.

    The row names the resource; the frame (its API GET shape, EVT-05) is rendered by the
    relay when it reads the row, once for every viewer. Overview and problems frames carry
    their payload, since they describe no single row.
    """

    kind = models.CharField(max_length=64)
    resource = models.CharField(max_length=32)
    resource_id = models.CharField(max_length=64, blank=True)
    payload = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"#{self.pk} {self.kind} {self.resource}:{self.resource_id}"
