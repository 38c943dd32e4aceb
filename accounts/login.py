"""Password sign-in, slowed against guessing (issue 10 item 2).

Failures are counted in the database (shared by every web process) per username and per
client address over `auth.login_window`; past `auth.login_max_failures` for the username,
or `auth.login_max_failures_per_ip` for the address, every password sign-in is refused until
the oldest counted failure leaves the window, the right password included. The check sits in
the authentication backend, so the admin's login, any other login form and DRF all pass it.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from accounts import audit
from accounts.models import LoginFailure
from accounts.roles import Level, role_level
from zoomies_site.core import registry

log = logging.getLogger("zoomies.accounts")
# Who a failed sign-in was, as far as the audit log can know: nobody yet.
ANONYMOUS = "anonymous"


def client_ip(request) -> str:
    # REMOTE_ADDR only: a forwarded header is whatever the client chose to send.
    return (request.META.get("REMOTE_ADDR") or "unknown")[:64] if request is not None else ""


def _norm(username: str | None) -> str:
    return (username or "").strip().lower()[:150]


def refusal(username: str | None, ip: str, now: datetime | None = None) -> str | None:
    """Why sign-ins for `username` from `ip` are held now, or None if they are not."""
    now = now or timezone.now()
    window = registry.get("auth.login_window")
    recent = LoginFailure.objects.filter(at__gt=now - window)
    name = _norm(username)
    minutes = max(1, int(window.total_seconds() // 60))
    if name and recent.filter(username=name).count() >= registry.get("auth.login_max_failures"):
        return f"Too many failed sign-ins for {name}: wait up to {minutes} minutes and try again."
    if ip and recent.filter(ip=ip).count() >= registry.get("auth.login_max_failures_per_ip"):
        return f"Too many failed sign-ins from this address: wait up to {minutes} minutes."
    return None


def record_failure(username: str | None, ip: str, now: datetime | None = None) -> None:
    """Count the failure, and audit it (issue 21 item 15): a failed sign-in, and the one that
    puts the username or the address on hold, which is the row an operator looks for."""
    now = now or timezone.now()
    name = _norm(username)
    with transaction.atomic():
        LoginFailure.objects.create(at=now, username=name, ip=ip)
        # Rows older than the window count for nothing: drop them while here.
        LoginFailure.objects.filter(at__lte=now - registry.get("auth.login_window")).delete()
        audit.record(
            actor=ANONYMOUS,
            action="auth.sign_in_failed",
            detail={"username": name, "ip": ip},
            at=now,
        )
        held = refusal(username, ip, now)
        if held:
            audit.record(
                actor=ANONYMOUS,
                action="auth.sign_in_held",
                detail={"username": name, "ip": ip, "why": held},
                at=now,
            )


def clear_failures(username: str | None) -> None:
    LoginFailure.objects.filter(username=_norm(username)).delete()


class RateLimitedModelBackend(ModelBackend):
    """Django's username/password backend behind the failure counts."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get("username")
        if username is None or password is None:
            return None
        ip = client_ip(request)
        held = refusal(username, ip)
        if held:
            log.warning("sign-in held for %r from %s: %s", username, ip, held)
            raise PermissionDenied(held)  # stops every other backend too
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            record_failure(username, ip)
            return None
        clear_failures(username)
        return user


class RateLimitedAdminLoginForm(AdminAuthenticationForm):
    """The admin's login form, saying why when sign-ins are held (not just "wrong password")."""

    def clean(self):
        held = refusal(self.cleaned_data.get("username"), client_ip(self.request))
        if held:
            raise ValidationError(held, code="rate_limited")
        return super().clean()

    def confirm_login_allowed(self, user):
        # The admin's form also demands is_staff; the Zoomies role decides instead.
        if not user.is_active:
            raise ValidationError(self.error_messages["inactive"], code="inactive")
        if role_level(user.role) < Level.READ:
            raise ValidationError(
                self.error_messages["invalid_login"],
                code="invalid_login",
                params={"username": self.username_field.verbose_name},
            )
