"""The Backend interface every runner backend (process, docker, podman) implements."""

from __future__ import annotations

import builtins
import contextlib
import enum
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
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
    # BACK-09: who gave cpus / memory_mb, as the controller wrote it on the runner's row:
    # "pool" or "host"; None from a controller that does not say.
    cpus_from: str | None = None
    memory_from: str | None = None
    dind: bool = False  # BACK-18: the pool provides Docker through a sidecar

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
            cpus_from=_given_by(payload.get("cpus_from")),
            memory_from=_given_by(payload.get("memory_from")),
            dind=payload.get("dind") is True,
        )


def _given_by(value: Any) -> str | None:
    return value if value in ("pool", "host") else None


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
    # The end of an exited runner's output, for a backend that deletes it with the workload.
    output_tail: str | None = None


@dataclass(frozen=True)
class HostSize:
    """How much machine the runners on this backend share (HOST-07)."""

    cpus: float
    memory_mb: int
    platform: str

    @property
    def limits(self) -> tuple[str, ...]:
        """BACK-03: the resource limits ("cpus", "memory") this backend can apply to a
        runner; none unless its engine says so."""
        return ()


class LogFollow:
    """A runner's output from its start, then as it comes, until the workload ends: an
    iterable of byte pieces that another thread may `close` (LOG-02, LOG-04)."""

    def __init__(self, pieces: Iterable[bytes], on_close: Callable[[], None] | None = None) -> None:
        self._pieces = pieces
        self._on_close = on_close
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._pieces:
            if self.closed.is_set():
                return
            if piece:
                yield piece

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        if self._on_close is not None:
            with contextlib.suppress(Exception):  # closing a dead stream is still closing
                self._on_close()


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

    def follow_logs(self, runner_id: int) -> LogFollow:
        """The runner's output from the start, then as it comes, until it ends (LOG-02).
        This default is what `logs` holds now, once; a backend that can follow overrides it."""
        return LogFollow([self.logs(runner_id)])

    @abstractmethod
    def probe(self) -> HostSize:
        """The host's size as this backend sees it."""

    # builtins.list: inside the class `list` is the method above.
    def prewarm(self, image: str | None, *, dind: bool = False) -> builtins.list[str]:
        """Prepare, ahead of any create, what a runner of `image` needs (AGENT-14); answers
        what it prepared. This default has nothing to prepare: a backend with images
        overrides it."""
        return []
