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

from fleet import protocol
from fleet.agent.memory_valve import MemoryUse


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
        """The backends' view of a create_runner payload, read by the message's one
        definition (protocol.CreateRunnerPayload); a field of the wrong type is refused."""
        try:
            read = protocol.CreateRunnerPayload.from_json(payload, runner_id=runner_id)
        except protocol.ProtocolError as exc:
            raise BackendError(f"the create_runner payload is unusable: {exc}") from None
        return cls(
            runner_id=read.runner_id,
            runner_name=read.runner_name,
            pool=read.pool,
            backend=read.backend,
            image=read.image,
            command=None if read.command is None else list(read.command),
            env=dict(read.env),
            cpus=read.cpus,
            memory_mb=read.memory_mb,
            ephemeral=read.ephemeral,
            cpus_from=read.cpus_from,
            memory_from=read.memory_from,
            dind=read.dind,
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

    def apply_cpu_factor(self, runner_id: int, factor: float) -> int:
        """HOST-20: run the runner's containers at `factor` times the CPUs each was given,
        idempotently; answers how many it changed. This default limits nothing (a process
        runner has no quota to scale)."""
        return 0

    def memory_use(self, runner_id: int) -> MemoryUse | None:
        """The runner's memory use and limit as its engine reports them (HOST-12's sample
        for the memory valve); None where there is no limit to raise (this default: a
        process runner)."""
        return None

    def raise_memory(self, runner_id: int, limit_mb: int) -> None:
        """Raise the runner's memory limit to `limit_mb` in place (HOST-27); only ever
        called with a higher figure. This default has no limit to raise."""
        raise BackendError(f"runner {runner_id}: this backend has no memory limit to raise")

    def close(self) -> None:
        """Let go of what the backend holds open (the agent is stopping); its workloads
        carry on. This default holds nothing."""
        return

    # builtins.list: inside the class `list` is the method above.
    def prewarm(self, image: str | None, *, dind: bool = False) -> builtins.list[str]:
        """Prepare, ahead of any create, what a runner of `image` needs (AGENT-14); answers
        what it prepared. This default has nothing to prepare: a backend with images
        overrides it."""
        return []
