"""Admin for stored settings and leases."""

from django.contrib import admin

from zoomies_site.models import Lease, SettingValue


@admin.register(SettingValue)
class SettingValueAdmin(admin.ModelAdmin):
    list_display = ["key", "value", "updated_at", "updated_by"]
    readonly_fields = ["updated_at", "updated_by"]


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    list_display = ["name", "holder", "expires_at", "acquired_at", "dirty"]
    readonly_fields = ["name", "holder", "expires_at", "acquired_at", "dirty"]

    def has_add_permission(self, request):
        return False
