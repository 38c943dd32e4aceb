"""Admin for users, API tokens and the audit log (read-only)."""

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from accounts.models import ApiToken, AuditLog, User


@admin.register(User)
class ZoomiesUserAdmin(UserAdmin):
    fieldsets = [*UserAdmin.fieldsets, ("Zoomies", {"fields": ["role"]})]
    list_display = ["username", "email", "role", "is_active", "is_staff"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "scopes", "expires_at", "last_used_at"]
    readonly_fields = ["prefix", "secret_hash", "created_at", "last_used_at"]

    def has_add_permission(self, request):
        return False  # minted by create_token, so the secret is shown exactly once


@admin.register(AuditLog)
class AuditLogAdmin(admin.ModelAdmin):
    list_display = ["at", "actor", "action", "target_type", "target_id"]
    list_filter = ["action"]
    search_fields = ["actor", "target_id"]
    readonly_fields = ["at", "actor", "action", "target_type", "target_id", "detail"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
