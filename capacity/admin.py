"""The capacity layer in the Django admin: read-only.

Attempts, tries, spawns and failure counts change only through capacity.actions and the
loop, which write the audit row with each change. Claim codes are not listed at all: only
their hashes exist, and a hash is of no use to an operator.
"""

from __future__ import annotations

from django.contrib import admin

from capacity.models import Attempt, ProvisionFailures, ProvisionOutcome, Spawn, Try


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class TryInline(admin.TabularInline):
    model = Try
    extra = 0
    can_delete = False
    fields = ("number", "started_at", "finished_at", "outcome", "status_code", "error")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Attempt)
class AttemptAdmin(ReadOnly):
    list_display = ("event_id", "type", "pool_key", "subject", "state", "tries", "started_at")
    list_filter = ("type", "state")
    search_fields = ("event_id", "pool_key", "subject")
    inlines = [TryInline]


@admin.register(Spawn)
class SpawnAdmin(ReadOnly):
    list_display = ("host_name", "state", "destination_url", "created_at", "joined_at")
    list_filter = ("state",)
    search_fields = ("host_name",)


@admin.register(ProvisionFailures)
class ProvisionFailuresAdmin(ReadOnly):
    list_display = ("destination_url", "consecutive", "deferred_until", "last_failure_at")


@admin.register(ProvisionOutcome)
class ProvisionOutcomeAdmin(ReadOnly):
    list_display = ("host_name", "outcome", "destination_url", "recorded_at", "spawn_gone_at")
    list_filter = ("outcome",)
