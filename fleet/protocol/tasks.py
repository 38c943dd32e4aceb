"""The task queue's messages: a task and the long-poll's list, each task kind's payload,
and a task's result."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.protocol.core import (
    INT32_MAX,
    INT64_MAX,
    MAX_MESSAGE,
    MAX_SECONDS,
    MAX_WAIT_SECONDS,
    JsonObject,
    ProtocolError,
    clean_text,
    is_number,
    join_path,
    present,
)

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
        obj = JsonObject(data, path)
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
    """200 to `GET tasks?wait=N`: the tasks taken for this host, or none after the wait.

    `cordoned` is the host's cordon as it stood when they were taken (absent with no
    tasks): a create then meets the cordon the controller placed it under, not the one
    the last heartbeat told of (issue 21 item 6: an uncordon reached the agent up to a
    heartbeat late, and the creates placed meanwhile failed "the host is cordoned").
    """

    tasks: tuple[Task, ...] = ()
    cordoned: bool | None = None

    @classmethod
    def from_json(cls, data: Any) -> TaskList:
        obj = JsonObject(data)
        items = obj.array("tasks", required=True, max_items=10_000)
        assert items is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(
            tasks=tuple(Task.from_json(t, join_path("tasks", i)) for i, t in enumerate(items)),
            cordoned=obj.boolean("cordoned"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "tasks": [t.to_json() for t in self.tasks],
            **present(cordoned=self.cordoned),
        }


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
    """`create_runner`: what to start. The one definition of the message (issue 22 item 3):
    the controller builds it (runners.actions.lifecycle), the agent reads it with `from_json`
    (its backends' RunnerSpec is made from what this read), and the fake agents use both."""

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
    dind: bool = False  # BACK-18: the pool provides Docker through a sidecar

    FIELDS = (
        "runner_id", "runner_name", "pool", "backend", "image", "command", "env", "cpus",
        "memory_mb", "ephemeral", "cpus_from", "memory_from", "dind",
    )  # fmt: skip

    @classmethod
    def from_json(
        cls, data: Any, *, runner_id: int | None = None, strict: bool = False
    ) -> CreateRunnerPayload:
        """Read a payload, each field's type checked. A key this definition does not know is
        ignored (a newer controller may send more), or refused with `strict`, which the
        controller's own test uses so that nothing it writes goes unread."""
        obj = JsonObject(data, "payload")
        if strict:
            unknown = sorted(set(obj.data) - set(cls.FIELDS))
            if unknown:
                raise ProtocolError(obj.at(unknown[0]), "is not a field of create_runner")
        rid = obj.integer("runner_id", minimum=1)
        rid = runner_id if rid is None else rid
        if rid is None:
            raise ProtocolError(obj.at("runner_id"), "is required")
        command = obj.array("command", max_items=256)
        if command is not None and not all(isinstance(a, str) for a in command):
            raise ProtocolError(obj.at("command"), "must be an array of strings")
        env = obj.object("env")
        pairs: dict[str, str] = {}
        if env is not None:
            for key, value in env.data.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    raise ProtocolError(env.at(str(key)), "must be a string")
                pairs[key] = value
        given = ("pool", "host")
        return cls(
            runner_id=rid,
            runner_name=obj.string("runner_name", max_length=200) or f"runner-{rid}",
            pool=obj.string("pool", max_length=200) or "",
            backend=obj.string("backend", max_length=32) or "process",
            image=obj.string("image", max_length=1000),
            command=None if command is None else tuple(command),
            env=pairs,
            cpus=obj.number("cpus", minimum=0.0, maximum=1e6),
            memory_mb=obj.integer("memory_mb", maximum=INT64_MAX),
            ephemeral=obj.boolean("ephemeral") is not False,
            cpus_from=obj.string("cpus_from", max_length=8, choices=given),
            memory_from=obj.string("memory_from", max_length=8, choices=given),
            dind=obj.boolean("dind") is True,
        )

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
            "dind": self.dind,
        }


def _seconds(obj: JsonObject, key: str, default: float) -> float:
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
        obj = JsonObject(data if isinstance(data, Mapping) else {}, "payload")
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
        return present(runner_id=self.runner_id, retry=self.retry)


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
        obj = JsonObject(data if isinstance(data, Mapping) else {}, "payload")
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


@dataclass(frozen=True)
class TaskResult:
    """`POST tasks/{id}/result`: whether the task worked, why not, and which delivery."""

    ok: bool
    error: str | None = None
    attempt: int | None = None
    # A host check's findings (TASK-09): at most 32 names, each a short text, number or bool.
    report: Mapping[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Any, path: str = "$") -> TaskResult:
        obj = JsonObject(data, path)
        ok = obj.boolean("ok", required=True)
        assert ok is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(
            ok=ok,
            error=obj.string("error", max_length=MAX_MESSAGE),
            attempt=obj.integer("attempt", maximum=INT32_MAX),
            report=_report(obj.object("report")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "error": self.error,
            "attempt": self.attempt,
            **present(report=None if self.report is None else dict(self.report)),
        }


def _report(obj: JsonObject | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    if len(obj.data) > 32:
        raise ProtocolError(obj.path, "must have at most 32 entries")
    out: dict[str, Any] = {}
    for key, value in obj.data.items():
        if not isinstance(key, str) or not key or len(key) > 64:
            raise ProtocolError(obj.path, "a key must be 1-64 characters")
        if isinstance(value, str):
            out[key] = clean_text(value[:500], obj.at(key))
        elif isinstance(value, bool) or (is_number(value) and math.isfinite(value)):
            out[key] = value
        else:
            raise ProtocolError(obj.at(key), "must be a string, a number or true/false")
    return out


@dataclass(frozen=True)
class TaskResultAnswer:
    accepted: bool = True

    @classmethod
    def from_json(cls, data: Any) -> TaskResultAnswer:
        accepted = JsonObject(data).boolean("accepted")
        return cls(accepted=True if accepted is None else accepted)

    def to_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted}


# At most this many results in one `POST tasks/results`: ten polls' worth of tasks.
MAX_RESULTS = 100


@dataclass(frozen=True)
class TaskResultItem:
    """One task's result among several: `TaskResult` with the task's id."""

    id: int
    result: TaskResult

    @classmethod
    def from_json(cls, data: Any, path: str) -> TaskResultItem:
        task_id = JsonObject(data, path).integer("id", required=True, minimum=1)
        assert task_id is not None  # noqa: S101  # narrows the type; required above
        return cls(id=task_id, result=TaskResult.from_json(data, path))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **self.result.to_json()}


@dataclass(frozen=True)
class TaskResultsRequest:
    """`POST tasks/results`: the results an agent has ready, recorded together (issue 28):
    one request and one transaction for a poll's worth of creates, not one each."""

    results: tuple[TaskResultItem, ...]

    @classmethod
    def from_json(cls, data: Any) -> TaskResultsRequest:
        obj = JsonObject(data)
        items = obj.array("results", required=True, max_items=MAX_RESULTS) or []
        if not items:
            raise ProtocolError(obj.at("results"), "must hold at least one result")
        path = obj.at("results")
        return cls(
            results=tuple(
                TaskResultItem.from_json(r, join_path(path, i)) for i, r in enumerate(items)
            )
        )

    def to_json(self) -> dict[str, Any]:
        return {"results": [r.to_json() for r in self.results]}


@dataclass(frozen=True)
class TaskResultOutcome:
    """What became of one result: accepted, or the status the single route would have
    answered (404: not this host's task, TASK-14; 409: no longer in flight) and why."""

    id: int
    accepted: bool
    status: int | None = None
    error: str | None = None

    @classmethod
    def from_json(cls, data: Any, path: str) -> TaskResultOutcome:
        obj = JsonObject(data, path)
        task_id = obj.integer("id", required=True, minimum=1)
        accepted = obj.boolean("accepted", required=True)
        assert task_id is not None and accepted is not None  # noqa: S101  # required above
        return cls(
            id=task_id,
            accepted=accepted,
            status=obj.integer("status", minimum=100, maximum=599),
            error=obj.string("error", max_length=MAX_MESSAGE),
        )

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "accepted": self.accepted,
                **present(status=self.status, error=self.error)}  # fmt: skip


@dataclass(frozen=True)
class TaskResultsAnswer:
    """One outcome per result, in the request's order."""

    results: tuple[TaskResultOutcome, ...]

    @classmethod
    def from_json(cls, data: Any) -> TaskResultsAnswer:
        obj = JsonObject(data)
        items = obj.array("results", required=True, max_items=MAX_RESULTS) or []
        path = obj.at("results")
        return cls(
            results=tuple(
                TaskResultOutcome.from_json(r, join_path(path, i)) for i, r in enumerate(items)
            )
        )

    def to_json(self) -> dict[str, Any]:
        return {"results": [r.to_json() for r in self.results]}
