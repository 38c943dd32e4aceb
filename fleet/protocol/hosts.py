"""What a host says and is told: its facts, a join and its answer, a heartbeat and its
answer (the timings, the CPU factor, the memory valve's rules), a renewed token."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fleet.protocol.core import (
    HOST_NAME,
    INT32_MAX,
    INT64_MAX,
    LIMIT_KINDS,
    MAX_BACKENDS,
    MAX_CPUS,
    MAX_LABELS,
    MAX_MEMORY_MB,
    MAX_SECONDS,
    MAX_USAGE_KEYS,
    MAX_WAIT_SECONDS,
    JsonObject,
    ProtocolError,
    clean_text,
    is_int,
    is_number,
    join_path,
    present,
)

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
    def read(cls, obj: JsonObject) -> HostFacts:
        backends = obj.array("backends", max_items=MAX_BACKENDS)
        labels = obj.object("labels")
        limits = obj.object("backend_limits")
        return cls(
            capacity=obj.integer("capacity", maximum=INT32_MAX),
            backends=(
                None
                if backends is None
                else tuple(
                    _backend_name(b, join_path(obj.at("backends"), i))
                    for i, b in enumerate(backends)
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
        return cls.read(JsonObject(data))

    def to_json(self) -> dict[str, Any]:
        """The facts that are present, with the field names the wire and the Host row use."""
        out = present(**{f.name: getattr(self, f.name) for f in fields(self)})
        if "backends" in out:
            out["backends"] = list(out["backends"])
        if "labels" in out:
            out["labels"] = dict(out["labels"])
        if "backend_limits" in out:
            out["backend_limits"] = {k: list(v) for k, v in out["backend_limits"].items()}
        return out


def _backend_limits(obj: JsonObject) -> dict[str, tuple[str, ...]]:
    if len(obj.data) > MAX_BACKENDS:
        raise ProtocolError(obj.path, f"must name at most {MAX_BACKENDS} backends")
    out: dict[str, tuple[str, ...]] = {}
    for key in obj.data:
        name = _backend_name(key, obj.at(str(key)))
        kinds = obj.array(name, required=False, max_items=len(LIMIT_KINDS)) or []
        for index, kind in enumerate(kinds):
            if kind not in LIMIT_KINDS:
                path = join_path(obj.at(name), index)
                raise ProtocolError(path, f"must be one of {', '.join(LIMIT_KINDS)}")
        out[name] = tuple(sorted(set(kinds)))
    return out


def _backend_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 32:
        raise ProtocolError(path, "must be a backend name of 1-32 characters")
    return clean_text(value, path)


def _labels(obj: JsonObject) -> dict[str, str | int | float | bool]:
    if len(obj.data) > MAX_LABELS:
        raise ProtocolError(obj.path, f"must have at most {MAX_LABELS} labels")
    out: dict[str, str | int | float | bool] = {}
    for key, value in obj.data.items():
        path = obj.at(str(key))
        if not isinstance(key, str) or not key or len(key) > 64:
            raise ProtocolError(path, "a label name must be 1-64 characters")
        clean_text(key, path)
        if isinstance(value, str):
            if len(value) > 256:
                raise ProtocolError(path, "must be at most 256 characters")
            out[key] = clean_text(value, path)
        elif isinstance(value, bool) or (is_int(value) and abs(value) <= INT64_MAX):
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
            clean_text(key, "usage")
        except ProtocolError as exc:
            return None, exc.reason
        if not is_number(number) or not math.isfinite(number) or not 0 <= number <= 1e15:
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
        obj = JsonObject(data)
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
            **present(
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
    # The memory valve's record (HOST-29, HOST-32): MB lent to each runner above what it was
    # given, and why a raise a runner needed was refused.
    memory_loans: Mapping[int, int] | None = None
    memory_blocked: Mapping[int, str] | None = None
    # HOST-31: in observe mode, what the valve would have lent; recorded, never charged.
    memory_would_lend: Mapping[int, int] | None = None

    @classmethod
    def from_json(cls, data: Any) -> HeartbeatRequest:
        obj = JsonObject(data)
        usage, problem = read_usage(obj.raw("usage"))
        return cls(
            facts=HostFacts.read(obj),
            usage=usage,
            usage_problem=problem,
            memory_loans=_runner_map(obj.object("memory_loans"), _loan),
            memory_blocked=_runner_map(obj.object("memory_blocked"), _blocked_why),
            memory_would_lend=_runner_map(obj.object("memory_would_lend"), _loan),
        )

    def to_json(self) -> dict[str, Any]:
        out = self.facts.to_json()
        if self.usage is not None:
            out["usage"] = dict(self.usage)
        if self.memory_loans:
            out["memory_loans"] = {str(k): v for k, v in self.memory_loans.items()}
        if self.memory_blocked:
            out["memory_blocked"] = {str(k): v for k, v in self.memory_blocked.items()}
        if self.memory_would_lend:
            out["memory_would_lend"] = {str(k): v for k, v in self.memory_would_lend.items()}
        return out


MAX_RUNNER_ENTRIES = 1000  # per host: far above any host's slots


# -- the memory valve's rules (HOST-24): the controller's planner makes them, the agent's
# valve obeys them until the next heartbeat answer.

# The spec's scheduler.DefaultMemoryCeilingFactor: a runner may be lent up to half again
# what it was given.
DEFAULT_CEILING_FACTOR = 1.5


@dataclass(frozen=True)
class RunnerMemoryRule:
    """One runner's bounds: what it was given (its guarantee), the most its limit may be
    raised to (its ceiling), and the swap it may have on top of its limit."""

    runner_id: int
    guarantee_mb: int
    ceiling_mb: int
    swap_mb: int = 0


@dataclass(frozen=True)
class MemoryRules:
    """A host's lending rules: `capacity_mb` may be lent in all (beyond the loans already
    made), never into the `floor_mb` the host keeps free; one rule per runner that has a
    memory limit (a runner without one has nothing to raise)."""

    capacity_mb: int
    floor_mb: int
    runners: tuple[RunnerMemoryRule, ...] = ()
    # HOST-31: decide against a virtual limit and record what would be lent; change nothing.
    observe: bool = False

    def rule_for(self, runner_id: int) -> RunnerMemoryRule | None:
        return next((r for r in self.runners if r.runner_id == runner_id), None)


def _runner_map(
    obj: JsonObject | None, read: Callable[[JsonObject, str], Any]
) -> dict[int, Any] | None:
    """An object keyed by runner id (a JSON key is a string: "41")."""
    if obj is None:
        return None
    if len(obj.data) > MAX_RUNNER_ENTRIES:
        raise ProtocolError(obj.path, f"must have at most {MAX_RUNNER_ENTRIES} entries")
    out: dict[int, Any] = {}
    for key in obj.data:
        if not isinstance(key, str) or not key.isdigit() or not 0 < int(key) <= INT64_MAX:
            raise ProtocolError(obj.at(str(key)), "must be keyed by a runner id")
        out[int(key)] = read(obj, key)
    return out


def _loan(obj: JsonObject, key: str) -> int:
    return obj.integer(key, required=True, maximum=MAX_MEMORY_MB) or 0


def _blocked_why(obj: JsonObject, key: str) -> str:
    return obj.string(key, required=True, max_length=300) or ""


def _memory_rules(obj: JsonObject | None) -> MemoryRules | None:
    """HOST-24's rules as the heartbeat answer carries them."""
    if obj is None:
        return None
    rules = []
    for i, item in enumerate(obj.array("runners", max_items=MAX_RUNNER_ENTRIES) or []):
        rule = JsonObject(item, f"{obj.at('runners')}[{i}]")
        rules.append(
            RunnerMemoryRule(
                runner_id=rule.integer("runner_id", required=True, minimum=1) or 0,
                guarantee_mb=rule.integer("guarantee_mb", required=True, maximum=MAX_MEMORY_MB)
                or 0,
                ceiling_mb=rule.integer("ceiling_mb", required=True, maximum=MAX_MEMORY_MB) or 0,
                swap_mb=rule.integer("swap_mb", maximum=MAX_MEMORY_MB) or 0,
            )
        )
    return MemoryRules(
        capacity_mb=obj.integer("capacity_mb", required=True, maximum=MAX_MEMORY_MB) or 0,
        floor_mb=obj.integer("floor_mb", required=True, maximum=MAX_MEMORY_MB) or 0,
        runners=tuple(rules),
        observe=bool(obj.boolean("observe")),
    )


def _memory_rules_json(rules: MemoryRules) -> dict[str, Any]:
    return {
        "capacity_mb": rules.capacity_mb,
        "floor_mb": rules.floor_mb,
        "observe": rules.observe,
        "runners": [
            {
                "runner_id": r.runner_id,
                "guarantee_mb": r.guarantee_mb,
                "ceiling_mb": r.ceiling_mb,
                "swap_mb": r.swap_mb,
            }
            for r in rules.runners
        ],  # fmt: skip
    }


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
    bootstrap_cpu_grace: float = 120.0  # HOST-22: a new runner's full CPU quota, for this long

    # What each may be: a nonsense answer must neither busy-loop the agent nor silence it.
    BOUNDS = {
        "heartbeat_interval": (1.0, 3600.0),
        "long_poll_wait": (0.0, float(MAX_WAIT_SECONDS)),
        "orphan_grace": (0.0, MAX_SECONDS),
        "missing_grace": (0.0, MAX_SECONDS),
        "shutdown_grace": (0.0, MAX_SECONDS),
        "finished_retention": (0.0, MAX_SECONDS),
        "bootstrap_cpu_grace": (0.0, 600.0),
    }

    @classmethod
    def read(cls, obj: JsonObject) -> AgentTunables:
        """Lenient on purpose: a value out of bounds is brought into them and one that is
        not a number is the default, so a controller's odd setting never stops an agent."""
        values = {}
        for name, (low, high) in cls.BOUNDS.items():
            value = obj.raw(name)
            if is_number(value) and math.isfinite(value):
                values[name] = min(max(float(value), low), high)
        return cls(**values)

    def to_json(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.BOUNDS}


def _expires_in(obj: JsonObject) -> float | None:
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
        obj = JsonObject(data)
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
            **present(agent_token_expires_in=self.agent_token_expires_in),
        }


@dataclass(frozen=True)
class TokenAnswer:
    """200 to `POST token/renew`: the host's next short-lived agent token (ESC-06)."""

    agent_token: str
    agent_token_expires_in: float

    @classmethod
    def from_json(cls, data: Any) -> TokenAnswer:
        obj = JsonObject(data)
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
    """200 to a heartbeat: whether the host is cordoned, the timings (HOST-01), and the CPU
    factor of its throttle, which the agent applies to every runner (HOST-20)."""

    cordoned: bool = False
    tunables: AgentTunables = field(default_factory=AgentTunables)
    cpu_factor: float = 1.0  # HOST-14: 1.0 down to 0.5; a controller that sends none: 1.0
    # HOST-24: the memory valve's rules for this host; None: the valve is off here.
    memory: MemoryRules | None = None

    @classmethod
    def from_json(cls, data: Any) -> HeartbeatAnswer:
        obj = JsonObject(data)
        if obj.raw("heartbeat_interval") is None:
            raise ProtocolError(obj.at("heartbeat_interval"), "is required")
        factor = obj.number("cpu_factor", minimum=0.5, maximum=1.0)
        return cls(
            cordoned=bool(obj.boolean("cordoned")),
            tunables=AgentTunables.read(obj),
            cpu_factor=1.0 if factor is None else factor,
            memory=_memory_rules(obj.object("memory")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "cordoned": self.cordoned,
            **self.tunables.to_json(),
            "cpu_factor": self.cpu_factor,
            **present(memory=None if self.memory is None else _memory_rules_json(self.memory)),
        }
