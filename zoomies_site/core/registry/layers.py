"""The four layers (CONF-02) and the per-process cache of their result.

defaults < zoomies.yaml < the database (SettingValue rows) < ZOOMIES_* environment
"""

from __future__ import annotations

import difflib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from zoomies_site.core import environment, sealing
from zoomies_site.core.findings import Finding, error, warning
from zoomies_site.core.registry.entries import (
    _OWN_ENV_NAMES,
    DERIVED,
    ENTRIES,
    KEYS,
    SETTINGS,
    entry,
)
from zoomies_site.core.registry.types import (
    CACHE_SECONDS,
    DERIVED_SOURCE,
    LIST,
    Setting,
    UnknownSetting,
)

# --- layering ------------------------------------------------------------------------------


class Values(Mapping[str, Any]):
    """One complete set of typed values, where each came from, and what layering found."""

    def __init__(
        self, values: dict[str, Any], sources: dict[str, str], problems: Iterable[Finding] = ()
    ):
        self._values = values
        self._sources = sources
        self.problems: tuple[Finding, ...] = tuple(problems)

    def __getitem__(self, key: str) -> Any:
        if key in self._values:
            value = self._values[key]
            # A copy, so a caller appending to a list cannot change the cached values.
            return list(value) if isinstance(value, list) else value
        derived = DERIVED.get(key)
        if derived is not None:
            return derived.compute(self)
        raise UnknownSetting(key)

    def __iter__(self) -> Iterator[str]:
        return iter(KEYS)

    def __len__(self) -> int:
        return len(KEYS)

    def source(self, key: str) -> str:
        if key in DERIVED:
            return DERIVED_SOURCE
        try:
            return self._sources[key]
        except KeyError:
            raise UnknownSetting(key) from None

    def overlay(self, raw: Mapping[str, Any], *, source: str, where: str) -> Values:
        """A copy with `raw` layered on top; what does not parse becomes a finding."""
        values, sources, problems = dict(self._values), dict(self._sources), list(self.problems)
        _apply(values, sources, problems, raw, source=source, where=lambda _key: where)
        return Values(values, sources, problems)


def _defaults() -> Values:
    values = {key: setting.default for key, setting in SETTINGS.items()}
    return Values(values, dict.fromkeys(values, "default"))


def _apply(
    values: dict[str, Any],
    sources: dict[str, str],
    problems: list[Finding],
    raw: Mapping[str, Any],
    *,
    source: str,
    where: Callable[[str], str],
) -> None:
    for key, raw_value in raw.items():
        setting = SETTINGS.get(key)
        if setting is None:
            problems.append(_unknown_key(key, where(key)))
            continue
        try:
            value = setting.parse(raw_value)
        except ValueError as exc:
            problems.append(
                _invalid_value(setting, where(key), str(exc), values[key], sources[key])
            )
            continue
        values[key] = value
        sources[key] = source


def _unknown_key(key: str, where: str) -> Finding:
    derived = DERIVED.get(key)
    if derived is not None:
        return warning(
            f"config.derived_key:{key}",
            f"{key} in {where} cannot be set",
            f"{key} is worked out from {', '.join(derived.from_keys)}, so this value is ignored.",
            f"Remove {key} and change {', '.join(derived.from_keys)} instead.",
        )
    near = difflib.get_close_matches(key, KEYS, n=1)
    hint = f", or correct it to {near[0]}" if near else ""
    return warning(
        f"config.unknown_key:{key}",
        f"Unknown setting {key} in {where}",
        "Zoomies ignores it, so whatever it was meant to change has not changed.",
        f"Remove {key}{hint}.",
    )


def _invalid_value(
    setting: Setting, where: str, message: str, kept: Any, kept_from: str
) -> Finding:
    return error(
        f"config.invalid_value:{setting.key}",
        f"{setting.key} in {where} is not valid",
        f"{message[:1].upper()}{message[1:]}; {setting.key} stays at {setting.display(kept)!r} "
        f"from the {kept_from} layer, and the controller will not start with an error.",
        f"Set {setting.key} in {where} to {setting.expects()}, or remove it.",
    )


def _file_layer(text: str, where: str) -> tuple[dict[str, Any], list[Finding]]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return {}, [
            error(
                "config.file_unreadable",
                f"{where} is not valid YAML",
                f"None of its settings can be read ({exc}).",
                f"Correct the YAML in {where}.",
            )
        ]
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        return {}, [
            error(
                "config.file_unreadable",
                f"{where} is not a mapping of settings",
                "Its top level must map setting names to values, so none of it can be read.",
                f"Write {where} as nested mappings or dotted keys, such as "
                "scheduler.provision_timeout: 20m.",
            )
        ]
    flat: dict[str, Any] = {}
    problems: list[Finding] = []
    _flatten(data, "", flat, problems, where)
    return flat, problems


def _flatten(
    data: dict[Any, Any], prefix: str, out: dict[str, Any], problems: list[Finding], where: str
) -> None:
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, dict) and key not in SETTINGS:
            _flatten(value, key, out, problems, where)
            continue
        if key in out:
            problems.append(
                warning(
                    f"config.duplicate_key:{key}",
                    f"{key} is set twice in {where}",
                    "Only the later of the two is used, which may not be the one meant.",
                    f"Keep one {key} in {where}.",
                )
            )
        out[key] = value


def _read_file_layer() -> tuple[dict[str, Any], list[Finding]]:
    from django.conf import settings as django_settings  # noqa: PLC0415  # Django is read when a layer is, not at import

    path = getattr(django_settings, "ZOOMIES_CONFIG_FILE", "") or ""
    if not path:
        return {}, []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}, []  # a missing zoomies.yaml means no file layer, not a problem
    except OSError as exc:
        return {}, [
            error(
                "config.file_unreadable",
                f"{path} cannot be read",
                f"None of its settings are in force ({exc.strerror or exc}).",
                f"Make {path} readable by the controller's user, or remove it.",
            )
        ]
    return _file_layer(text, str(path))


def _read_rows(fetch: Callable[[], list[Any]]) -> list[Any]:
    """Run one read; inside a caller's transaction, in a savepoint so a failure cannot poison it.

    Outside one it must not open a transaction: on SQLite ours BEGIN IMMEDIATE, which would
    take the write lock for a read.
    """
    from django.db import connection, transaction  # noqa: PLC0415  # Django is read when a layer is, not at import

    if connection.in_atomic_block:
        with transaction.atomic():
            return fetch()
    return fetch()


def _read_database_layer() -> tuple[dict[str, Any], list[Finding]]:
    from django.db import DatabaseError  # noqa: PLC0415  # Django is read when a layer is, not at import

    # As with Django above: loaded when a layer is read, so the registry imports without Django.
    from zoomies_site.core.models import SettingValue  # noqa: PLC0415

    try:
        rows = _read_rows(lambda: list(SettingValue.objects.values_list("key", "value")))
    except DatabaseError as exc:
        # Before the first migrate there is no table; the other layers still stand.
        return {}, [
            warning(
                "config.database_unreadable",
                "Settings saved in the database could not be read",
                f"Only the defaults, zoomies.yaml and the environment are in force ({exc}).",
                "Run manage.py migrate, and check the database is reachable.",
            )
        ]
    return dict(rows), []


# --- secrets at rest (AUTH-07) --------------------------------------------------------------

# A secret's SettingValue row is {"sealed": "v1:..."}: its stored JSON, sealed (core.sealing).
SEALED = "sealed"


def is_sealed(stored: Any) -> bool:
    """Whether a SettingValue row's value is a sealed one."""
    return isinstance(stored, dict) and list(stored) == [SEALED] and isinstance(stored[SEALED], str)


def to_stored(setting: Setting, value: Any) -> Any:
    """What a SettingValue row holds for a typed value: its JSON, sealed if it is a secret.

    SealError when no usable sealing key can be loaded.
    """
    plain = setting.to_json(value)
    if not setting.secret:
        return plain
    return {SEALED: sealing.seal(json.dumps(plain))}


def from_stored(stored: Any) -> Any:
    """The JSON a row holds, unsealed if it was sealed; SealError when it cannot be."""
    if not is_sealed(stored):
        return stored
    text = sealing.unseal_text(stored[SEALED])
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise sealing.SealError("the unsealed value is not JSON") from None


def key_source() -> str:
    """Where the sealing key comes from, or why none can be loaded; never raises."""
    try:
        return sealing.key_source()
    except sealing.SealError as exc:
        return f"nowhere usable ({exc})"


def _unseal_layer(
    raw: Mapping[str, Any], values: dict[str, Any], sources: dict[str, str], problems: list[Finding]
) -> dict[str, Any]:
    """The database layer with its sealed values opened; what cannot be opened is a finding.

    A row that does not unseal (another key, altered) is left out, so the layer below it stays
    in force, and it is an error naming where the key in use came from.
    """
    out: dict[str, Any] = {}
    for key, stored in raw.items():
        setting = SETTINGS.get(key)
        if setting is None:
            out[key] = stored  # reported as an unknown key; nothing to open
            continue
        if not is_sealed(stored):
            if setting.secret:
                problems.append(
                    warning(
                        f"config.secret_not_sealed:{key}",
                        f"{key} is saved in the database unsealed",
                        "Anyone who can read the database or a backup of it can read the secret.",
                        f"Store it again with manage.py set_secret {key} --stdin, which seals it.",
                    )
                )
            out[key] = stored
            continue
        try:
            out[key] = from_stored(stored)
        except sealing.SealError as exc:
            source = key_source()
            reason = str(exc)
            if source not in reason:
                reason += f" (the key in use is from {source})"
            problems.append(
                error(
                    f"config.secret_unreadable:{key}",
                    f"{key} saved in the database cannot be unsealed",
                    f"{reason[:1].upper()}{reason[1:]}; {key} stays at "
                    f"{setting.display(values[key])!r} from the {sources[key]} layer, and the "
                    "controller will not start with an error.",
                    f"Set {sealing.KEY_ENV} or {sealing.KEY_FILE_ENV} to the key {key} was "
                    f"sealed with, or store it again with manage.py set_secret {key}.",
                )
            )
    return out


def _env_layer(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str], list[Finding]]:
    raw: dict[str, Any] = {}
    where: dict[str, str] = {}
    problems: list[Finding] = []
    for key, setting in SETTINGS.items():
        # A secret also reads <VAR>_FILE, unless that name is another entry's own variable.
        file_var = f"{setting.env}_FILE"
        with_file = setting.secret and file_var not in _OWN_ENV_NAMES
        try:
            found = environment.lookup(setting.env, env, file=with_file)
        except OSError as exc:
            problems.append(
                error(
                    f"config.secret_file_unreadable:{key}",
                    f"{file_var} names a file that cannot be read",
                    f"{key} stays at its lower layer's value ({exc.strerror or exc}).",
                    f"Point {file_var} at a file the controller's user can read.",
                )
            )
            continue
        if not found:
            continue
        if found.source == setting.env:
            raw[key] = found.text
        elif setting.type == LIST:
            raw[key] = [line.strip() for line in found.text.splitlines() if line.strip()]
        else:
            raw[key] = found.text.strip()
        where[key] = found.source
    return raw, where, problems


def layered(
    defaults_only: bool = False,
    env: Mapping[str, str] | None = None,
    yaml_text: str | None = None,
    db_values: Mapping[str, Any] | None = None,
) -> Values:
    """Build the values from the four layers (CONF-02); each argument left None is read live.

    `yaml_text` stands in for the zoomies.yaml file, `db_values` for the SettingValue rows
    (key to stored JSON, a secret's sealed as `to_stored` writes it) and `env` for os.environ.
    `defaults_only` ignores all three.
    """
    base = _defaults()
    if defaults_only:
        return base
    values, sources, problems = dict(base._values), dict(base._sources), []

    if yaml_text is None:
        file_raw, found = _read_file_layer()
    else:
        file_raw, found = _file_layer(yaml_text, "zoomies.yaml")
    problems += found
    from_file = "zoomies.yaml"
    _apply(values, sources, problems, file_raw, source="file", where=lambda _key: from_file)

    if db_values is None:
        db_raw, found = _read_database_layer()
        problems += found
    else:
        db_raw = dict(db_values)
    db_raw = _unseal_layer(db_raw, values, sources, problems)
    _apply(values, sources, problems, db_raw, source="database", where=lambda _key: "the database")

    env_raw, env_where, found = _env_layer(os.environ if env is None else env)
    problems += found
    _apply(values, sources, problems, env_raw, source="env", where=env_where.__getitem__)
    return Values(values, sources, problems)


# --- the per-process cache -----------------------------------------------------------------

_lock = threading.Lock()
_cached: tuple[float, Values] | None = None
_generation = 0


def current() -> Values:
    """The live layered values, rebuilt at most every CACHE_SECONDS or after `reload()`."""
    global _cached
    cached = _cached
    if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
        return cached[1]
    with _lock:
        cached = _cached
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
        generation = _generation
        fresh = layered()
        # A reload() while this was being read means it may predate a change: use, don't keep.
        if generation == _generation:
            _cached = (time.monotonic(), fresh)
        return fresh


def reload() -> None:
    """Drop this process's cached values; the next read layers them again."""
    global _cached, _generation
    _generation += 1
    _cached = None


def get(key: str) -> Any:
    """The typed, layered value of one setting (derived entries included)."""
    entry(key)
    return current()[key]


def get_all() -> dict[str, Any]:
    values = current()
    return {key: values[key] for key in KEYS}


def describe(values: Values | None = None) -> list[dict[str, Any]]:
    """Every entry as the Settings page shows it, in registry order, secrets masked.

    Values and defaults are JSON-friendly (durations as `20m`). `source` is one of SOURCES,
    or "derived" for an entry worked out from others, which is not `editable`.
    """
    values = current() if values is None else values
    defaults = _defaults()
    rows = []
    for key in KEYS:
        item = ENTRIES[key]
        rows.append(
            {
                "key": key,
                "value": item.display(values[key]),
                "default": item.display(defaults[key]),
                "source": values.source(key),
                "help": item.help,
                "type": item.type,
                "secret": item.secret,
                "env": item.env,
                "range": item.range_text(),
                "choices": list(item.choices),
                "editable": not item.derived,
            }
        )
    return rows
