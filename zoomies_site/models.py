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
