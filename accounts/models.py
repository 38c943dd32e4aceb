"""Users, API tokens and the audit log."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models


class User(AbstractUser):
    """An operator. Custom from the first migration so fields can be added later."""

    class Role(models.TextChoices):
        ADMIN = "admin"
        OPERATOR = "operator"
        VIEWER = "viewer"

    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)


class ApiToken(models.Model):
    """A scoped bearer token for scripts; only the SHA-256 of the secret is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True)
    secret_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class AuditLog(models.Model):
    """One row per mutating action, written inside the action's own transaction."""

    at = models.DateTimeField(db_index=True)
    actor = models.CharField(max_length=200, help_text="a user, a token, an agent or system:<loop>")
    action = models.CharField(max_length=100)
    target_type = models.CharField(max_length=50, blank=True)
    target_id = models.CharField(max_length=100, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        when = f"{self.at:%Y-%m-%d %H:%M:%S}"
        return f"{when} {self.actor} {self.action} {self.target_type}:{self.target_id}"
