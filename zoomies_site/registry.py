"""The operator settings registry (CONF-01..07, STYLE point 11).

Every operator-facing tunable is a typed entry here with a default, a range or validator and
one sentence of help that the Settings page shows. Values come from four layers, a later one
overriding an earlier one (CONF-02):

    defaults < zoomies.yaml < the database (SettingValue rows) < ZOOMIES_* environment

`zoomies.yaml` (``settings.ZOOMIES_CONFIG_FILE``) may nest (``scheduler: {provision_timeout:
30m}``) or use dotted keys (``scheduler.provision_timeout: 30m``); a missing file is fine, an
unknown key is a warning. Each entry's variable is ``ZOOMIES_`` plus its key upper-cased with
dots as underscores; an empty variable counts as unset. A secret entry also reads
``<VAR>_FILE`` (a list secret takes one item per line there), unless that name is another
entry's own variable. A list in a variable is comma separated, or a JSON array when an item
needs a comma.

A secret entry's database value is sealed (AUTH-07): its row holds ``{"sealed": "v1:..."}``,
the JSON sealed with AES-256-GCM by `accounts.sealing`, and is opened when the layer is read.
A row that cannot be opened (another key, altered) is an error finding, not a crash.

A value that does not parse or is out of range never crashes anything: the layer below it stays
in force and validation reports an error finding, which stops startup (CONF-04).

Durations are ``timedelta``; they accept ``90s``, ``20m``, ``1h``, ``1h30m``, ``500ms`` or a
number of seconds. `describe()` renders them back in that form (``20m``).

The layered values are cached per process for `CACHE_SECONDS`, so `get()` costs no query;
`reload()` drops the cache (`actions.set_setting` calls it on commit). The database layer is
one SELECT, and it is a synchronous ORM call: from async code use ``sync_to_async(get)``.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from accounts import sealing
from zoomies_site.findings import Finding, error, errors, warning

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


def _split_bind(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not host:port with a port from 1 to 65535")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host, int(port)


def _valid_bind(value: str) -> str | None:
    try:
        _split_bind(value)
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


def _no_empty_items(value: list[str]) -> str | None:
    if any(not item.strip() for item in value):
        return "the list has an empty item"
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


MIB = 1024 * 1024

# Spec references are to /work/shared/spec/architecture.txt ("Reconciliation invariants" unless
# said otherwise) and CHECKLIST.md. A constant another constant depends on says so beside it;
# validate() holds the relationships and tests/zoomies_site pins them at the defaults.
# fmt: off
_ENTRIES: tuple[Setting | Derived, ...] = (
    # Security posture: loopback bind, authentication on (SEC-01, SEC-02).
    Setting("server.bind", STR, "127.0.0.1:8080",
            "The address and port the controller listens on, loopback only by default.",
            validator=_valid_bind),
    Setting("server.tls_cert", STR, "",
            "Path to the TLS certificate the controller serves, empty for plain HTTP."),
    Setting("server.tls_key", STR, "",
            "Path to the private key for server.tls_cert, empty for plain HTTP."),
    Setting("auth.enabled", BOOL, True,
            "Whether the UI and API require a signed-in user or an API token."),
    # GitHub: App credentials, webhooks and the fallback poller ("When webhooks cannot reach you").
    Setting("github.api_url", STR, "https://api.github.com",
            "The GitHub REST API base URL, which differs only for GitHub Enterprise Server.",
            validator=_valid_url),
    Setting("github.app_id", INT, 0,
            "The GitHub App's numeric id, where 0 means no App is configured.", min=0),
    Setting("github.private_key_file", STR, "",
            "Path to the GitHub App's PEM private key, empty when no App is configured."),
    # AUTH-07: sealed in its SettingValue row; preferred to github.private_key_file when set
    # in the same layer or a later one. ZOOMIES_GITHUB_PRIVATE_KEY_FILE is not read as its
    # <VAR>_FILE: that is github.private_key_file's own variable, a path re-read when it changes.
    Setting("github.private_key", STR, "",
            "The GitHub App's PEM private key itself, stored sealed, preferred to the key file.",
            validator=_pem_private_key, secret=True),
    Setting("github.webhook_secrets", LIST, [],
            "The secrets a workflow_job webhook's HMAC signature may be made with.",
            validator=_no_empty_items, secret=True),
    Setting("github.poll_fallback", BOOL, True,
            "Whether a poller lists queued jobs on an interval in case webhooks do not arrive."),
    _dur("github.poll_interval", "60s",
         "How often the fallback poller lists each installation's queued jobs.", lo="5s"),
    # "Registrations are compared with rows a minute after start and every ten minutes after".
    _dur("github.reap_first_after", "1m",
         "How long after start the first orphaned-registration reap runs."),
    _dur("github.reap_interval", "10m",
         "How often registrations at GitHub are compared with the runner rows.", lo="1m"),
    # A rate-limited answer that names no reset waits this long, capped at GitHub's hour window.
    _dur("github.rate_limit_fallback", "15m",
         "How long an installation stands down after a rate limit that gave no reset time.",
         lo="1s", hi="1h"),
    _dur("github.rate_limit_cap", "1h",
         "The longest an installation stands down for a rate limit, whatever GitHub said.",
         lo="1m", hi="1h"),
    # GitHub caps webhook payloads at 25 MB; a larger body is not a real delivery.
    Setting("github.webhook_max_body", INT, 25 * MIB,
            "The largest webhook request body in bytes the controller will read.",
            min=64 * 1024, max=100 * MIB),
    # Scheduler ("A runner that has not come online in time is failed", SCHED-17..22).
    # provision_timeout > agent.create_timeout + runners.docker_wait and <= tasks.create_lease.
    _dur("scheduler.provision_timeout", "20m",
         "How long a runner may take to come online, queue time included, before it is failed.",
         lo="1m"),
    _dur("scheduler.max_runner_lifetime", "0s",
         "How long an idle runner may live before it is retired, where 0s means no limit."),
    _dur("scheduler.idle_timeout", "0s",
         "How long a runner may sit idle before it is drained, where 0s means never."),
    _dur("scheduler.unlinked_exit_grace", "1m",
         "How long a runner that ended with no job heard of still stands for the job it ran.",
         lo="0s", hi="10m"),
    # max_start_backoff <= failed_retention: the wait is computed from failures still kept.
    _dur("scheduler.failed_retention", "10m",
         "How long a failed runner stays on the Runners page before it is removed.", lo="1m"),
    _dur("scheduler.start_backoff", "10s",
         "A pool's first wait before creating again after a failed runner, doubled per failure.",
         lo="1s"),
    _dur("scheduler.max_start_backoff", "5m",
         "The longest a pool waits before creating again after failed runners.", lo="1s"),
    _dur("scheduler.reconcile_interval", "5s",
         "How often the reconcile loop runs when nothing wakes it sooner.", lo="1s", hi="5m"),
    Setting("scheduler.host_throttling", BOOL, True,
            "Whether an overwhelmed host is stepped down the throttle ladder."),
    # Throttle pacing (HOST-21): step >= store.cpu_hold_window; recovery > store.host_usage_max_age;
    # stale reset > host.lost_after.
    _dur("scheduler.throttle_step", "2m",
         "The shortest time between two climbs of a host's throttle ladder.", lo="1s"),
    _dur("scheduler.throttle_recovery", "5m",
         "How long a host must stay calm before its throttle comes down one rung.", lo="1s"),
    _dur("scheduler.stale_throttle_reset", "10m",
         "How long after its samples stop a host's throttle is lifted.", lo="1s"),
    Setting("scheduler.load_per_cpu_overwhelmed", FLOAT, 2.0,
            "The load average per core at which a host counts as overwhelmed.", min=0.1),
    Setting("scheduler.load_per_cpu_calm", FLOAT, 1.0,
            "The load average per core below which a host counts as calm.", min=0.0),
    # "autoPoolInterval 1 min; scheduler.auto_pools_host_grace 10 min; scheduler.size_class_hold
    # 10 min" -- the grace is above host.lost_after (SCHED-32).
    _dur("scheduler.auto_pool_interval", "1m",
         "How often automatic pools are recomputed from the hosts.", lo="5s"),
    _dur("scheduler.auto_pools_host_grace", "10m",
         "How long a host may be silent before automatic pools are reshaped without it."),
    _dur("scheduler.size_class_hold", "10m",
         "How long a pool's size class is held before it may change again."),
    # "scheduler.default_runner_limits" (allocation row, BACK-04): unset pool fields get a share.
    Setting("scheduler.default_runner_limits", CHOICE, "host_share",
            "Whether a pool's unset CPU and memory limits become one slot's share of the host.",
            choices=("host_share", "none")),
    # "scheduler.DefaultMemoryCeilingFactor 1.5" and "scheduler.MemoryPoolSafetyShare 0.05".
    Setting("scheduler.default_memory_ceiling_factor", FLOAT, 1.5,
            "How far above its guarantee a runner's memory may be raised by default.",
            min=1.0, max=4.0),
    Setting("scheduler.memory_pool_safety_share", FLOAT, 0.05,
            "The share of a host's machine kept out of the memory lent to runners.",
            min=0.0, max=0.5),
    # Observe mode (HOST-31). Not on/off: YAML would read those as booleans.
    Setting("agent.memory_valve", CHOICE, "lend",
            "Whether the agent lends memory to runners, only records what it would lend, or not.",
            choices=("lend", "observe", "disabled")),
    # The silence ladder (HOST-02, HOST-05): interval <= heartbeat_timeout / 2 and
    # heartbeat_timeout < host.lost_after.
    _dur("agent.heartbeat_interval", "30s",
         "How often each agent is told to send a heartbeat.", lo="1s"),
    _dur("agent.heartbeat_timeout", "90s",
         "How long a host may go without a heartbeat before it counts as unhealthy.", lo="3s"),
    Derived("agent.max_quiet_heartbeat_interval", DURATION,
            "The longest heartbeat interval that one late heartbeat never counts against.",
            _half("agent.heartbeat_timeout"), ("agent.heartbeat_timeout",)),
    _dur("host.lost_after", "5m",
         "How long a host may go without a heartbeat before its runners are failed.", lo="1m"),
    _dur("housekeeping.tick", "30s",
         "How often host health and other housekeeping judgements are made.", lo="1s"),
    _dur("agent.finished_retention", "0s",
         "How long the agent keeps a finished runner's workload after its end was reported."),
    _dur("agent.bootstrap_cpu_grace", "2m",
         "How long a new runner keeps its full CPU quota before throttling applies.",
         lo="0s", hi="10m"),
    # Ten minutes: after admission (the create timeout starts then) a create covers the image
    # pull, the DinD daemon's readiness and the create itself. 10m + the 3m docker wait still
    # leaves the 20m provision timeout 7m for queueing behind the host's one admission slot,
    # and it is half the 20m create lease, so a redelivery never meets a live first attempt.
    _dur("agent.create_timeout", "10m",
         "How long the agent gives one runner create, counted from its admission.", lo="30s"),
    # The stop lease must exceed runners.drain_grace + agent.stop_margin.
    _dur("agent.stop_margin", "1m",
         "The time the agent allows beyond a stop timeout for the stop itself to finish."),
    _dur("agent.remove_timeout", "2m",
         "How long the agent gives one runner removal.", lo="1s"),
    _dur("agent.orphan_grace", "2m",
         "How long a managed workload no runner row claims is left before the agent removes it.",
         lo="0s"),
    _dur("agent.missing_grace", "1m",
         "How long a newly created runner may be absent from the backend before it counts gone."),
    _dur("agent.shutdown_grace", "30s",
         "How long a stopping agent waits for the tasks already in flight."),
    _dur("agent.long_poll_wait", "25s",
         "How long the controller holds an agent's task poll open when nothing is waiting.",
         lo="1s", hi="2m"),
    # "Runtime transport failures hold subsequent starts for five seconds, doubling to at most a
    # minute" ("Runner starts on one host").
    _dur("agent.start_hold", "5s",
         "How long the agent holds new starts after the runtime stopped answering.", lo="0s"),
    _dur("agent.max_start_hold", "1m",
         "The longest the agent holds new starts after repeated runtime failures.", lo="0s"),
    # CONF-06, BACK-11: the image's ZOOMIES_DOCKER_WAIT takes 1..3600 whole seconds.
    _dur("runners.docker_wait", "180s",
         "How long the stock runner image waits for its pool's Docker daemon before giving up.",
         lo="1s", hi="3600s", validator=_whole_seconds),
    # "A busy runner in draining is given five minutes to finish" (RUN-11): the stop timeout.
    _dur("runners.drain_grace", "5m",
         "How long a busy draining runner is given to finish its job before it is stopped."),
    # Half the provision timeout; lands after runners.docker_wait (SCHED-18, CONF-07).
    Derived("runners.not_progressing", DURATION,
            "How long a runner may be not yet online before it is reported as not progressing.",
            _half("scheduler.provision_timeout"), ("scheduler.provision_timeout",)),
    # Task leases (TASK-03/04): each outlasts the work it covers (TASK-12).
    _dur("tasks.create_lease", "20m",
         "How long a delivered create task may go unanswered before it is offered again.",
         lo="1m"),
    _dur("tasks.stop_lease", "10m",
         "How long a delivered stop task may go unanswered before it is offered again.",
         lo="1m"),
    _dur("tasks.remove_lease", "5m",
         "How long a delivered remove task may go unanswered before it is offered again.",
         lo="1m"),
    Setting("tasks.max_attempts", INT, 3,
            "How many times a task is offered to its host before the host is given up on.",
            min=1, max=10),
    # Host checks (TASK-09..11): lease above the agent's run timeout, offered once.
    _dur("tasks.host_check_lease", "90s",
         "How long a delivered host check may go unanswered before it is abandoned.", lo="1s"),
    _dur("tasks.host_check_pending_ttl", "20s",
         "How long a host check may wait for an agent to take it before it is dropped.",
         lo="1s"),
    _dur("tasks.host_check_cooldown", "15s",
         "The shortest time between two host checks for the same host."),
    _dur("agent.host_check_run_timeout", "45s",
         "How long the agent allows one host check run.", lo="1s"),
    # The spec names store.HostUsageMaxAge without a value; one minute is two heartbeats, so a
    # single late beat does not age a sample out, and it stays under throttle_recovery (5m).
    _dur("store.host_usage_max_age", "1m",
         "How old a host's usage sample may be before placement stops trusting it.", lo="1s"),
    _dur("store.cpu_hold_window", "30s",
         "How long CPU pressure must last before the hold calls it sustained.", lo="1s"),
    # "store.MinCPUFactor 0.5": a throttled job finishes late rather than timing out.
    Setting("store.min_cpu_factor", FLOAT, 0.5,
            "The smallest share of its CPU quota the throttle leaves a runner.",
            min=0.5, max=1.0),
    # Each rung takes a quarter of the slots; a fourth would be a cordon, which is the operator's.
    Setting("store.max_throttle_level", INT, 3,
            "The highest rung of the throttle ladder a host can be stepped down to.",
            min=0, max=3),
    # "store.MinHostReserveCPUs 0.5, store.MinHostReserveCPUFraction 0.05" (allocation row).
    Setting("store.min_host_reserve_cpus", FLOAT, 0.5,
            "The fewest cores kept back from runners on every host.", min=0.0),
    Setting("store.min_host_reserve_cpu_fraction", FLOAT, 0.05,
            "The smallest share of a host's cores kept back from runners.", min=0.0, max=0.5),
    # One controller per database: renew well inside the lease (renew < ttl / 2).
    _dur("controller.lease_ttl", "30s",
         "How long the controller's database lease lasts without a renewal.", lo="5s"),
    _dur("controller.lease_renew", "10s",
         "How often the controller renews its database lease.", lo="1s"),
)
# fmt: on

ENTRIES: dict[str, Setting | Derived] = {entry.key: entry for entry in _ENTRIES}
SETTINGS: dict[str, Setting] = {e.key: e for e in _ENTRIES if isinstance(e, Setting)}
DERIVED: dict[str, Derived] = {e.key: e for e in _ENTRIES if isinstance(e, Derived)}
KEYS: tuple[str, ...] = tuple(ENTRIES)
# A secret's <VAR>_FILE that is another entry's variable (ZOOMIES_GITHUB_PRIVATE_KEY_FILE) is
# that entry's, and is not read twice.
_OWN_ENV_NAMES = frozenset(s.env for s in SETTINGS.values())
assert len(ENTRIES) == len(_ENTRIES), "duplicate setting key"


def entry(key: str) -> Setting | Derived:
    try:
        return ENTRIES[key]
    except KeyError:
        raise UnknownSetting(key) from None


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
    from django.conf import settings as django_settings

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
    from django.db import connection, transaction

    if connection.in_atomic_block:
        with transaction.atomic():
            return fetch()
    return fetch()


def _read_database_layer() -> tuple[dict[str, Any], list[Finding]]:
    from django.db import DatabaseError

    from zoomies_site.models import SettingValue

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

# A secret's SettingValue row is {"sealed": "v1:..."}: its stored JSON, sealed (accounts.sealing).
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
        value = env.get(setting.env)
        if value:  # an empty variable counts as unset
            raw[key], where[key] = value, setting.env
            continue
        file_var = f"{setting.env}_FILE"
        path = env.get(file_var) if setting.secret and file_var not in _OWN_ENV_NAMES else None
        if not path:
            continue
        try:
            text = Path(path).read_text()
        except OSError as exc:
            problems.append(
                error(
                    f"config.secret_file_unreadable:{key}",
                    f"{setting.env}_FILE names a file that cannot be read",
                    f"{key} stays at its lower layer's value ({exc.strerror or exc}).",
                    f"Point {setting.env}_FILE at a file the controller's user can read.",
                )
            )
            continue
        if setting.type == LIST:
            raw[key] = [line.strip() for line in text.splitlines() if line.strip()]
        else:
            raw[key] = text.strip()
        where[key] = f"{setting.env}_FILE"
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


# --- validation ----------------------------------------------------------------------------


def validate(
    values: Mapping[str, Any] | None = None, *, pools: Iterable[Any] | None = None
) -> list[Finding]:
    """Every finding about a configuration, errors first (CONF-03, CONF-04, SEC-04).

    `values` is a `Values` (None: the live ones) or a plain mapping of key to value, layered
    over the defaults. `pools` are objects with `name`, `ephemeral` and `dind`; None skips
    the pool findings, which is what keeps this free of the database when values are given.
    """
    if values is None:
        vals = current()
    elif isinstance(values, Values):
        vals = values
    else:
        vals = _defaults().overlay(values, source="given", where="the values given")
    found = list(vals.problems)
    found += _relationship_findings(vals)
    found += _posture_findings(vals)
    if pools is not None:
        found += _pool_findings(pools)
    return sorted(found, key=lambda f: not f.is_error)


def _fmt(value: Any) -> str:
    return format_duration(value) if isinstance(value, timedelta) else str(value)


def _relationship_findings(v: Values) -> list[Finding]:
    out: list[Finding] = []

    def need(ok: bool, key: str, title: str, why: str, fix: str, *, severe: bool = True) -> None:
        if not ok:
            out.append((error if severe else warning)(f"config.{key}", title, why, fix))

    pt, ct, dw = (
        v["scheduler.provision_timeout"],
        v["agent.create_timeout"],
        v["runners.docker_wait"],
    )
    cl, sl, rl = v["tasks.create_lease"], v["tasks.stop_lease"], v["tasks.remove_lease"]
    hi, ht, lost = v["agent.heartbeat_interval"], v["agent.heartbeat_timeout"], v["host.lost_after"]

    # CONF-07: the provision timeout is the most patient of the three bounds on a start.
    need(
        pt > ct + dw,
        "provision_timeout_too_short",
        "scheduler.provision_timeout is not longer than agent.create_timeout plus "
        "runners.docker_wait",
        f"A runner may spend {_fmt(ct)} being created and {_fmt(dw)} waiting for its Docker "
        f"daemon, so at {_fmt(pt)} one doing what it was configured to do is failed.",
        f"Raise scheduler.provision_timeout above {_fmt(ct + dw)}, or lower "
        "agent.create_timeout or runners.docker_wait.",
    )
    need(
        pt <= cl,
        "provision_timeout_exceeds_create_lease",
        "scheduler.provision_timeout is longer than tasks.create_lease",
        f"A create lost after {_fmt(cl)} is offered again while the runner is still within its "
        f"{_fmt(pt)} provision timeout, so a runner can fail with its create neither "
        "redelivered nor abandoned.",
        f"Lower scheduler.provision_timeout to {_fmt(cl)} or less, or raise tasks.create_lease.",
    )
    # TASK-12: every lease outlasts the work it covers.
    need(
        cl > ct,
        "create_lease_too_short",
        "tasks.create_lease is not longer than agent.create_timeout",
        "The create would be offered to the host again while its first attempt is still "
        "running, and two workloads could be built for one runner.",
        f"Raise tasks.create_lease above {_fmt(ct)}, or lower agent.create_timeout.",
    )
    stop_work = v["runners.drain_grace"] + v["agent.stop_margin"]
    need(
        sl > stop_work,
        "stop_lease_too_short",
        "tasks.stop_lease is not longer than runners.drain_grace plus agent.stop_margin",
        f"A stop may rightly take {_fmt(stop_work)}, so at {_fmt(sl)} it is offered again "
        "while the first attempt is still stopping the runner.",
        f"Raise tasks.stop_lease above {_fmt(stop_work)}, or lower runners.drain_grace.",
    )
    need(
        rl > v["agent.remove_timeout"],
        "remove_lease_too_short",
        "tasks.remove_lease is not longer than agent.remove_timeout",
        "The remove would be offered again while the first attempt is still removing.",
        f"Raise tasks.remove_lease above {_fmt(v['agent.remove_timeout'])}, or lower "
        "agent.remove_timeout.",
    )
    need(
        v["tasks.host_check_lease"] > v["agent.host_check_run_timeout"],
        "host_check_lease_too_short",
        "tasks.host_check_lease is not longer than agent.host_check_run_timeout",
        "A host check still running on the agent would be abandoned, and its result thrown away.",
        f"Raise tasks.host_check_lease above {_fmt(v['agent.host_check_run_timeout'])}.",
    )
    # The silence ladder (HOST-05): late, then unhealthy, then lost.
    need(
        hi < ht,
        "heartbeat_interval_not_below_timeout",
        "agent.heartbeat_interval is not shorter than agent.heartbeat_timeout",
        "Every host would count as unhealthy between two heartbeats, so nothing is placed.",
        f"Lower agent.heartbeat_interval to {_fmt(ht / 2)} or less.",
    )
    need(
        lost > ht,
        "host_lost_before_unhealthy",
        "host.lost_after is not later than agent.heartbeat_timeout",
        "Runners would be failed on a host the scheduler is still placing new ones on.",
        f"Raise host.lost_after above {_fmt(ht)}, or lower agent.heartbeat_timeout.",
    )
    # One controller per database: one missed renewal must not lose the lease.
    ttl, renew = v["controller.lease_ttl"], v["controller.lease_renew"]
    need(
        renew < ttl / 2,
        "controller_lease_renew_too_slow",
        "controller.lease_renew is not under half of controller.lease_ttl",
        "One late renewal would let the lease lapse, and a second controller could take the "
        "database while this one still runs.",
        f"Lower controller.lease_renew below {_fmt(ttl / 2)}, or raise controller.lease_ttl.",
    )
    # SCHED-22: the backoff is computed from failures still inside the retention.
    need(
        v["scheduler.start_backoff"] <= v["scheduler.max_start_backoff"],
        "start_backoff_above_max",
        "scheduler.start_backoff is longer than scheduler.max_start_backoff",
        "The first wait after a failure would already be past the cap meant to bound it.",
        "Lower scheduler.start_backoff or raise scheduler.max_start_backoff.",
    )
    need(
        v["scheduler.max_start_backoff"] <= v["scheduler.failed_retention"],
        "start_backoff_outlasts_retention",
        "scheduler.max_start_backoff is longer than scheduler.failed_retention",
        "The failures the wait is computed from are gone before the wait ends.",
        f"Lower scheduler.max_start_backoff to {_fmt(v['scheduler.failed_retention'])} or less.",
    )
    # HOST-21: the throttle ladder is paced against the measurements it climbs on.
    need(
        v["scheduler.throttle_recovery"] > v["store.host_usage_max_age"],
        "throttle_recovery_too_short",
        "scheduler.throttle_recovery is not longer than store.host_usage_max_age",
        "A single calm sample could step a host down the throttle ladder.",
        f"Raise scheduler.throttle_recovery above {_fmt(v['store.host_usage_max_age'])}.",
    )
    need(
        v["scheduler.throttle_step"] >= v["store.cpu_hold_window"],
        "throttle_step_too_short",
        "scheduler.throttle_step is shorter than store.cpu_hold_window",
        "The ladder would climb on CPU pressure the hold had not yet called sustained.",
        f"Raise scheduler.throttle_step to {_fmt(v['store.cpu_hold_window'])} or more.",
    )
    need(
        v["scheduler.stale_throttle_reset"] > lost,
        "stale_throttle_reset_too_early",
        "scheduler.stale_throttle_reset is not later than host.lost_after",
        "A late host would get its slots back before it had even been given up on.",
        f"Raise scheduler.stale_throttle_reset above {_fmt(lost)}.",
    )
    need(
        v["scheduler.load_per_cpu_calm"] < v["scheduler.load_per_cpu_overwhelmed"],
        "load_thresholds_inverted",
        "scheduler.load_per_cpu_calm is not below scheduler.load_per_cpu_overwhelmed",
        "A host could count as calm and overwhelmed at once, and the throttle would flap.",
        "Set scheduler.load_per_cpu_calm below scheduler.load_per_cpu_overwhelmed.",
    )
    # SCHED-32: a pool is reshaped only after the host is past the fleet's own host-lost time.
    need(
        v["scheduler.auto_pools_host_grace"] > lost,
        "auto_pools_host_grace_too_short",
        "scheduler.auto_pools_host_grace is not longer than host.lost_after",
        "A brief network drop or a controller restart would reshuffle automatic pools.",
        f"Raise scheduler.auto_pools_host_grace above {_fmt(lost)}.",
    )
    need(
        v["github.rate_limit_fallback"] <= v["github.rate_limit_cap"],
        "rate_limit_fallback_above_cap",
        "github.rate_limit_fallback is longer than github.rate_limit_cap",
        "The stand-down for a silent rate limit would be longer than any GitHub may ask for.",
        "Lower github.rate_limit_fallback to github.rate_limit_cap or less.",
    )
    need(
        v["agent.start_hold"] <= v["agent.max_start_hold"],
        "start_hold_above_max",
        "agent.start_hold is longer than agent.max_start_hold",
        "The first hold after a runtime failure would already be past its cap.",
        "Lower agent.start_hold or raise agent.max_start_hold.",
    )
    cert, key = v["server.tls_cert"], v["server.tls_key"]
    need(
        bool(cert) == bool(key),
        "tls_incomplete",
        "Only one of server.tls_cert and server.tls_key is set",
        "TLS needs both the certificate and its key, so the controller cannot serve it.",
        "Set both server.tls_cert and server.tls_key, or neither.",
    )
    # Consequences that do not break anything but mislead an operator: warnings.
    need(
        v["runners.not_progressing"] > dw,
        "not_progressing_during_docker_wait",
        "runners.not_progressing fires before runners.docker_wait is over",
        "A runner still waiting for its Docker daemon, as configured, is reported as stuck.",
        f"Raise scheduler.provision_timeout above {_fmt(dw * 2)}, or lower runners.docker_wait.",
        severe=False,
    )
    need(
        v["store.host_usage_max_age"] >= hi,
        "host_usage_max_age_below_heartbeat",
        "store.host_usage_max_age is shorter than agent.heartbeat_interval",
        "Every usage sample goes stale before the next heartbeat brings a new one.",
        f"Raise store.host_usage_max_age to {_fmt(hi)} or more.",
        severe=False,
    )
    need(
        v["housekeeping.tick"] <= ht / 2,
        "housekeeping_tick_slow",
        "housekeeping.tick is more than half of agent.heartbeat_timeout",
        "Host health is judged on the tick, so a silent host is noticed long after the timeout.",
        f"Lower housekeeping.tick to {_fmt(ht / 2)} or less.",
        severe=False,
    )
    return out


def _posture_findings(v: Values) -> list[Finding]:
    """Departures from the safe defaults, each a named warning (SEC-04, HOST-02)."""
    out: list[Finding] = []
    quiet = v["agent.max_quiet_heartbeat_interval"]
    if quiet < v["agent.heartbeat_interval"] < v["agent.heartbeat_timeout"]:
        out.append(
            warning(
                "config.heartbeat_interval_above_half",
                "agent.heartbeat_interval is more than half of agent.heartbeat_timeout",
                "One late heartbeat is enough to mark a healthy host unhealthy, and the "
                "scheduler stops placing runners on it.",
                f"Lower agent.heartbeat_interval to {_fmt(quiet)} or less.",
            )
        )
    bind = v["server.bind"]
    host = _split_bind(bind)[0] if _valid_bind(bind) is None else ""
    if not is_loopback(host) and not (v["server.tls_cert"] and v["server.tls_key"]):
        out.append(
            warning(
                "config.bind_without_tls",
                f"The controller listens on {bind} without TLS",
                "Passwords, session cookies, API tokens and agent credentials cross the network "
                "in plain text.",
                "Set server.tls_cert and server.tls_key, put a TLS proxy in front and bind "
                "to 127.0.0.1, or bind to loopback.",
            )
        )
    if not v["auth.enabled"]:
        out.append(
            warning(
                "config.auth_disabled",
                "Authentication is off",
                "Anyone who can reach the controller can drain hosts, change settings and read "
                "runner logs.",
                "Set auth.enabled to true.",
            )
        )
    api = urlparse(v["github.api_url"])
    if api.scheme == "http" and not is_loopback(api.hostname or ""):
        out.append(
            warning(
                "config.github_api_not_https",
                "github.api_url is plain HTTP",
                "App tokens and JIT runner credentials would cross the network unencrypted.",
                "Use the https:// address of the GitHub API.",
            )
        )
    if not v["github.poll_fallback"]:
        out.append(
            warning(
                "config.poll_fallback_off",
                "The fallback poller is off",
                "If webhooks stop arriving, queued jobs wait for ever and the fleet looks "
                "exactly like a quiet one.",
                "Set github.poll_fallback to true.",
            )
        )
    if not v["github.webhook_secrets"]:
        out.append(
            warning(
                "config.no_webhook_secret",
                "No webhook secret is configured",
                "Webhook deliveries cannot be verified, so jobs are only found by polling.",
                "Set github.webhook_secrets to the secret configured on the GitHub App.",
            )
        )
    if not v["github.app_id"] or not (v["github.private_key"] or v["github.private_key_file"]):
        out.append(
            warning(
                "config.github_app_not_configured",
                "No GitHub App is configured",
                "Without App credentials Zoomies cannot see jobs or register runners.",
                "Set github.app_id and the App's key (manage.py set_secret github.private_key "
                "--from-file app.pem, or github.private_key_file), or run the App manifest flow.",
            )
        )
    return out


def _pool_findings(pools: Iterable[Any]) -> list[Finding]:
    out: list[Finding] = []
    for pool in pools:
        name = getattr(pool, "name", str(pool))
        if not getattr(pool, "ephemeral", True):
            out.append(
                warning(
                    f"config.pool_not_ephemeral:{name}",
                    f"Pool {name} is not ephemeral",
                    "Its runners take job after job, so one workflow's files, credentials and "
                    "processes can reach the next.",
                    f"Make pool {name} ephemeral unless its jobs are all trusted.",
                )
            )
        if getattr(pool, "dind", False):
            out.append(
                warning(
                    f"config.pool_docker_exposed:{name}",
                    f"Pool {name} gives its jobs a Docker daemon",
                    "A job that can drive a privileged Docker daemon can escape its container.",
                    f"Turn off Docker-in-Docker for pool {name} unless its jobs need Docker.",
                )
            )
    return out


def startup_findings() -> list[Finding]:
    """`validate()` over freshly read live values and the live pools (CONF-05)."""
    from django.db import DatabaseError

    from runners.models import Pool

    reload()
    values = current()
    try:
        pools: list[Any] | None = _read_rows(
            lambda: list(Pool.objects.only("name", "ephemeral", "dind").order_by("name"))
        )
    except DatabaseError:
        pools = None  # no table before the first migrate; the settings findings still stand
    return validate(values, pools=pools)


def raise_for_errors(findings: Iterable[Finding]) -> None:
    """Raise ConfigError listing every error finding, if there is one (CONF-04)."""
    found = errors(findings)
    if found:
        raise ConfigError(found)
