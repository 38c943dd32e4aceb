"""Configured machine providers: create, change, delete, and the loop's outage record
(issue 23 item 7).

The API and any other surface call these; each is one durable transaction with its audit
row. Validation lives here too (`provider_errors`), so every caller refuses the same things.
A provider's name is what its machines record (`Machine.provider`), so neither the name nor
the kind changes once the row exists, and a provider is deleted only once it has no machine
left that is not deleted.

A proxmox provider is made from an enrolled setup (fleet.provider_setups, MACH-23): its
connection (endpoint, CA or fingerprint, the token sealed) is copied from the setup, which is
deleted in the same transaction. An operator who made a token by hand gives `endpoint` and
`token_file` (a file on the controller's disk) instead. The API never takes a token itself,
and never shows one.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts import audit
from fleet import provider_setups
from fleet.models import Machine, MachineProvider
from fleet.providers.proxmox.provider import ProxmoxConfig
from fleet.states import MachineState

# The kinds the API may configure.
API_KINDS = ("fake", "local", "proxmox")
# A proxmox config through here: ProxmoxConfig's fields but these two, which decide what is
# ours and the seed's route (the controller's own)...
PROXMOX_FIXED = ("seed_path", "mark_prefix")
# ...and, without a setup only, the connection of a token made by hand.
PROXMOX_BY_HAND = ("endpoint", "token_file", "ca_file", "fingerprint")
# Never through the API, in either direction: a token is a setup's, or in a token_file.
SECRET_KEYS = ("token", "token_sealed")
# A proxmox provider's connection: made once (from a setup or by hand) and kept by every
# change of its settings, which may repeat what it shows of it but never change it.
PROXMOX_CONNECTION = (*PROXMOX_BY_HAND, "ca_pem", "token_id", *SECRET_KEYS)
VMID_MAX = 999_999_999
LIMITS = ("max_machines", "max_per_pool", "slots_per_machine")
# Far above any real fleet, and inside a 32-bit integer column on every database.
LIMIT_MAX = 10_000
# What a local provider's config may say through here: never its `python`, which names a
# program the controller would run.
LOCAL_BACKENDS = ("process", "docker", "podman")
LOCAL_CAPACITY_MAX = 64
EDITABLE = ("enabled", "pools", "config", *LIMITS)


class ProviderInUse(Exception):
    """The provider still has machines; deleting it would leave them nobody's."""


def provider_errors(
    values: Mapping[str, Any], *, instance: MachineProvider | None = None
) -> dict[str, list[str]]:
    """What is wrong with `values` as a new provider (or as changes to `instance`), by field."""
    errors: dict[str, list[str]] = {}

    def bad(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    if instance is None:
        for message in provider_setups.provider_name_errors(values.get("name")):
            bad("name", message)
        if values.get("kind") not in API_KINDS:
            bad("kind", f"one of {', '.join(API_KINDS)}")
    else:
        for field in ("name", "kind"):
            if field in values and values[field] != getattr(instance, field):
                bad(field, "cannot be changed: its machines are recorded under it")
    if "enabled" in values and not isinstance(values["enabled"], bool):
        bad("enabled", "true or false")
    if "pools" in values:
        pools = values["pools"]
        if not isinstance(pools, list) or not all(isinstance(p, str) and p.strip() for p in pools):
            bad("pools", "a list of pool names, none of them empty")
        elif len(set(pools)) != len(pools):
            bad("pools", "a pool is named twice")
    for field in LIMITS:
        if field in values:
            value = values[field]
            if isinstance(value, bool) or not isinstance(value, int):
                bad(field, "a whole number")
            elif not 1 <= value <= LIMIT_MAX:
                bad(field, f"at least 1 and at most {LIMIT_MAX}")
    kind = values.get("kind") if instance is None else instance.kind
    with_setup = "setup" in values
    if with_setup:
        if instance is not None:
            bad("setup", "only when the provider is made")
        elif kind != "proxmox":
            bad("setup", "only a proxmox provider is made from a setup")
        else:
            for message in _setup_errors(values["setup"], values.get("name")):
                bad("setup", message)
    if kind == "proxmox" and instance is None and "config" not in values:
        bad("config", "a proxmox provider needs its settings, config.template at least")
    if "config" in values and "kind" not in errors:  # a kind's settings are that kind's
        stored = instance.config if instance is not None else None
        for message in _config_errors(kind, values["config"], stored=stored, with_setup=with_setup):
            bad("config", message)
    return errors


def _setup_errors(pk: Any, name: Any) -> list[str]:
    if isinstance(pk, bool) or not isinstance(pk, int):
        return ["the id of an enrolled setup"]
    setup = provider_setups.live_setups(timezone.now()).filter(pk=pk).first()
    if setup is None:
        return [f"no setup {pk}: it expired, was used, or never was"]
    if not setup.ready:
        return [f"setup {pk} is not enrolled yet: run its command on the hypervisor"]
    if setup.name != name:
        return [f"setup {pk} was started for the provider {setup.name}"]
    return []


def _config_errors(kind: Any, config: Any, *, stored: Any, with_setup: bool) -> list[str]:
    if not isinstance(config, dict):
        return ["an object"]
    if kind == "fake":
        return ["a fake provider takes no settings"] if config else []
    if kind == "proxmox":
        if stored is not None:
            return _proxmox_change_errors(config, stored)
        return _proxmox_errors(config, with_setup=with_setup)
    if kind != "local":
        return [f"a {kind} provider's settings are not changed through this API"]
    found = []
    unknown = sorted(set(config) - {"capacity", "backend"})
    if unknown:
        found.append(f"a local provider takes capacity and backend only, not {', '.join(unknown)}")
    capacity = config.get("capacity", 1)
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        found.append("capacity: a whole number")
    elif not 1 <= capacity <= LOCAL_CAPACITY_MAX:
        found.append(f"capacity: at least 1 and at most {LOCAL_CAPACITY_MAX}")
    if config.get("backend", "process") not in LOCAL_BACKENDS:
        found.append(f"backend: one of {', '.join(LOCAL_BACKENDS)}")
    return found


def _proxmox_change_errors(config: dict, stored: Any) -> list[str]:
    """A PATCH's config for a proxmox provider: its settings, checked as a setup's would be.
    The connection is kept; a key of it may be repeated (a GET's config sent back) but not
    changed, and a secret is never taken."""
    stored = stored if isinstance(stored, dict) else {}
    found = []
    changed = sorted(
        key
        for key in set(config) & set(PROXMOX_CONNECTION)
        if key in SECRET_KEYS or config[key] != stored.get(key)
    )
    if changed:
        found.append(
            f"the connection is kept as it was made, not changed: {', '.join(changed)} "
            "(a new connection: a new provider from a setup)"
        )
    settings = {k: v for k, v in config.items() if k not in PROXMOX_CONNECTION}
    return found + _proxmox_errors(settings, with_setup=True)


def proxmox_settings_changed(stored: Mapping[str, Any], config: Mapping[str, Any]) -> dict:
    """The config a proxmox provider keeps after a change of its settings: the connection it
    had, and the settings as given (a PATCH's config replaces the settings as a whole)."""
    kept = {k: v for k, v in stored.items() if k in PROXMOX_CONNECTION}
    return kept | {k: v for k, v in config.items() if k not in PROXMOX_CONNECTION}


def _proxmox_errors(config: dict, *, with_setup: bool) -> list[str]:
    fields = ProxmoxConfig.__dataclass_fields__
    allowed = (set(fields) - set(PROXMOX_FIXED)) | set(() if with_setup else PROXMOX_BY_HAND)
    found = []
    unknown = sorted(set(config) - allowed)
    if unknown:
        why = " (a token comes from a setup, or from a token_file)" if set(unknown) & set(
            SECRET_KEYS) else ""  # fmt: skip
        found.append(f"not settable here: {', '.join(unknown)}{why}")
    if not with_setup and not (config.get("endpoint") and config.get("token_file")):
        found.append("without a setup: endpoint and token_file (a token made by hand)")
    if "endpoint" in config and not str(config["endpoint"]).startswith("https://"):
        found.append("endpoint: https://HOST:PORT (TLS is never off)")
    template = config.get("template")
    if (
        isinstance(template, bool)
        or not isinstance(template, int)
        or not (100 <= template <= VMID_MAX)
    ):
        found.append(f"template: the template's VM id, 100 to {VMID_MAX}")
    for name, value in config.items():
        if name in fields and name != "template" and not _same_kind(fields[name].default, value):
            found.append(f"{name}: {_kind_name(fields[name].default)}")
        elif name in PROXMOX_BY_HAND and not isinstance(value, str):
            found.append(f"{name}: a string")
    return found


def _same_kind(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, tuple):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def _kind_name(default: Any) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, tuple):
        return "a list of strings"
    return {int: "a whole number", float: "a number"}.get(type(default), "a string")


def _check(values: Mapping[str, Any], instance: MachineProvider | None = None) -> None:
    errors = provider_errors(values, instance=instance)
    if errors:
        raise ValidationError(errors)


def _shown(values: Mapping[str, Any]) -> dict[str, Any]:
    """What the audit row keeps of the values: the config's keys, not its values."""
    shown = dict(values)
    if "config" in shown and isinstance(shown["config"], dict):
        shown["config"] = sorted(shown["config"])
    return shown


def create_provider(values: Mapping[str, Any], *, actor: str, now: datetime) -> MachineProvider:
    """A new provider, audited; one made from a setup (`setup`: its id) takes the setup's
    connection and deletes the setup in the same transaction (MACH-23)."""
    values = {k: v for k, v in values.items() if k in ("name", "kind", "setup", *EDITABLE)}
    _check(values)
    setup = values.pop("setup", None)
    try:
        with transaction.atomic(durable=True):
            if setup is not None:
                connection = _spend_setup(setup, name=values["name"], now=now)
                values["config"] = {**values.get("config", {}), **connection}
            provider = MachineProvider.objects.create(**values, created_at=now)
            shown = _shown(values) | ({"setup": setup} if setup is not None else {})
            audit.record(
                actor=actor, action="provider.create", target=provider, detail=shown, at=now
            )
    except IntegrityError:  # another create of the same name won between check and insert
        taken = f"a provider named {values['name']} exists already"
        raise ValidationError({"name": [taken]}) from None
    return provider


def _spend_setup(pk: int, *, name: str, now: datetime) -> dict[str, str]:
    """The setup's connection, and the setup deleted; locked, so two saves cannot both
    spend it (the loser's transaction is rolled back with its provider)."""
    setup = (
        provider_setups.live_setups(now)
        .select_for_update()
        .filter(pk=pk, name=name, enrolled_at__isnull=False)
        .first()
    )
    if setup is None:
        raise ValidationError({"setup": [f"setup {pk} expired or was used meanwhile"]})
    connection = provider_setups.connection_config(setup)
    setup.delete()
    return connection


def update_provider(
    provider: MachineProvider, changes: Mapping[str, Any], *, actor: str, now: datetime
) -> MachineProvider:
    _check(changes, provider)
    changes = {k: v for k, v in changes.items() if k in EDITABLE}
    if not changes:
        return provider
    if provider.kind == "proxmox" and "config" in changes:
        changes["config"] = proxmox_settings_changed(provider.config, changes["config"])
    before = {field: getattr(provider, field) for field in changes}
    with transaction.atomic(durable=True):
        MachineProvider.objects.filter(pk=provider.pk).update(**changes)
        audit.record(
            actor=actor,
            action="provider.update",
            target=provider,
            detail={"before": _shown(before), "after": _shown(changes)},
            at=now,
        )
    provider.refresh_from_db()
    return provider


def delete_provider(provider: MachineProvider, *, actor: str, now: datetime) -> None:
    with transaction.atomic(durable=True):
        left = (
            Machine.objects.filter(provider=provider.name)
            .exclude(state=MachineState.DELETED)
            .count()
        )
        if left:
            raise ProviderInUse(
                f"provider {provider.name} has {left} machine(s) not yet deleted: disable it, "
                "and drain, retire or release them first"
            )
        pk, name = provider.pk, provider.name
        MachineProvider.objects.filter(pk=pk).delete()
        audit.record(
            actor=actor,
            action="provider.delete",
            target=MachineProvider(pk=pk),
            detail={"name": name},
            at=now,
        )


# -- the machine loop's record of outages ---------------------------------------------------


def record_outage(provider: MachineProvider, *, error: str, now: datetime, actor: str) -> bool:
    """The provider could not be reached this round. `down_since` keeps the outage's start;
    `last_error` the latest reason. True (and an audit row) only when it was up before."""
    with transaction.atomic():
        began = MachineProvider.objects.filter(pk=provider.pk, down_since__isnull=True).update(
            down_since=now, last_error=error
        )
        if began:
            audit.record(
                actor=actor, action="provider.down", target=provider, detail={"error": error},
                at=now,
            )  # fmt: skip
        else:
            MachineProvider.objects.filter(pk=provider.pk).update(last_error=error)
    return bool(began)


def clear_outage(provider: MachineProvider, *, now: datetime, actor: str) -> bool:
    """The provider answered again: the outage is over. True only when one was recorded."""
    with transaction.atomic():
        row = (
            MachineProvider.objects.filter(pk=provider.pk, down_since__isnull=False)
            .values("down_since", "last_error")
            .first()
        )
        if row is None:
            return False
        ended = MachineProvider.objects.filter(pk=provider.pk, down_since=row["down_since"]).update(
            down_since=None, last_error=""
        )
        if ended:
            audit.record(
                actor=actor,
                action="provider.up",
                target=provider,
                detail={"down_since": row["down_since"].isoformat(), "error": row["last_error"]},
                at=now,
            )
    return bool(ended)
