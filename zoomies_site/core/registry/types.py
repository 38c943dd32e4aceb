"""What a setting is: its types, durations, parsing, validators and the two entry kinds.

A `Setting` has a type, a default, a range or validator and one sentence of help; a `Derived`
value is worked out from other settings and cannot be set. Nothing here reads a layer.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from zoomies_site.core.findings import Finding

BOOL = "bool"
INT = "int"
FLOAT = "float"
STR = "str"
DURATION = "duration"
LIST = "list[str]"
CHOICE = "choice"
TYPES = (BOOL, INT, FLOAT, STR, DURATION, LIST, CHOICE)

# Where a value came from. A derived entry is worked out from others and reports "derived".
SOURCES = ("default", "file", "database", "env")
DERIVED_SOURCE = "derived"

ENV_PREFIX = "ZOOMIES_"
CACHE_SECONDS = 5.0
MASK = "********"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class UnknownSetting(KeyError):
    """A key the registry has no entry for."""


class ConfigError(Exception):
    """The configuration has at least one error finding, so the controller must not start."""

    def __init__(self, findings: Iterable[Finding]):
        self.findings = list(findings)
        count = len(self.findings)
        lines = [f"Zoomies will not start: {count} configuration error{'s' * (count != 1)}."]
        lines += [f"- {f.title}: {f.why} Fix: {f.fix} [{f.key}]" for f in self.findings]
        super().__init__("\n".join(lines))


def env_name(key: str) -> str:
    """`scheduler.provision_timeout` -> `ZOOMIES_SCHEDULER_PROVISION_TIMEOUT`."""
    return ENV_PREFIX + key.upper().replace(".", "_")


# --- durations -----------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> timedelta:
    """`90s`, `20m`, `1h`, `1h30m`, `500ms` or a bare number of seconds."""
    compact = text.strip().lower().replace(" ", "")
    if _NUMBER.fullmatch(compact):
        return timedelta(seconds=float(compact))
    total = 0.0
    pos = 0
    for match in _DURATION_PART.finditer(compact):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(compact):
        raise ValueError(
            f"{text!r} is not a duration; write it like 90s, 20m, 1h or 1h30m, "
            "or as a number of seconds"
        )
    return timedelta(seconds=total)


def format_duration(value: timedelta) -> str:
    """The inverse of `parse_duration`: `timedelta(minutes=90)` -> `1h30m`."""
    total_ms = round(value / timedelta(milliseconds=1))
    if total_ms == 0:
        return "0s"
    sign = "-" if total_ms < 0 else ""
    hours, rest = divmod(abs(total_ms), 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    if not hours and not minutes and not seconds:
        return f"{sign}{millis}ms"
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    if millis:
        text += f"{seconds}.{millis:03d}".rstrip("0") + "s"
    elif seconds:
        text += f"{seconds}s"
    return sign + text


def _d(text: str) -> timedelta:
    return parse_duration(text)


# --- entries -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One operator setting: its type, default, range or validator, and one sentence of help."""

    key: str
    type: str
    default: Any
    help: str
    min: Any = None
    max: Any = None
    choices: tuple[str, ...] = ()
    # Returns a sentence saying what is wrong with an already-typed value, or None.
    validator: Callable[[Any], str | None] | None = None
    secret: bool = False
    env: str = ""

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"{self.key}: unknown setting type {self.type!r}")
        if not self.env:
            object.__setattr__(self, "env", env_name(self.key))

    @property
    def derived(self) -> bool:
        return False

    def parse(self, raw: Any) -> Any:
        """The typed value for `raw` from any layer, or ValueError saying what is wrong.

        A secret's message never quotes the value, since findings and errors are shown.
        """
        try:
            value = _coerce(self, raw)
        except ValueError:
            if not self.secret:
                raise
            raise ValueError(f"the value is not {self.expects()}") from None
        problem = self.problem(value)
        if problem:
            raise ValueError(problem)
        return value

    def problem(self, value: Any) -> str | None:
        """What is wrong with a typed value (its range, choices or validator), or None."""
        shown = self.render(value)
        if self.min is not None and value < self.min:
            return f"{shown} is below the minimum of {self.render(self.min)}"
        if self.max is not None and value > self.max:
            return f"{shown} is above the maximum of {self.render(self.max)}"
        if self.choices and value not in self.choices:
            return f"{value!r} is not one of {', '.join(self.choices)}"
        if self.validator is not None:
            return self.validator(value)
        return None

    def expects(self) -> str:
        """What a valid value looks like, for a finding's fix."""
        noun = {
            BOOL: "true or false",
            INT: "a whole number",
            FLOAT: "a number",
            STR: "a string",
            DURATION: "a duration such as 90s, 20m or 1h30m",
            LIST: "a list of strings",
            CHOICE: "one of " + ", ".join(self.choices),
        }[self.type]
        return f"{noun} {self.range_text()}".strip()

    def range_text(self) -> str:
        if self.min is not None and self.max is not None:
            return f"from {self.render(self.min)} to {self.render(self.max)}"
        if self.min is not None:
            return f"of at least {self.render(self.min)}"
        if self.max is not None:
            return f"of at most {self.render(self.max)}"
        return ""

    def render(self, value: Any) -> Any:
        """A JSON-friendly form of a typed value: durations as `20m`, lists as lists."""
        if isinstance(value, timedelta):
            return format_duration(value)
        if isinstance(value, tuple | list):
            return list(value)
        return value

    def display(self, value: Any) -> Any:
        """`render`, with a secret masked."""
        if not self.secret:
            return self.render(value)
        if isinstance(value, list | tuple):
            return [MASK] * len(value)
        return MASK if value else ""

    def to_json(self, value: Any) -> Any:
        """How a typed value is stored in a SettingValue row; `parse` reads it back."""
        return self.render(value)


@dataclass(frozen=True)
class Derived:
    """A value worked out from other settings; it is read like one and cannot be set."""

    key: str
    type: str
    help: str
    compute: Callable[[Mapping[str, Any]], Any]
    from_keys: tuple[str, ...]

    secret = False
    env = ""
    choices: tuple[str, ...] = ()

    @property
    def derived(self) -> bool:
        return True

    def render(self, value: Any) -> Any:
        return format_duration(value) if isinstance(value, timedelta) else value

    display = render

    def range_text(self) -> str:
        return ""


def _coerce(setting: Setting, raw: Any) -> Any:
    kind = setting.type
    if kind == BOOL:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, int) and raw in (0, 1):
            return bool(raw)
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise ValueError(f"{raw!r} is not true or false")
    if kind == INT:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str):
            try:
                return int(raw.strip())
            except ValueError:
                pass
        raise ValueError(f"{raw!r} is not a whole number")
    if kind == FLOAT:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, str) and _NUMBER.fullmatch(raw.strip()):
            return float(raw.strip())
        raise ValueError(f"{raw!r} is not a number")
    if kind in (STR, CHOICE):
        if isinstance(raw, str):
            return raw.strip() if kind == CHOICE else raw
        if kind == CHOICE and isinstance(raw, bool):
            # YAML reads a bare on/off/yes/no as a boolean.
            raise ValueError(f"{raw!r} is not one of {', '.join(setting.choices)} (quote it)")
        if kind == STR and isinstance(raw, int | float) and not isinstance(raw, bool):
            return str(raw)
        raise ValueError(f"{raw!r} is not a string")
    if kind == DURATION:
        if isinstance(raw, timedelta):
            return raw
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return timedelta(seconds=raw)
        if isinstance(raw, str):
            return parse_duration(raw)
        raise ValueError(f"{raw!r} is not a duration; write it like 90s, 20m, 1h or 1h30m")
    if kind == LIST:
        if isinstance(raw, str):
            raw = _split_list(raw)
        if isinstance(raw, list | tuple):
            items = []
            for item in raw:
                if isinstance(item, bool) or not isinstance(item, str | int | float):
                    raise ValueError(f"{item!r} in the list is not a string")
                items.append(str(item))
            return items
        raise ValueError(f"{raw!r} is not a list of strings")
    raise AssertionError(kind)  # pragma: no cover - __post_init__ refuses unknown types


def _split_list(text: str) -> list[Any]:
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            parsed = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{text!r} is not a valid JSON list: {exc.msg}") from None
        if not isinstance(parsed, list):
            raise ValueError(f"{text!r} is not a list")
        return parsed
    return [part.strip() for part in text.split(",") if part.strip()]


# --- validators ----------------------------------------------------------------------------


def split_bind(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not host:port with a port from 1 to 65535")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host, int(port)


def _valid_bind(value: str) -> str | None:
    try:
        split_bind(value)
    except ValueError as exc:
        return str(exc)
    return None


def is_loopback(host: str) -> bool:
    """Whether a bind or URL host only ever answers this machine (an empty host is every one)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _valid_url(value: str) -> str | None:
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return f"{value!r} is not an http(s) URL"
    return None


# CAP-02: a capacity signing secret must be long and varied. `openssl rand -hex 32` (64
# characters, about 250 bits by this estimate) clears it; a password or a repeated word does not.
MIN_SECRET_LENGTH = 32
MIN_SECRET_BITS = 128
MIN_SECRET_DISTINCT = 12


def secret_weakness(secret: str) -> str | None:
    """Why a signing secret is too weak, or None; an empty one is "unset". Never quotes it."""
    if not secret:
        return None
    if len(secret) < MIN_SECRET_LENGTH:
        return f"the secret is shorter than {MIN_SECRET_LENGTH} characters"
    if len(set(secret)) < MIN_SECRET_DISTINCT:
        return f"the secret uses fewer than {MIN_SECRET_DISTINCT} distinct characters"
    for unit in range(1, len(secret) // 2 + 1):
        if len(secret) % unit == 0 and secret[:unit] * (len(secret) // unit) == secret:
            return "the secret is one short piece repeated"
    counts = [secret.count(c) for c in set(secret)]
    bits = -sum(n * math.log2(n / len(secret)) for n in counts)
    if bits < MIN_SECRET_BITS:
        return f"the secret carries fewer than about {MIN_SECRET_BITS} bits of entropy"
    return None


def _no_empty_items(value: list[str]) -> str | None:
    if any(not item.strip() for item in value):
        return "the list has an empty item"
    return None


# A runner's environment variable name (runners.env, a pool's env): what a POSIX shell takes.
ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The runner's credential is the controller's to set, never the operator's.
RUNNER_CREDENTIAL_ENV = "ACTIONS_RUNNER_INPUT_JITCONFIG"


def env_var_problem(name: object) -> str | None:
    """What is wrong with `name` as a runner's environment variable name, or None."""
    if not isinstance(name, str) or not ENV_VAR_NAME.fullmatch(name):
        return f"{str(name)[:40]!r} is not an environment variable name (letters, digits, _)"
    if name == RUNNER_CREDENTIAL_ENV:
        return f"{name} is the runner's credential, which the controller sets"
    return None


def _runner_env_items(value: list[str]) -> str | None:
    """runners.env: KEY=VALUE items; ZOOMIES_DOCKER_WAIT has its own setting."""
    for item in value:
        name, sep, _ = item.partition("=")
        if not sep:
            return f"{item[:40]!r} is not KEY=VALUE"
        problem = env_var_problem(name)
        if problem is None and name == "ZOOMIES_DOCKER_WAIT":
            problem = "ZOOMIES_DOCKER_WAIT is set by runners.docker_wait (or a pool's env)"
        if problem is not None:
            return problem
    return None


def _whole_seconds(value: timedelta) -> str | None:
    if value.total_seconds() != int(value.total_seconds()):
        return f"{format_duration(value)} is not a whole number of seconds"
    return None


def _off_or_a_minute(value: timedelta) -> str | None:
    # An interval of seconds would ask GitHub every few seconds; 0 turns the loop off.
    if timedelta(0) < value < timedelta(minutes=1):
        return f"{format_duration(value)} is under a minute; use 0s to turn it off"
    return None


def _pem_private_key(value: str) -> str | None:
    # Only the armour is looked at, and nothing of the value is echoed: it is a secret.
    if value and not re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", value):
        return "it is not a PEM private key (it starts with -----BEGIN RSA PRIVATE KEY-----)"
    return None


def _whole_seconds(value: timedelta) -> str | None:
    if value.total_seconds() != int(value.total_seconds()):
        return f"{format_duration(value)} is not a whole number of seconds"
    return None


def _dur(
    key: str, default: str, help: str, *, lo: str | None = "0s", hi: str | None = None, **kw: Any
) -> Setting:
    return Setting(
        key,
        DURATION,
        _d(default),
        help,
        min=_d(lo) if lo is not None else None,
        max=_d(hi) if hi is not None else None,
        **kw,
    )


def _half(key: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda values: values[key] / 2
