"""State changes owned by the site app: operator settings, each with its audit row."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from accounts import audit
from zoomies_site.core import registry, sealing
from zoomies_site.core.findings import Finding
from zoomies_site.core.models import SettingValue


class InvalidSetting(ValueError):
    """A value the registry refuses, with a sentence an operator can act on."""

    def __init__(self, key: str, message: str, findings: list[Finding] | None = None):
        self.key = key
        self.findings = findings or []
        super().__init__(message)


def _editable(key: str) -> registry.Setting:
    item = registry.ENTRIES.get(key)
    if item is None:
        raise InvalidSetting(key, f"There is no setting called {key}.")
    if not isinstance(item, registry.Setting):
        raise InvalidSetting(key, f"{key} is worked out from other settings and cannot be set.")
    return item


def _new_errors(db_values: dict[str, Any]) -> list[Finding]:
    """Errors the candidate database layer has that the live configuration does not."""
    before = {f.key for f in registry.validate(registry.layered())}
    after = registry.validate(registry.layered(db_values=db_values))
    return [f for f in after if f.is_error and f.key not in before]


def _shown(setting: registry.Setting, stored: Any) -> Any:
    """A stored value as the audit log may show it: masked if secret, None if unreadable."""
    try:
        return setting.display(setting.parse(registry.from_stored(stored)))
    except (ValueError, sealing.SealError):
        # A value this version no longer accepts, or one sealed with another key, is still
        # replaceable.
        return None


def _stored_rows() -> dict[str, Any]:
    return dict(SettingValue.objects.values_list("key", "value"))


def set_setting(key: str, value: Any, *, actor: str) -> Any:
    """Validate `value`, store it as the database layer of `key`, audit it; return it typed.

    A value that would add an error finding (a range, or a relationship such as the provision
    timeout against the create lease) is refused with InvalidSetting, because the next start
    would refuse it too. Errors already present, from another layer, do not block an edit.

    A secret entry is sealed before it reaches the row (AUTH-07); with no usable sealing key
    it is refused with InvalidSetting rather than stored in the clear.
    """
    setting = _editable(key)
    try:
        typed = setting.parse(value)
    except ValueError as exc:
        raise InvalidSetting(key, f"{key}: {exc}.") from None
    try:
        stored = registry.to_stored(setting, typed)
    except sealing.SealError as exc:
        raise InvalidSetting(key, f"{key} cannot be sealed for storage: {exc}.") from None
    with transaction.atomic():
        rows = _stored_rows()
        broken = _new_errors({**rows, key: stored})
        if broken:
            reasons = " ".join(f"{f.title}: {f.why}" for f in broken)
            raise InvalidSetting(
                key, f"{key} cannot be {setting.display(typed)!r}. {reasons}", broken
            )
        old = _shown(setting, rows[key]) if key in rows else None
        row, _ = SettingValue.objects.update_or_create(
            key=key, defaults={"value": stored, "updated_by": actor}
        )
        audit.record(
            actor=actor,
            action="setting.set",
            target=row,
            detail={"key": key, "old": old, "new": setting.display(typed)},
        )
        transaction.on_commit(registry.reload)
    return typed


def reset_setting(key: str, *, actor: str) -> bool:
    """Delete `key`'s database value so the layers below it apply again; False if none was set.

    A row whose key this version has no setting for (a retired key, which the registry
    reports as unknown) is removed the same way, so it never needs a raw delete.
    """
    setting = registry.SETTINGS.get(key)
    with transaction.atomic():
        rows = _stored_rows()
        if key not in rows:
            _editable(key)  # no row: say why when the key is not a setting at all
            return False
        rows.pop(key)
        broken = _new_errors(rows)
        if broken:
            reasons = " ".join(f"{f.title}: {f.why}" for f in broken)
            raise InvalidSetting(key, f"{key} cannot go back to its default. {reasons}", broken)
        row = SettingValue.objects.get(key=key)
        old = _shown(setting, row.value) if setting is not None else None
        audit.record(
            actor=actor, action="setting.reset", target=row, detail={"key": key, "old": old}
        )
        row.delete()
        transaction.on_commit(registry.reload)
    return True
