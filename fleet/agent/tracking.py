"""What the agent's loops share: the runners it tracks, their adoption, the stop flag.

`AgentParts` is the base of the agent's loops (fleet/agent/tasks.py, reconcile.py) and of
`fleet.agent.agent.Agent`, which sets every attribute named here in its `__init__`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fleet import protocol
from fleet.agent.admission import FifoSlot, StartHold
from fleet.agent.backends.base import Backend, BackendError, Workload, WorkloadStatus
from fleet.agent.backends.exits import CONTAINER_BACKENDS, exit_sentence
from fleet.agent.client import ControllerClient
from fleet.agent.state import StateError, StateStore

log = logging.getLogger("fleet.agent")

Clock = Callable[[], float]
# wait(seconds) sleeps up to `seconds` and answers whether the loop should end.
Wait = Callable[[float], bool]


@dataclass
class TrackedRunner:
    """What the agent remembers about one runner's workload, in memory only (AGENT-21)."""

    runner_id: int
    backend: str
    created_at: float  # agent clock: when created, or an adopted workload's own start
    adopted: bool
    registering_due: bool = False  # a create succeeded and the controller has not heard it
    registering_sent: bool = False
    phase_sent: str | None = None
    stopped_by_agent: bool = False
    end: protocol.RunnerReport | None = None  # the end report, decided once (RUN-17)
    end_acked_at: float | None = None  # when the controller accepted (or refused) the end
    workload_gone: bool = False  # nothing left on the host to delete


def report(
    runner_id: int, state: str | None, phase: str, exit_code: int | None, message: str | None
) -> protocol.RunnerReport:
    if message is not None and len(message) > protocol.MAX_MESSAGE:
        message = message[: protocol.MAX_MESSAGE - 1] + "…"
    return protocol.RunnerReport(runner_id, state, phase, exit_code, message)


def end_report(tracked: TrackedRunner, workload: Workload) -> protocol.RunnerReport:
    """How an exited workload ended (RUN-15, RUN-17): removed for code 0, failed otherwise."""
    rid = tracked.runner_id
    code = workload.exit_code
    where = f"; its output is in {workload.log_ref}" if workload.log_ref else ""
    stopped = " after the agent stopped it" if tracked.stopped_by_agent else ""
    tail = workload.output_tail
    if tail is not None:
        # The output goes with the workload: the runner's row keeps its end instead, for a
        # clean exit as for a failure.
        tail = tail[-protocol.MAX_OUTPUT_TAIL :]
        where = "; the end of its output is kept with the runner"
    if code == 0:
        ended = report(rid, "removed", "exited", 0, f"the runner exited with code 0{stopped}")
        return replace(ended, output_tail=tail)
    # BACK-14: the runner image's own 69 and 78 are said as what they mean.
    sentence = (
        exit_sentence(code, workload.log_ref) if tracked.backend in CONTAINER_BACKENDS else None
    )
    if sentence is not None:
        message = sentence + ("; the end of its output is kept with the runner" if tail else "")
    elif code is None:
        message = f"the runner ended without recording an exit code{stopped}{where}"
    else:
        message = f"the runner exited with code {code}{stopped}{where}"
    return replace(report(rid, "failed", "exited", code, message), output_tail=tail)


class AgentParts:
    """The state the agent's loops share (set by `Agent.__init__`), adoption and stopping."""

    backends: dict[str, Backend]
    client: ControllerClient
    work_dir: Path
    store: StateStore
    tunables: protocol.AgentTunables
    _finished_retention: float | None  # the operator's, which outranks the controller's
    cordoned: bool
    cordon_from_tasks_at: float | None  # when a task list last set `cordoned` (agent clock)
    polls_completed: int
    fatal_error: str | None
    _clock: Clock
    _sleep: Callable[[float], None]
    _lock: threading.RLock
    _tracked: dict[int, TrackedRunner]
    _first_seen: dict[tuple[str, int], float]  # orphans, by (backend, runner)
    _orphans_listed_at: float | None
    _waiting_creates: set[int]
    _superseded: set[int]
    _inflight: set[threading.Thread]
    _admission: FifoSlot
    _start_hold: StartHold
    _pause: Wait
    _stopping: threading.Event
    _wake_reconcile: threading.Event
    _token_renew_at: float | None  # set for a short-lived token (ESC-06)

    @property
    def finished_retention(self) -> float:
        """AGENT-18: how long a finished workload stays after its end was acknowledged."""
        if self._finished_retention is not None:
            return float(self._finished_retention)
        return self.tunables.finished_retention

    # -- adoption (AGENT-23, AGENT-24) ----------------------------------------------------

    def adopt_existing(self) -> list[int]:
        """List every backend and adopt each workload labelled with a runner id."""
        return self.take_inventory()[0]

    def take_inventory(self) -> tuple[list[int], bool]:
        """`adopt_existing`, and whether every backend could be listed (a backend that
        could not be is no proof that its workloads are gone)."""
        adopted = []
        complete = True
        for name, backend in self.backends.items():
            try:
                workloads = backend.list()
            except (BackendError, OSError) as exc:
                log.error("cannot list the %s backend's workloads: %s", name, exc)
                complete = False
                continue
            for workload in workloads:
                self._track_adopted(workload, name)
                adopted.append(workload.runner_id)
        if adopted:
            log.info("adopted runners %s", sorted(adopted))
        return adopted, complete

    def expect(self, runners: Sequence[protocol.ExpectedRunner]) -> None:
        """Watch the runners the controller says this host holds (its inventory answer) as
        if this agent had made them `age` seconds ago: one whose workload is not here is
        reported missing once that is a minute old (AGENT-17), one still provisioning is
        reported registering once its workload is seen (RUN-15)."""
        now = self._clock()
        with self._lock:
            for expected in runners:
                tracked = self._tracked.get(expected.runner_id)
                if tracked is None:
                    # A backend this host does not offer holds nothing: any other answers
                    # that it is missing, which is the truth.
                    name = expected.backend
                    if name not in self.backends:
                        name = next(iter(self.backends))
                    tracked = TrackedRunner(
                        runner_id=expected.runner_id,
                        backend=name,
                        created_at=now - expected.age,
                        adopted=True,
                    )
                    self._tracked[expected.runner_id] = tracked
                if expected.state == "provisioning" and not tracked.registering_sent:
                    tracked.registering_due = tracked.end is None

    def _adopt(self, runner_id: int, backend_name: str | None = None) -> TrackedRunner | None:
        names = [backend_name] if backend_name in self.backends else list(self.backends)
        for name in names:
            assert name is not None  # noqa: S101  # narrows the type; the code above guarantees it
            workload = self.backends[name].inspect(runner_id)
            if workload.status != WorkloadStatus.MISSING:
                return self._track_adopted(workload, name)
        return None

    def _track_adopted(self, workload: Workload, backend_name: str) -> TrackedRunner:
        with self._lock:
            tracked = self._tracked.get(workload.runner_id)
            if tracked is None:
                # HOST-22: an adopted workload's bootstrap grace counts from its original
                # start (the engine's wall-clock figure), not from when this agent saw it.
                age = 0.0
                if workload.started_at is not None:
                    age = max(0.0, time.time() - workload.started_at)
                tracked = TrackedRunner(
                    runner_id=workload.runner_id,
                    backend=backend_name,
                    created_at=self._clock() - age,
                    adopted=True,
                )
                self._tracked[workload.runner_id] = tracked
            self._first_seen.pop((backend_name, workload.runner_id), None)
            return tracked

    @property
    def tracked(self) -> dict[int, TrackedRunner]:
        with self._lock:
            return dict(self._tracked)

    # -- stopping -------------------------------------------------------------------------

    def _fatal(self, exc: Exception) -> None:
        """401: the host was deleted or joined again elsewhere. Stop; do not rejoin."""
        with self._lock:
            if self.fatal_error is not None:
                return
            if self._token_renew_at is not None:  # ESC-06: a token minted from a claim code
                self.fatal_error = (
                    f"the controller no longer accepts this agent's short-lived token ({exc}); "
                    "it expired unrenewed, or the host was deleted or joined again elsewhere. "
                    "The agent stops; this machine needs a new claim code to join again"
                )
            else:
                self.fatal_error = (
                    f"the controller no longer accepts this agent's token ({exc}); the host "
                    "was deleted or joined again elsewhere. The agent stops; to join again, "
                    "set ZOOMIES_JOIN_TOKEN to a new join token and start it"
                )
        log.error("%s", self.fatal_error)
        try:
            # The spent hashes stay, so the old token in the environment is not offered again.
            state = self.store.load()
            state.forget_credentials()
            self.store.save(state)
        except StateError as state_exc:
            log.error("could not clear the credentials in agent.json: %s", state_exc)
        self.request_stop()

    def request_stop(self) -> None:
        """Only sets the flags, so it is safe from a signal handler; the loops see them and stop."""
        self._stopping.set()
        self._wake_reconcile.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()
