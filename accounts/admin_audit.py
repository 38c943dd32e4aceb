"""Every change made through the Django admin writes one audit row (AUTH-06).

The site (accounts.admin_site) puts `AuditedAdmin` in front of every ModelAdmin it registers,
so no model's admin can forget it. The row is written in the same transaction as the save or
delete: the admin's add, change and delete views run in one, and the bulk delete action is
wrapped in one here. It holds the object's fields before and after, secrets masked.
"""

from __future__ import annotations

import json

from django.core.serializers.json import DjangoJSONEncoder
from django.db import router, transaction

from accounts import audit

MASKED = "•••"
# Admin actions defined here call this project's actions, which write their own audit rows.
PROJECT_PACKAGES = frozenset({"accounts", "capacity", "fleet", "runners", "zoomies_site"})
# A field whose name holds one of these is a credential: the audit says whether it changed.
SECRET_NAME_PARTS = ("password", "secret", "hash", "private_key", "token_value")


def _is_secret(name: str) -> bool:
    return any(part in name for part in SECRET_NAME_PARTS)


def snapshot(obj) -> dict:
    """The object's own columns as JSON-ready values, secrets masked."""
    values = {}
    for field in obj._meta.concrete_fields:
        value = field.value_from_object(obj)
        values[field.attname] = MASKED if _is_secret(field.attname) and value else value
    return json.loads(json.dumps(values, cls=DjangoJSONEncoder))


def _raw_secrets(obj) -> dict:
    return {
        f.attname: f.value_from_object(obj)
        for f in obj._meta.concrete_fields
        if _is_secret(f.attname)
    }


def _actor(request) -> str:
    return f"user:{request.user.get_username()}"


def _action(obj, verb: str) -> str:
    return f"{obj._meta.model_name}.admin_{verb}"


class AuditedAdmin:
    """A ModelAdmin mixin: one audit row per add, change and delete, with before and after."""

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            obj._audit_before = snapshot(obj)
            obj._audit_secrets = _raw_secrets(obj)
        return obj

    def log_addition(self, request, obj, message):
        audit.record(
            actor=_actor(request),
            action=_action(obj, "add"),
            target=obj,
            detail={"via": "admin", "before": None, "after": snapshot(obj)},
        )
        return super().log_addition(request, obj, message)

    def log_change(self, request, obj, message):
        before = getattr(obj, "_audit_before", None)
        after = snapshot(obj)
        changed = sorted(k for k in after if before is None or before.get(k) != after[k])
        # A masked credential looks the same before and after: compare the real values.
        old_secrets = getattr(obj, "_audit_secrets", None)
        if old_secrets is not None:
            new_secrets = _raw_secrets(obj)
            changed = sorted(
                set(changed) | {k for k in new_secrets if new_secrets[k] != old_secrets.get(k)}
            )
        audit.record(
            actor=_actor(request),
            action=_action(obj, "change"),
            target=obj,
            detail={"via": "admin", "before": before, "after": after, "changed": changed},
        )
        return super().log_change(request, obj, message)

    def get_actions(self, request):
        """Another package's admin actions (django-q2's "resubmit") get one audit row each."""
        actions = super().get_actions(request)
        for name, (func, _name, description) in list(actions.items()):
            module = (getattr(func, "__module__", "") or "").split(".")[0]
            # delete_selected is audited in delete_queryset, once per deleted row.
            if name == "delete_selected" or module in PROJECT_PACKAGES:
                continue
            actions[name] = (_audited_action(func, name), name, description)
        return actions

    def delete_model(self, request, obj):
        # The delete view runs this inside its transaction: the row and the delete go together.
        _record_deletion(request, obj)
        return super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        # The bulk "delete selected" action has no transaction of its own.
        with transaction.atomic(using=router.db_for_write(queryset.model)):
            for obj in queryset:
                _record_deletion(request, obj)
            return super().delete_queryset(request, queryset)


def _record_deletion(request, obj) -> None:
    audit.record(
        actor=_actor(request),
        action=_action(obj, "delete"),
        target=obj,
        detail={"via": "admin", "before": snapshot(obj), "after": None},
    )


def _audited_action(func, name: str):
    def audited(modeladmin, request, queryset):
        model = queryset.model
        with transaction.atomic(using=router.db_for_write(model)):
            ids = [str(pk) for pk in queryset.values_list("pk", flat=True)]
            result = func(modeladmin, request, queryset)
            audit.record(
                actor=_actor(request),
                action=f"{model._meta.model_name}.admin_action",
                detail={"via": "admin", "action": name, "ids": ids},
            )
        return result

    return audited
