"""Admin for users, API tokens (revoked, never deleted) and the audit log (read-only)."""

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import Group
from django.db import router, transaction

from accounts import actions
from accounts.models import ApiToken, AuditLog, User

# Django's groups grant nothing here (the role decides, accounts.roles): not offered at all.
admin.site.unregister(Group)


@admin.register(User)
class ZoomiesUserAdmin(UserAdmin):
    # The role is what counts: Django's staff, superuser, group and permission fields grant
    # nothing here (User.has_perm), so they are not offered.
    fieldsets = [
        (None, {"fields": ["username", "password"]}),
        ("Personal info", {"fields": ["first_name", "last_name", "email"]}),
        ("Access", {"fields": ["role", "is_active", "oidc_subject"]}),
        ("Dates", {"fields": ["last_login", "date_joined"]}),
    ]
    add_fieldsets = [
        (None, {"classes": ["wide"], "fields": ["username", "role", "usable_password",
                                                  "password1", "password2"]}),
    ]  # fmt: skip
    list_display = ["username", "email", "role", "is_active", "oidc_subject"]
    list_filter = ["role", "is_active"]
    readonly_fields = ["oidc_subject", "last_login", "date_joined"]

    def user_change_password(self, request, id, form_url=""):
        # The password form saves outside the admin's usual transaction: the change and its
        # audit row (written by log_change) commit together here.
        with transaction.atomic(using=router.db_for_write(self.model)):
            return super().user_change_password(request, id, form_url)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "name", "user", "prefix", "scopes", "expires_at", "last_used_at", "revoked_at",
    ]  # fmt: skip
    list_filter = ["revoked_at"]
    search_fields = ["name", "prefix", "user__username"]
    fields = [
        "name", "user", "prefix", "scopes", "created_at", "expires_at", "last_used_at",
        "revoked_at", "revoked_by",
    ]  # fmt: skip
    readonly_fields = fields
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # minted by the API or `manage.py token create`, the secret shown once

    def has_change_permission(self, request, obj=None):
        return False  # a token's scopes never change: revoke it and mint another

    def has_delete_permission(self, request, obj=None):
        return False  # revocation is a state, so the audit log can still name the token

    def has_revoke_permission(self, request) -> bool:
        return request.user.has_perm("accounts.change_apitoken")

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke(self, request, queryset) -> None:
        actor = f"user:{request.user.get_username()}"
        revoked = sum(actions.revoke_api_token(t, actor=actor) for t in queryset)
        self.message_user(request, f"{revoked} token(s) revoked.", messages.SUCCESS)


@admin.register(AuditLog)
class AuditLogAdmin(admin.ModelAdmin):
    date_hierarchy = "at"
    list_display = ["at", "actor", "action", "target_type", "target_id"]
    list_filter = ["action", "target_type"]
    search_fields = ["actor", "target_id", "action"]
    readonly_fields = ["at", "actor", "action", "target_type", "target_id", "detail"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
