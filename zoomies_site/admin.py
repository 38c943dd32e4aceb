"""Admin for stored settings and leases."""

import json

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.utils.translation import gettext as _

from zoomies_site import actions
from zoomies_site.core import registry
from zoomies_site.core.models import Lease, SettingValue

SEALED_SHOWN = "••• sealed"
UNSEALED_SHOWN = "••• secret, not sealed"


class _Named:
    """A row as the admin's checkboxes, titles and breadcrumbs name it: by its key alone.

    `SettingValue.__str__` includes the stored value, which for a secret is its sealed form
    (or, for a row from before sealing, the secret itself); the admin calls str() on the rows
    it lists and shows, so it is handed this instead.
    """

    def __init__(self, row: SettingValue):
        self._row = row

    def __getattr__(self, name: str):
        return getattr(self._row, name)

    def __str__(self) -> str:
        return self._row.key


@admin.register(SettingValue)
class SettingValueAdmin(admin.ModelAdmin):
    """Read-only: a setting is changed through the Settings page or `manage.py set_secret`.

    Editing a row here would skip validation, sealing (AUTH-07) and the audit row, so nothing
    is added, changed or deleted directly; the one action is a reset, through `reset_setting`.
    A secret's value is never shown, sealed or not.
    """

    list_display = ["key", "shown_value", "updated_at", "updated_by"]
    fields = ["key", "shown_value", "updated_at", "updated_by"]
    readonly_fields = fields
    actions = ["reset_to_lower_layers"]

    def action_checkbox(self, obj):
        return super().action_checkbox(_Named(obj))

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(subtitle=obj.key, original=_Named(obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def history_view(self, request, object_id, extra_context=None):
        obj = self.get_object(request, unquote(object_id))
        if obj is not None:
            named = {"title": _("Change history: %s") % obj.key, "object": _Named(obj)}
            extra_context = {**(extra_context or {}), **named}
        return super().history_view(request, object_id, extra_context)

    @admin.display(description="value")
    def shown_value(self, obj: SettingValue) -> str:
        if registry.is_sealed(obj.value):
            return SEALED_SHOWN
        setting = registry.SETTINGS.get(obj.key)
        if setting is not None and setting.secret:
            return UNSEALED_SHOWN  # from before sealing; the Settings page warns of it
        return json.dumps(obj.value)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a row goes through the reset action, which validates and audits it

    def has_reset_permission(self, request) -> bool:
        return request.user.has_perm("zoomies_site.delete_settingvalue")

    @admin.action(
        description="Reset: remove the stored value so the layers below apply",
        permissions=["reset"],
    )
    def reset_to_lower_layers(self, request, queryset) -> None:
        actor = f"user:{request.user.get_username()}"
        removed = 0
        for key in queryset.values_list("key", flat=True):
            try:
                removed += actions.reset_setting(key, actor=actor)
            except actions.InvalidSetting as exc:
                self.message_user(request, str(exc), messages.ERROR)
        self.message_user(request, f"{removed} setting(s) reset.", messages.SUCCESS)


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    list_display = ["name", "holder", "expires_at", "acquired_at", "dirty"]
    readonly_fields = ["name", "holder", "expires_at", "acquired_at", "dirty"]

    def has_add_permission(self, request):
        return False
