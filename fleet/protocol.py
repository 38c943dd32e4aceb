"""The agent protocol (docs/agent-protocol.md) as one schema: every request and answer shape.

Pure Python: no Django, no HTTP library, nothing of the controller. The controller's views
(fleet/api.py) and actions parse requests with it, the agent's client (fleet/agent/client.py)
builds requests and parses answers with it, and the fake controller the agent's tests run
against (tests/fleet/agent/fakes.py) does both. It ships with the agent, so a host runs
it without the controller.

Each shape is a frozen dataclass with `from_json` (which raises `ProtocolError` naming the
field's path and what is wrong with it) and `to_json`. Unknown fields are ignored, so either
side may add a field before the other knows it; an absent or null optional field is None.
Numbers are bounded by the columns they land in, strings hold no NUL and no lone surrogate
(neither PostgreSQL nor UTF-8 can store them), and `loads` refuses NaN, infinities and
nesting too deep to parse, so no body the agent or anyone else sends can reach the database
in a shape it would refuse with a 500.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

VERSION = 1
API_PREFIX = "/api/v1/agent"
MAX_BODY_BYTES = 1024 * 1024  # a report batch for a few hundred runners fits many times over
MAX_WAIT_SECONDS = 30  # the cap on a task long-poll's `wait`

INT32_MAX = 2**31 - 1  # an IntegerField on PostgreSQL
INT64_MAX = 2**63 - 1  # a BigAutoField, and SQLite's integer
MAX_CPUS = 1_000_000.0
MAX_SECONDS = 86_400.0  # a day: no tunable or task duration is longer
MAX_NESTING = 64  # far more than any shape here has; a deeper body is refused before parsing

HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_BACKENDS = 16
MAX_LABELS = 64
MAX_USAGE_KEYS = 32
MAX_MESSAGE = 4096  # a task error or a report's message
MAX_OUTPUT_TAIL = 64 * 1024  # the end of a failed runner's output, in characters
MAX_REPORTS = 10_000
TASK_KINDS = (
    "create_runner",
    "stop_runner",
    "remove_runner",
    "stream_logs",
    "cancel_logs",
    "image_prewarm",
)
REPORT_STATES = ("registering", "removed", "failed")
# BACK-03, BACK-05: the resource limits a backend's engine says it can apply.
LIMIT_KINDS = ("cpus", "memory")
REPORT_PHASES = ("running", "exited", "missing")


class ProtocolError(ValueError):
    """A body that is not the protocol's shape: `path` is the field (`reports[3].runner_id`,
    `$` for the body itself) and `reason` what is wrong with it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


# -- JSON ---------------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ProtocolError("$", f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError("$", f"the number {text[:40]} is out of range")
    return value


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in a JSON text, counted without parsing it (so a
    body nested a million levels deep costs one linear scan, not a RecursionError)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def loads(body: bytes | str) -> dict[str, Any]:
    """A request or answer body: a JSON object, or ProtocolError (never RecursionError,
    never NaN or an infinity, never a number Python would refuse to print)."""
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("$", "the body is not UTF-8") from None
    else:
        text = body
    if not text.strip():
        return {}
    # The scan only runs when there are enough brackets for the depth to matter.
    if text.count("[") + text.count("{") > MAX_NESTING and nesting_depth(text) > MAX_NESTING:
        raise ProtocolError("$", f"the body nests deeper than {MAX_NESTING} levels")
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except ProtocolError:
        raise
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("$", f"the body is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ProtocolError("$", "the body must be a JSON object")
    return data


def dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, allow_nan=False, separators=(",", ":"))


# -- fields -------------------------------------------------------------------------------


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return key if path in ("", "$") else f"{path}.{key}"


def _clean_text(value: str, path: str) -> str:
    if "\x00" in value:
        raise ProtocolError(path, "must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(path, "must be valid Unicode (no lone surrogates)") from None
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Object:
    """Reads one JSON object's fields, naming each field's path in an error."""

    def __init__(self, data: Any, path: str = "$") -> None:
        if not isinstance(data, Mapping):
            raise ProtocolError(path, "must be a JSON object")
        self.data = data
        self.path = path

    def at(self, key: str) -> str:
        return _join(self.path, key)

    def raw(self, key: str, *, required: bool = False) -> Any:
        value = self.data.get(key)
        if value is None and required:
            raise ProtocolError(self.at(key), "is required")
        return value

    def integer(
        self, key: str, *, required: bool = False, minimum: int = 0, maximum: int = INT64_MAX
    ) -> int | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 4.0 from a JSON encoder that writes every number as a float
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError(self.at(key), "must be an integer")
        if not minimum <= value <= maximum:
            raise ProtocolError(self.at(key), f"must be between {minimum} and {maximum}")
        return value

    def number(
        self, key: str, *, required: bool = False, minimum: float = 0.0, maximum: float
    ) -> float | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        if not _is_number(value) or not math.isfinite(value):
            raise ProtocolError(self.at(key), "must be a number")
        if not minimum <= value <= maximum:
            raise ProtocolError(self.at(key), f"must be between {minimum:g} and {maximum:g}")
        return float(value)

    def string(
        self,
        key: str,
        *,
        required: bool = False,
        max_length: int,
        choices: tuple[str, ...] | None = None,
    ) -> str | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ProtocolError(self.at(key), "must be a string")
        if len(value) > max_length:
            raise ProtocolError(self.at(key), f"must be at most {max_length} characters")
        if choices is not None and value not in choices:
            raise ProtocolError(self.at(key), f"must be one of {', '.join(choices)}")
        return _clean_text(value, self.at(key))

    def boolean(self, key: str, *, required: bool = False) -> bool | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise ProtocolError(self.at(key), "must be true or false")
        return value

    def array(self, key: str, *, required: bool = False, max_items: int) -> list[Any] | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        if not isinstance(value, list):
            raise ProtocolError(self.at(key), "must be an array")
        if len(value) > max_items:
            raise ProtocolError(self.at(key), f"must have at most {max_items} items")
        return value

    def object(self, key: str, *, required: bool = False) -> _Object | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        return _Object(value, self.at(key))


def _present(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


# -- what a host is (join and heartbeat) --------------------------------------------------


@dataclass(frozen=True)
class HostFacts:
    """What a join or heartbeat says about the host (HOST-07, HOST-08, HOST-09, HOST-10).

    Every field is optional: an absent or null fact leaves the stored one as it is.
    """

    capacity: int | None = None
    backends: tuple[str, ...] | None = None
    platform: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    labels: Mapping[str, str | int | float | bool] | None = None
    version: str | None = None
    disk_total_mb: int | None = None
    disk_free_mb: int | None = None
    # Per backend, the limits its engine can apply ({"docker": ("cpus", "memory"),
    # "process": ()}): a host share is given only where it would bind (BACK-05).
    backend_limits: Mapping[str, tuple[str, ...]] | None = None

    @classmethod
    def read(cls, obj: _Object) -> HostFacts:
        backends = obj.array("backends", max_items=MAX_BACKENDS)
        labels = obj.object("labels")
        limits = obj.object("backend_limits")
        return cls(
            capacity=obj.integer("capacity", maximum=INT32_MAX),
            backends=(
                None
                if backends is None
                else tuple(
                    _backend_name(b, _join(obj.at("backends"), i)) for i, b in enumerate(backends)
                )
            ),
            platform=obj.string("platform", max_length=32),
            cpus=obj.number("cpus", maximum=MAX_CPUS),
            memory_mb=obj.integer("memory_mb", maximum=INT32_MAX),
            labels=None if labels is None else _labels(labels),
            version=obj.string("version", max_length=64),
            disk_total_mb=obj.integer("disk_total_mb", maximum=INT32_MAX),
            disk_free_mb=obj.integer("disk_free_mb", maximum=INT32_MAX),
            backend_limits=None if limits is None else _backend_limits(limits),
        )

    @classmethod
    def from_json(cls, data: Any) -> HostFacts:
        return cls.read(_Object(data))

    def to_json(self) -> dict[str, Any]:
        """The facts that are present, with the field names the wire and the Host row use."""
        out = _present(**{f.name: getattr(self, f.name) for f in fields(self)})
        if "backends" in out:
            out["backends"] = list(out["backends"])
        if "labels" in out:
            out["labels"] = dict(out["labels"])
        if "backend_limits" in out:
            out["backend_limits"] = {k: list(v) for k, v in out["backend_limits"].items()}
        return out


def _backend_limits(obj: _Object) -> dict[str, tuple[str, ...]]:
    if len(obj.data) > MAX_BACKENDS:
        raise ProtocolError(obj.path, f"must name at most {MAX_BACKENDS} backends")
    out: dict[str, tuple[str, ...]] = {}
    for key in obj.data:
        name = _backend_name(key, obj.at(str(key)))
        kinds = obj.array(name, required=False, max_items=len(LIMIT_KINDS)) or []
        for index, kind in enumerate(kinds):
            if kind not in LIMIT_KINDS:
                path = _join(obj.at(name), index)
                raise ProtocolError(path, f"must be one of {', '.join(LIMIT_KINDS)}")
        out[name] = tuple(sorted(set(kinds)))
    return out


def _backend_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 32:
        raise ProtocolError(path, "must be a backend name of 1-32 characters")
    return _clean_text(value, path)


def _labels(obj: _Object) -> dict[str, str | int | float | bool]:
    if len(obj.data) > MAX_LABELS:
        raise ProtocolError(obj.path, f"must have at most {MAX_LABELS} labels")
    out: dict[str, str | int | float | bool] = {}
    for key, value in obj.data.items():
        path = obj.at(str(key))
        if not isinstance(key, str) or not key or len(key) > 64:
            raise ProtocolError(path, "a label name must be 1-64 characters")
        _clean_text(key, path)
        if isinstance(value, str):
            if len(value) > 256:
                raise ProtocolError(path, "must be at most 256 characters")
            out[key] = _clean_text(value, path)
        elif isinstance(value, bool) or (_is_int(value) and abs(value) <= INT64_MAX):
            out[key] = value
        elif isinstance(value, float) and math.isfinite(value):
            out[key] = value
        else:
            raise ProtocolError(path, "must be a string, a number or a boolean")
    return out


def read_usage(value: Any) -> tuple[dict[str, float] | None, str | None]:
    """HOST-11: a usage sample is an object of at most 32 non-negative finite numbers.

    Answers (usage, None), or (None, why) for a sample that is not: a bad measurement is
    dropped on its own, it never fails the heartbeat that carried it.
    """
    if value is None:
        return None, None
    if not isinstance(value, Mapping) or not value:
        return None, "usage must be a non-empty object"
    if len(value) > MAX_USAGE_KEYS:
        return None, f"usage has more than {MAX_USAGE_KEYS} keys"
    out: dict[str, float] = {}
    for key, number in value.items():
        if not isinstance(key, str) or not key or len(key) > 64:
            return None, "a usage key must be 1-64 characters"
        try:
            _clean_text(key, "usage")
        except ProtocolError as exc:
            return None, exc.reason
        if not _is_number(number) or not math.isfinite(number) or not 0 <= number <= 1e15:
            return None, f"usage.{key} must be a non-negative number"
        out[key] = float(number)
    return out, None


@dataclass(frozen=True)
class JoinRequest:
    """`POST join`: the host's name, its facts, and one credential: a join token (AUTH-08)
    or a claim code (a machine the controller provisioned). A request with neither is
    answered 401, like a wrong one, so it is not a shape error here."""

    name: str
    facts: HostFacts = field(default_factory=HostFacts)
    join_token: str | None = None
    claim_code: str | None = None
    usage: Mapping[str, float] | None = None
    usage_problem: str | None = None  # why a usage sample was dropped

    @classmethod
    def from_json(cls, data: Any) -> JoinRequest:
        obj = _Object(data)
        name = obj.string("name", required=True, max_length=64)
        assert name is not None  # noqa: S101  # narrows the type; the code above guarantees it
        if not HOST_NAME.match(name):
            raise ProtocolError(
                obj.at("name"),
                "must be 1-64 letters, digits, dots, dashes or underscores, starting with a "
                "letter or digit",
            )
        usage, problem = read_usage(obj.raw("usage"))
        return cls(
            name=name,
            facts=HostFacts.read(obj),
            join_token=obj.string("join_token", max_length=256) or None,
            claim_code=obj.string("claim_code", max_length=256) or None,
            usage=usage,
            usage_problem=problem,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.facts.to_json(),
            **_present(
                name=self.name,
                join_token=self.join_token,
                claim_code=self.claim_code,
                usage=None if self.usage is None else dict(self.usage),
            ),
        }


@dataclass(frozen=True)
class HeartbeatRequest:
    """`POST heartbeat`: the host's facts again and a usage sample (HOST-01, HOST-11)."""

    facts: HostFacts = field(default_factory=HostFacts)
    usage: Mapping[str, float] | None = None
    usage_problem: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> HeartbeatRequest:
        obj = _Object(data)
        usage, problem = read_usage(obj.raw("usage"))
        return cls(facts=HostFacts.read(obj), usage=usage, usage_problem=problem)

    def to_json(self) -> dict[str, Any]:
        out = self.facts.to_json()
        if self.usage is not None:
            out["usage"] = dict(self.usage)
        return out


@dataclass(frozen=True)
class AgentTunables:
    """The agent's timings, in seconds, as the controller's settings say (agent.* keys).

    The controller sends them in every join and heartbeat answer; these defaults are only
    what an agent uses before its first answer, or with a controller that sends none.
    """

    heartbeat_interval: float = 30.0  # HOST-01
    long_poll_wait: float = 25.0  # how long a task poll may be held
    orphan_grace: float = 120.0  # AGENT-16
    missing_grace: float = 60.0  # AGENT-17
    shutdown_grace: float = 30.0  # AGENT-19
    finished_retention: float = 0.0  # AGENT-18

    # What each may be: a nonsense answer must neither busy-loop the agent nor silence it.
    BOUNDS = {
        "heartbeat_interval": (1.0, 3600.0),
        "long_poll_wait": (0.0, float(MAX_WAIT_SECONDS)),
        "orphan_grace": (0.0, MAX_SECONDS),
        "missing_grace": (0.0, MAX_SECONDS),
        "shutdown_grace": (0.0, MAX_SECONDS),
        "finished_retention": (0.0, MAX_SECONDS),
    }

    @classmethod
    def read(cls, obj: _Object) -> AgentTunables:
        """Lenient on purpose: a value out of bounds is brought into them and one that is
        not a number is the default, so a controller's odd setting never stops an agent."""
        values = {}
        for name, (low, high) in cls.BOUNDS.items():
            value = obj.raw(name)
            if _is_number(value) and math.isfinite(value):
                values[name] = min(max(float(value), low), high)
        return cls(**values)

    def to_json(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.BOUNDS}


def _expires_in(obj: _Object) -> float | None:
    return obj.number("agent_token_expires_in", minimum=1.0, maximum=MAX_SECONDS)


@dataclass(frozen=True)
class JoinAnswer:
    """200 to a join: the host's id, its own agent token (returned once), and the timings.

    `agent_token_expires_in` is set for a credential minted from a claim code (ESC-06):
    seconds from the answer until it is refused unless renewed (`TokenAnswer`). Seconds, not
    a time of day, so the agent's clock need not agree with the controller's."""

    host_id: int
    agent_token: str
    tunables: AgentTunables = field(default_factory=AgentTunables)
    agent_token_expires_in: float | None = None

    @classmethod
    def from_json(cls, data: Any) -> JoinAnswer:
        obj = _Object(data)
        host_id = obj.integer("host_id", required=True, minimum=1)
        token = obj.string("agent_token", required=True, max_length=256)
        assert host_id is not None and token is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(
            host_id=host_id,
            agent_token=token,
            tunables=AgentTunables.read(obj),
            agent_token_expires_in=_expires_in(obj),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "host_id": self.host_id,
            "agent_token": self.agent_token,
            **self.tunables.to_json(),
            **_present(agent_token_expires_in=self.agent_token_expires_in),
        }


@dataclass(frozen=True)
class TokenAnswer:
    """200 to `POST token/renew`: the host's next short-lived agent token (ESC-06)."""

    agent_token: str
    agent_token_expires_in: float

    @classmethod
    def from_json(cls, data: Any) -> TokenAnswer:
        obj = _Object(data)
        token = obj.string("agent_token", required=True, max_length=256)
        if obj.raw("agent_token_expires_in") is None:
            raise ProtocolError(obj.at("agent_token_expires_in"), "is required")
        expires_in = _expires_in(obj)
        assert token is not None and expires_in is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(agent_token=token, agent_token_expires_in=expires_in)

    def to_json(self) -> dict[str, Any]:
        return {
            "agent_token": self.agent_token,
            "agent_token_expires_in": self.agent_token_expires_in,
        }


@dataclass(frozen=True)
class HeartbeatAnswer:
    """200 to a heartbeat: whether the host is cordoned, and the timings (HOST-01)."""

    cordoned: bool = False
    tunables: AgentTunables = field(default_factory=AgentTunables)

    @classmethod
    def from_json(cls, data: Any) -> HeartbeatAnswer:
        obj = _Object(data)
        if obj.raw("heartbeat_interval") is None:
            raise ProtocolError(obj.at("heartbeat_interval"), "is required")
        return cls(cordoned=bool(obj.boolean("cordoned")), tunables=AgentTunables.read(obj))

    def to_json(self) -> dict[str, Any]:
        return {"cordoned": self.cordoned, **self.tunables.to_json()}


# -- tasks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One task as the long-poll delivers it. The payload's shape depends on the kind
    (`CreateRunnerPayload`, `StopRunnerPayload`, `RemoveRunnerPayload`)."""

    id: int
    kind: str
    attempt: int | None = None
    runner_id: int | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any, path: str = "$") -> Task:
        obj = _Object(data, path)
        task_id = obj.integer("id", required=True, minimum=1)
        kind = obj.string("kind", required=True, max_length=32)
        payload = obj.object("payload")
        runner_id = obj.integer("runner_id", minimum=1)
        if runner_id is None and payload is not None:
            runner_id = payload.integer("runner_id", minimum=1)
        assert task_id is not None and kind is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(
            id=task_id,
            kind=kind,
            attempt=obj.integer("attempt", maximum=INT32_MAX),
            runner_id=runner_id,
            payload=dict(payload.data) if payload is not None else {},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "attempt": self.attempt,
            "runner_id": self.runner_id,
            "payload": dict(self.payload),
        }


@dataclass(frozen=True)
class TaskList:
    """200 to `GET tasks?wait=N`: the tasks taken for this host, or none after the wait."""

    tasks: tuple[Task, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> TaskList:
        obj = _Object(data)
        items = obj.array("tasks", required=True, max_items=10_000)
        assert items is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(tasks=tuple(Task.from_json(t, _join("tasks", i)) for i, t in enumerate(items)))

    def to_json(self) -> dict[str, Any]:
        return {"tasks": [t.to_json() for t in self.tasks]}


def parse_wait(raw: str | None, default: float) -> float:
    """The long-poll's `?wait=` in seconds, capped at MAX_WAIT_SECONDS."""
    if raw is None or raw == "":
        return min(default, MAX_WAIT_SECONDS)
    try:
        wait = float(raw)
    except ValueError:
        raise ProtocolError("wait", "must be a number of seconds") from None
    if not math.isfinite(wait) or wait < 0:
        raise ProtocolError("wait", "must be a number of seconds")
    return min(wait, MAX_WAIT_SECONDS)


@dataclass(frozen=True)
class CreateRunnerPayload:
    """`create_runner`: what to start (the agent's backends type it as their RunnerSpec)."""

    runner_id: int
    runner_name: str
    pool: str
    backend: str
    image: str | None = None
    command: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory_mb: int | None = None
    ephemeral: bool = True
    cpus_from: str | None = None  # BACK-09: "pool" or "host", as the runner's row says
    memory_from: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "runner_id": self.runner_id,
            "runner_name": self.runner_name,
            "pool": self.pool,
            "backend": self.backend,
            "image": self.image,
            "command": None if self.command is None else list(self.command),
            "env": dict(self.env),
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "ephemeral": self.ephemeral,
            "cpus_from": self.cpus_from,
            "memory_from": self.memory_from,
        }


def _seconds(obj: _Object, key: str, default: float) -> float:
    """A payload's duration: a controller's nonsense falls back to the default, since the
    task must still be done (and answered) whatever its payload says."""
    try:
        value = obj.number(key, maximum=MAX_SECONDS)
    except ProtocolError:
        return default
    return default if value is None else value


@dataclass(frozen=True)
class StopRunnerPayload:
    """`stop_runner`: wait `grace` s for it to exit unsignalled, then SIGTERM, then SIGKILL
    `timeout` s later (RUN-11)."""

    runner_id: int
    grace: float = 0.0
    timeout: float = 30.0

    @classmethod
    def from_json(cls, data: Any, *, runner_id: int) -> StopRunnerPayload:
        obj = _Object(data if isinstance(data, Mapping) else {}, "payload")
        return cls(
            runner_id=runner_id,
            grace=_seconds(obj, "grace", cls.grace),
            timeout=_seconds(obj, "timeout", cls.timeout),
        )

    def to_json(self) -> dict[str, Any]:
        return {"runner_id": self.runner_id, "grace": self.grace, "timeout": self.timeout}


@dataclass(frozen=True)
class RemoveRunnerPayload:
    """`remove_runner`: delete the workload and its directory; `retry` counts reissues."""

    runner_id: int
    retry: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _present(runner_id=self.runner_id, retry=self.retry)


@dataclass(frozen=True)
class ImagePrewarmPayload:
    """`image_prewarm`: prepare a pool's runner image on this host ahead of its creates, and
    for a pool that provides Docker the agent's sidecar image too (AGENT-14). No runner."""

    backend: str
    image: str
    pool: str = ""
    dind: bool = False

    @classmethod
    def from_json(cls, data: Any) -> ImagePrewarmPayload:
        obj = _Object(data if isinstance(data, Mapping) else {}, "payload")
        backend = obj.string("backend", required=True, max_length=32)
        image = obj.string("image", required=True, max_length=300)
        assert backend is not None and image is not None  # noqa: S101  # required above
        return cls(
            backend=backend,
            image=image,
            pool=obj.string("pool", max_length=64) or "",
            dind=bool(obj.boolean("dind")),
        )

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "image": self.image, "pool": self.pool, "dind": self.dind}


# -- runner logs (LOG-01..05) -------------------------------------------------------------

MAX_LOG_CHUNK = 64 * 1024  # characters of output in one chunk the agent posts
STREAM_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def _stream_id(obj: _Object) -> str:
    value = obj.string("stream_id", required=True, max_length=64)
    if value is None or not STREAM_ID.match(value):
        raise ProtocolError(obj.at("stream_id"), "must be 16-64 letters, digits, - or _")
    return value


@dataclass(frozen=True)
class StreamLogsPayload:
    """`stream_logs`: follow the runner's output from its start and POST it, chunk by chunk,
    to `logs/{stream_id}` until it ends or the stream is cancelled (LOG-01, LOG-02)."""

    runner_id: int
    stream_id: str

    @classmethod
    def from_json(cls, data: Any, *, runner_id: int) -> StreamLogsPayload:
        return cls(runner_id=runner_id, stream_id=_stream_id(_Object(data, "payload")))

    def to_json(self) -> dict[str, Any]:
        return {"runner_id": self.runner_id, "stream_id": self.stream_id}


@dataclass(frozen=True)
class CancelLogsPayload:
    """`cancel_logs`: the stream's last viewer left; stop reading (LOG-04)."""

    runner_id: int
    stream_id: str

    @classmethod
    def from_json(cls, data: Any, *, runner_id: int) -> CancelLogsPayload:
        return cls(runner_id=runner_id, stream_id=_stream_id(_Object(data, "payload")))

    def to_json(self) -> dict[str, Any]:
        return {"runner_id": self.runner_id, "stream_id": self.stream_id}


@dataclass(frozen=True)
class LogChunk:
    """`POST logs/{stream_id}`: the next piece of the runner's output as text (LOG-02).
    `eof` ends the stream: the output ended, or the agent could not read it (`error`)."""

    data: str = ""
    eof: bool = False
    error: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> LogChunk:
        obj = _Object(data)
        return cls(
            data=obj.string("data", max_length=MAX_LOG_CHUNK) or "",
            eof=bool(obj.boolean("eof")),
            error=obj.string("error", max_length=MAX_MESSAGE),
        )

    def to_json(self) -> dict[str, Any]:
        return {"data": self.data, "eof": self.eof, **_present(error=self.error)}


@dataclass(frozen=True)
class LogChunkAnswer:
    """Whether anyone still watches: `open` false tells the agent to stop reading."""

    open: bool = True

    @classmethod
    def from_json(cls, data: Any) -> LogChunkAnswer:
        value = _Object(data).boolean("open")
        return cls(open=True if value is None else value)

    def to_json(self) -> dict[str, Any]:
        return {"open": self.open}


@dataclass(frozen=True)
class TaskResult:
    """`POST tasks/{id}/result`: whether the task worked, why not, and which delivery."""

    ok: bool
    error: str | None = None
    attempt: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> TaskResult:
        obj = _Object(data)
        ok = obj.boolean("ok", required=True)
        assert ok is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(
            ok=ok,
            error=obj.string("error", max_length=MAX_MESSAGE),
            attempt=obj.integer("attempt", maximum=INT32_MAX),
        )

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "error": self.error, "attempt": self.attempt}


@dataclass(frozen=True)
class TaskResultAnswer:
    accepted: bool = True

    @classmethod
    def from_json(cls, data: Any) -> TaskResultAnswer:
        accepted = _Object(data).boolean("accepted")
        return cls(accepted=True if accepted is None else accepted)

    def to_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted}


# -- runner reports -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerReport:
    """What the agent saw of one runner (RUN-15..17). A `state` outside REPORT_STATES is
    the protocol's shape but the controller refuses that report alone (RUN-18)."""

    runner_id: int
    state: str | None = None
    phase: str | None = None
    exit_code: int | None = None
    message: str | None = None
    # The end of a failed runner's output, read before its workload is deleted (optional).
    output_tail: str | None = None

    @classmethod
    def from_json(cls, data: Any, path: str = "$") -> RunnerReport:
        obj = _Object(data, path)
        runner_id = obj.integer("runner_id", required=True, minimum=1)
        assert runner_id is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(
            runner_id=runner_id,
            state=obj.string("state", max_length=32),
            phase=obj.string("phase", max_length=32),
            exit_code=obj.integer("exit_code", minimum=-INT32_MAX - 1, maximum=INT32_MAX),
            message=obj.string("message", max_length=MAX_MESSAGE),
            output_tail=obj.string("output_tail", max_length=MAX_OUTPUT_TAIL),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "runner_id": self.runner_id,
            "state": self.state,
            "phase": self.phase,
            "exit_code": self.exit_code,
            "message": self.message,
            **_present(output_tail=self.output_tail),
        }


@dataclass(frozen=True)
class ReportsRequest:
    """`POST reports`: a batch of runner reports."""

    reports: tuple[RunnerReport, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> ReportsRequest:
        obj = _Object(data)
        return cls(reports=read_reports(obj.raw("reports", required=True), "reports"))

    def to_json(self) -> dict[str, Any]:
        return {"reports": [r.to_json() for r in self.reports]}


def read_reports(value: Any, path: str = "reports") -> tuple[RunnerReport, ...]:
    if not isinstance(value, list):
        raise ProtocolError(path, "must be an array")
    if len(value) > MAX_REPORTS:
        raise ProtocolError(path, f"must have at most {MAX_REPORTS} items")
    return tuple(RunnerReport.from_json(r, _join(path, i)) for i, r in enumerate(value))


@dataclass(frozen=True)
class ReportsAnswer:
    """Which runners' reports were accepted, and which refused (RUN-18). Accepted is the
    acknowledgement the agent waits for before deleting a finished workload (AGENT-18)."""

    accepted: tuple[int, ...] = ()
    refused: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> ReportsAnswer:
        obj = _Object(data)
        return cls(
            accepted=_ids(obj, "accepted"),
            refused=_ids(obj, "refused"),
        )

    def to_json(self) -> dict[str, Any]:
        return {"accepted": list(self.accepted), "refused": list(self.refused)}


@dataclass(frozen=True)
class InventoryRequest:
    """`POST inventory`: what a starting agent found on its host, sent before its first task
    poll (issue 11 item 3). `runners` are the runner ids with a workload here; `complete` is
    false when a backend could not be listed, so an absence proves nothing."""

    runners: tuple[int, ...] = ()
    complete: bool = True

    @classmethod
    def from_json(cls, data: Any) -> InventoryRequest:
        obj = _Object(data)
        complete = obj.boolean("complete")
        return cls(runners=_ids(obj, "runners"), complete=complete is not False)

    def to_json(self) -> dict[str, Any]:
        return {"runners": list(self.runners), "complete": self.complete}


@dataclass(frozen=True)
class ExpectedRunner:
    """A live runner the controller records on the host and no open create will start:
    the agent watches it as its own. `age` is how long ago its workload was made at the
    latest, in seconds, so the agent's minute for a new workload (AGENT-17) counts from then."""

    runner_id: int
    backend: str
    state: str
    age: float

    @classmethod
    def from_json(cls, data: Any, path: str) -> ExpectedRunner:
        obj = _Object(data, path)
        runner_id = obj.integer("runner_id", required=True, minimum=1)
        assert runner_id is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(
            runner_id=runner_id,
            backend=obj.string("backend", max_length=32) or "",
            state=obj.string("state", max_length=32) or "",
            age=obj.number("age", maximum=float(INT64_MAX)) or 0.0,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "runner_id": self.runner_id,
            "backend": self.backend,
            "state": self.state,
            "age": self.age,
        }


@dataclass(frozen=True)
class InventoryAnswer:
    """200 to an inventory: how many of the tasks the host had in flight were settled from
    it, and the runners the host should hold (`ExpectedRunner`)."""

    settled: int = 0
    runners: tuple[ExpectedRunner, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> InventoryAnswer:
        obj = _Object(data)
        items = obj.array("runners", max_items=MAX_REPORTS) or []
        return cls(
            settled=obj.integer("settled", maximum=INT32_MAX) or 0,
            runners=tuple(
                ExpectedRunner.from_json(r, _join(obj.at("runners"), i))
                for i, r in enumerate(items)
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {"settled": self.settled, "runners": [r.to_json() for r in self.runners]}


def _ids(obj: _Object, key: str) -> tuple[int, ...]:
    items = obj.array(key, max_items=MAX_REPORTS) or []
    out = []
    for i, value in enumerate(items):
        if not _is_int(value) or not 1 <= value <= INT64_MAX:
            raise ProtocolError(_join(obj.at(key), i), "must be a runner id")
        out.append(value)
    return tuple(out)


# -- errors -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorAnswer:
    """Every 4xx and 5xx: one sentence, and for a shape error the field it is about."""

    error: str
    field: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> ErrorAnswer:
        obj = _Object(data)
        return cls(
            error=obj.string("error", required=True, max_length=100_000) or "",
            field=obj.string("field", max_length=1000),
        )

    def to_json(self) -> dict[str, Any]:
        return _present(error=self.error, field=self.field)


def parse(shape: Callable[[Any], Any], body: bytes | str) -> Any:
    """`loads` then `shape`: one call for a view or a client."""
    return shape(loads(body))
