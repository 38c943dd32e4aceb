"""The Backend interface every runner backend (process, docker, podman) implements."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


class BackendError(Exception):
    """The backend could not do what was asked; the message is shown to the operator."""


class WorkloadExists(BackendError):
    """A workload for this runner already exists; a second one must never be built (AGENT-24)."""


class WorkloadStatus(enum.StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    MISSING = "missing"


@dataclass(frozen=True)
class RunnerSpec:
    """A create_runner payload, typed (docs/agent-protocol.md)."""

    runner_id: int
    runner_name: str
    pool: str
    backend: str
    image: str | None = None
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory_mb: int | None = None
    ephemeral: bool = True

    @classmethod
    def from_payload(cls, payload: dict[str, Any], *, runner_id: int | None = None) -> RunnerSpec:
        rid = payload.get("runner_id", runner_id)
        if rid is None:
            raise BackendError("the create_runner payload names no runner_id")
        command = payload.get("command")
        if command is not None and (
            not isinstance(command, list) or not all(isinstance(a, str) for a in command)
        ):
            raise BackendError("the create_runner command must be a list of strings")
        env = payload.get("env") or {}
        if not isinstance(env, dict):
            raise BackendError("the create_runner env must be an object")
        cpus = payload.get("cpus")
        memory_mb = payload.get("memory_mb")
        return cls(
            runner_id=int(rid),
            runner_name=str(payload.get("runner_name") or f"runner-{rid}"),
            pool=str(payload.get("pool") or ""),
            backend=str(payload.get("backend") or "process"),
            image=payload.get("image"),
            command=list(command) if command is not None else None,
            env={str(k): str(v) for k, v in env.items()},
            cpus=float(cpus) if cpus is not None else None,
            memory_mb=int(memory_mb) if memory_mb is not None else None,
            ephemeral=bool(payload.get("ephemeral", True)),
        )


@dataclass(frozen=True)
class Handle:
    """What create returns: the runner it is for and the backend's own reference to it."""

    runner_id: int
    ref: str


@dataclass(frozen=True)
class Workload:
    """A runner's workload as the backend sees it, labelled with the runner's id."""

    runner_id: int
    status: WorkloadStatus
    exit_code: int | None = None
    runner_name: str | None = None
    pool: str | None = None
    started_at: float | None = None
    # Where the operator can read the runner's output; named in a failed runner's message.
    log_ref: str | None = None


@dataclass(frozen=True)
class HostSize:
    """How much machine the runners on this backend share (HOST-07)."""

    cpus: float
    memory_mb: int
    platform: str


class Backend(ABC):
    """Starts, inspects, stops and removes runner workloads on this host.

    Every method is safe to call from several threads. Workloads are labelled with their
    runner id, so `list` after an agent restart is what adoption (AGENT-23) reads.
    """

    name: str

    @abstractmethod
    def create(self, spec: RunnerSpec) -> Handle:
        """Start the runner; raise WorkloadExists if one exists for spec.runner_id."""

    @abstractmethod
    def inspect(self, runner_id: int) -> Workload:
        """The workload's status; MISSING when there is none."""

    @abstractmethod
    def list(self) -> list[Workload]:
        """Every workload this backend manages, running or exited."""

    @abstractmethod
    def stop(self, runner_id: int, timeout: float, grace: float = 0.0) -> None:
        """Wait up to `grace` seconds for the workload to exit on its own (a draining runner
        finishing its job, RUN-11), then ask politely, wait up to `timeout` seconds, then
        force. A missing or already exited workload is fine."""

    @abstractmethod
    def remove(self, runner_id: int) -> None:
        """Delete the workload and everything made for it. A missing workload is fine."""

    @abstractmethod
    def logs(self, runner_id: int) -> bytes:
        """The runner's output so far."""

    @abstractmethod
    def probe(self) -> HostSize:
        """The host's size as this backend sees it."""
