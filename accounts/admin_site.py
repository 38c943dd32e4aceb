"""The Django admin, gated by the Zoomies role rather than Django's staff flag (AUTH-03).

Any active user with a role may sign in; what they see and may change is their role's
(`User.has_perm` asks accounts.roles), so a viewer's admin is read-only and shows no
secrets, whatever `is_staff` or `is_superuser` say. Every registered ModelAdmin gets the
audit mixin (accounts.admin_audit).
"""

from __future__ import annotations

from django.contrib import admin
from django.db import transaction

from accounts import audit, oidc
from accounts.admin_audit import AuditedAdmin
from accounts.login import RateLimitedAdminLoginForm
from accounts.roles import Level, role_level


class ZoomiesAdminSite(admin.AdminSite):
    site_header = "Zoomies"
    site_title = "Zoomies"
    index_title = "Fleet administration"
    login_form = RateLimitedAdminLoginForm
    login_template = "accounts/login.html"

    def has_permission(self, request) -> bool:
        user = request.user
        return bool(
            user.is_active
            and user.is_authenticated
            and role_level(getattr(user, "role", None)) >= Level.READ
        )

    def register(self, model_or_iterable, admin_class=None, **options):
        base = admin_class or admin.ModelAdmin
        if not issubclass(base, AuditedAdmin):
            base = type(
                f"Audited{base.__name__}", (AuditedAdmin, base), {"__module__": base.__module__}
            )
        return super().register(model_or_iterable, base, **options)

    def password_change(self, request, extra_context=None):
        """A user's own password change: saved and audited together, the hash never shown."""
        with transaction.atomic():
            before = request.user.password
            response = super().password_change(request, extra_context)
            if request.method == "POST" and request.user.password != before:
                audit.record(
                    actor=f"user:{request.user.get_username()}",
                    action="user.password_change",
                    target=request.user,
                    detail={"via": "admin"},
                )
        return response

    def login(self, request, extra_context=None):
        context = {**(extra_context or {}), "oidc_enabled": oidc.enabled()}
        context["sso_refused"] = request.GET.get("sso") == "refused"
        return super().login(request, context)
