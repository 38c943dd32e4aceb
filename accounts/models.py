"""Users, API tokens, login failures and the audit log."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser, UserManager
from django.db import models

from accounts.roles import role_has_module, role_has_perm


class ZoomiesUserManager(UserManager):
    """`createsuperuser` makes an admin: the Zoomies role, not Django's flag, grants power."""

    def create_superuser(self, username, email=None, password=None, **extra_fields):
        extra_fields.setdefault("role", User.Role.ADMIN)
        return super().create_superuser(username, email, password, **extra_fields)


class User(AbstractUser):
    """An operator. Custom from the first migration so fields can be added later.

    What a user may do is its `role` alone (accounts.roles): Django's is_superuser, is_staff,
    groups and per-user permissions grant nothing here, so one flag cannot quietly outrank it.
    """

    class Role(models.TextChoices):
        ADMIN = "admin"
        OPERATOR = "operator"
        VIEWER = "viewer"

    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    # "<issuer> <sub>" for a user who signs in through OIDC; a local account never matches.
    oidc_subject = models.CharField(max_length=500, null=True, blank=True, unique=True)

    objects = ZoomiesUserManager()

    def has_perm(self, perm, obj=None) -> bool:
        return self.is_active and role_has_perm(self.role, perm)

    def has_module_perms(self, app_label) -> bool:
        return self.is_active and role_has_module(self.role, app_label)


class ApiToken(models.Model):
    """A scoped bearer token for scripts; only the SHA-256 of the secret is stored.

    A revoked token keeps its row (revoked_at, revoked_by) so the audit log can still name it.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True)
    secret_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def actor(self) -> str:
        """How the audit log names a change made with this token: the token and its owner."""
        return f"token:{self.prefix}({self.name}) of user:{self.user.get_username()}"


class LoginFailure(models.Model):
    """One refused password sign-in, counted per username and per address to slow guessing."""

    at = models.DateTimeField(db_index=True)
    username = models.CharField(max_length=150, db_index=True)
    ip = models.CharField(max_length=64, db_index=True)


class AuditLog(models.Model):
    """One row per mutating action, written inside the action's own transaction."""

    at = models.DateTimeField(db_index=True)
    actor = models.CharField(
        max_length=200,
        db_index=True,
        help_text="a user, a token, an agent or system:<loop>",
    )
    action = models.CharField(max_length=100)
    target_type = models.CharField(max_length=50, blank=True)
    target_id = models.CharField(max_length=100, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id"], name="audit_target")]

    def __str__(self) -> str:
        when = f"{self.at:%Y-%m-%d %H:%M:%S}"
        return f"{when} {self.actor} {self.action} {self.target_type}:{self.target_id}"
