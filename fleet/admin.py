"""The fleet in the Django admin: configuration editable, lifecycle fields read-only.

Health, task states, attempts, leases and token hashes change only through fleet.actions
and the task queue, which audit each change, so the admin shows them and never saves them.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.utils import timezone

from fleet import actions
from fleet.models import AgentTask, Host, JoinToken, Machine
from zoomies_site.core.events import AdminEvents


@admin.register(Host)
class HostAdmin(AdminEvents, admin.ModelAdmin):
    list_display = (
        "name",
        "health",
        "cordoned",
        "capacity",
        "platform",
        "version",
        "last_heartbeat_at",
    )
    list_filter = ("health", "cordoned", "platform")
    search_fields = ("name",)
    readonly_fields = (
        "health",
        "health_changed_at",
        "cordoned",
        "agent_token_prefix",
        "agent_token_hash",
        "joined_at",
        "last_heartbeat_at",
        "disk_total_mb",
        "disk_free_mb",
        "usage",
        "usage_at",
        "embedded",
        # What the agent reports on every heartbeat: an edit here would be overwritten.
        "capacity",
        "backends",
        "platform",
        "cpus",
        "memory_mb",
        "labels",
        "version",
    )
    actions = ("cordon", "uncordon")

    def has_add_permission(self, request) -> bool:
        return False  # a host joins with a token (manage.py create_join_token)

    @admin.action(description="Cordon: place no new runners")
    def cordon(self, request, queryset) -> None:
        self._set_cordon(request, queryset, True)

    @admin.action(description="Uncordon")
    def uncordon(self, request, queryset) -> None:
        self._set_cordon(request, queryset, False)

    def _set_cordon(self, request, queryset, cordoned: bool) -> None:
        now = timezone.now()
        changed = sum(
            actions.set_host_cordon(
                host=host, cordoned=cordoned, now=now, actor=f"user:{request.user.get_username()}"
            )
            for host in queryset
        )
        self.message_user(request, f"{changed} host(s) changed.", messages.SUCCESS)


@admin.register(JoinToken)
class JoinTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "created_at", "expires_at", "used_at", "host", "created_by")
    readonly_fields = (
        "token_hash",
        "prefix",
        "created_at",
        "expires_at",
        "used_at",
        "host",
        "created_by",
    )

    def has_add_permission(self, request) -> bool:
        return False  # the secret is shown once, by manage.py create_join_token

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(AgentTask)
class AgentTaskAdmin(admin.ModelAdmin):
    list_display = ("pk", "kind", "state", "host", "runner", "attempt", "lease_deadline")
    list_filter = ("state", "kind")
    search_fields = ("host__name", "runner__name")
    # The payload's env holds a runner's credential (sealed): only its names are shown.
    exclude = ("payload",)
    readonly_fields = (
        *(
            f.name
            for f in AgentTask._meta.get_fields()
            if f.concrete and not f.many_to_many and f.name != "payload"
        ),
        "payload_shown",
    )

    @admin.display(description="payload")
    def payload_shown(self, task: AgentTask) -> str:
        payload = dict(task.payload or {})
        env = payload.pop("env", None)
        if isinstance(env, dict):
            payload["env_keys"] = sorted(env)
        return json.dumps(payload, sort_keys=True)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Machine)
class MachineAdmin(admin.ModelAdmin):
    list_display = ("name", "provider", "state", "host", "state_changed_at")
    list_filter = ("state", "provider")
    search_fields = ("name", "identity")
    readonly_fields = ("state", "state_changed_at", "created_at", "identity", "host", "message")

    def has_add_permission(self, request) -> bool:
        return False
