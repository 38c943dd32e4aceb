"""The agent: joins, heartbeats, long-polls for tasks, runs them, and reports its runners.

Each loop is a `*_once` step plus a thin loop around it, so tests drive the steps with a
chosen clock and never sleep through a grace period (STYLE 9).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.agent import AGENT_VERSION
from fleet.agent.admission import FifoSlot
from fleet.agent.backends.base import (
    Backend,
    BackendError,
    RunnerSpec,
    Workload,
    WorkloadExists,
    WorkloadStatus,
)
from fleet.agent.client import ControllerClient, ControllerError, Task, Unauthorized
from fleet.agent.errors import AgentError
from fleet.agent.host import UsageSampler, work_dir_space
from fleet.agent.state import AgentState, JoinTokenSpent, StateError, StateStore

log = logging.getLogger("fleet.agent")

POLL_WAIT = 25  # seconds the controller may hold a task long-poll
RECONCILE_INTERVAL = 2.0
DEFAULT_HEARTBEAT_INTERVAL = 30.0  # until the controller says otherwise (HOST-01)
ORPHAN_GRACE = 120.0  # AGENT-16: an unclaimed workload is removed this long after first seen
MISSING_GRACE = 60.0  # AGENT-17: a new runner the backend does not list yet is not gone
SHUTDOWN_GRACE = 30.0  # AGENT-19: how long shutdown waits for tasks in flight
MAX_BACKOFF = 30.0
RESULT_ATTEMPTS = 3
# stop_runner (docs/agent-protocol.md): `grace` to exit on its own, then SIGTERM, then
# SIGKILL `timeout` later. The controller sends both; these are for a payload without them.
DEFAULT_STOP_GRACE = 0.0
DEFAULT_STOP_TIMEOUT = 30.0

Clock = Callable[[], float]
# wait(seconds) sleeps up to `seconds` and answers whether the loop should end.
Wait = Callable[[float], bool]


@dataclass
class TrackedRunner:
    """What the agent remembers about one runner's workload, in memory only (AGENT-21)."""

    runner_id: int
    backend: str
    created_at: float  # agent clock: when created or first adopted
    adopted: bool
    registering_due: bool = False  # a create succeeded and the controller has not heard it
    registering_sent: bool = False
    phase_sent: str | None = None
    stopped_by_agent: bool = False
    end: dict[str, Any] | None = None  # the end report, decided once (RUN-17)
    end_acked_at: float | None = None  # when the controller accepted (or refused) the end
    workload_gone: bool = False  # nothing left on the host to delete


class Agent:
    """One host's agent: a plain HTTP client of the controller (ARCH-05, ARCH-07).

    `run()` starts the heartbeat, task and reconcile loops; tests call `connect`,
    `adopt_existing`, `heartbeat_once`, `poll_once` and `reconcile_once` directly.
    """

    def __init__(
        self,
        controller_url: str,
        state_dir: Path | str,
        work_dir: Path | str,
        backends: Sequence[Backend] | Mapping[str, Backend],
        name: str,
        capacity: int,
        *,
        clock: Clock = time.time,
        join_token: str | None = None,
        labels: Mapping[str, str] | None = None,
        finished_retention: float = 0.0,
        client: ControllerClient | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.controller_url = controller_url.rstrip("/")
        self.state_dir = Path(state_dir)
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if isinstance(backends, Mapping):
            self.backends: dict[str, Backend] = dict(backends)
        else:
            self.backends = {b.name: b for b in backends}
        if not self.backends:
            raise AgentError("the agent needs at least one backend")
        self.name = name
        self.capacity = int(capacity)
        self.labels = dict(labels or {})
        self.finished_retention = float(finished_retention)
        self.join_token = join_token or None
        self.store = StateStore(self.state_dir)
        self.client = client or ControllerClient(self.controller_url)
        self._clock = clock
        self._sleep = sleep
        self._usage = UsageSampler()

        self.host_id: int | None = None
        self.heartbeat_interval = DEFAULT_HEARTBEAT_INTERVAL
        self.cordoned = False
        self.polls_completed = 0
        self.fatal_error: str | None = None

        self._lock = threading.RLock()
        self._tracked: dict[int, TrackedRunner] = {}
        self._first_seen: dict[tuple[str, int], float] = {}  # orphans, by (backend, runner)
        self._waiting_creates: set[int] = set()
        self._superseded: set[int] = set()
        self._inflight: set[threading.Thread] = set()
        self._admission = FifoSlot()
        self._stopping = threading.Event()
        self._wake_reconcile = threading.Event()
        self._shut_down = False

    # -- credentials ----------------------------------------------------------------------

    def connect(self) -> None:
        """Use agent.json's credentials, or join with the join token (AGENT-21, AGENT-22)."""
        try:
            state = self.store.load()
        except StateError as exc:
            raise AgentError(str(exc)) from exc
        if state.has_credentials_for(self.controller_url):
            self._use_credentials(state)
            return
        if not self.join_token:
            if state.host_id is not None and state.agent_token:
                raise AgentError(
                    f"{self.store.path} holds credentials for {state.controller_url}, not "
                    f"{self.controller_url}; set ZOOMIES_JOIN_TOKEN to join {self.controller_url}"
                )
            raise AgentError(
                "this host has not joined a controller yet: set ZOOMIES_JOIN_TOKEN to a join "
                "token from the controller's Hosts page"
            )
        if state.is_spent(self.join_token):
            raise JoinTokenSpent(
                "ZOOMIES_JOIN_TOKEN holds a join token this host has already spent (its hash is "
                f"in {self.store.path}); join tokens are single-use, so ask the controller for "
                "a new one"
            )
        info = {"name": self.name, **self.host_info()}
        try:
            answer = self.client.join(self.join_token, info)
        except Unauthorized as exc:
            raise AgentError(
                f"the controller refused the join token (unknown, expired or spent): {exc}"
            ) from exc
        state.host_id = answer.host_id
        state.agent_token = answer.agent_token
        state.controller_url = self.controller_url
        state.spend(self.join_token)
        self.store.save(state)
        self.heartbeat_interval = _sane_interval(answer.heartbeat_interval)
        log.info("joined %s as host %s", self.controller_url, answer.host_id)
        self._use_credentials(state)

    def _use_credentials(self, state: AgentState) -> None:
        self.host_id = state.host_id
        self.client.agent_token = state.agent_token

    def _fatal(self, exc: Exception) -> None:
        """401: the host was deleted or joined again elsewhere. Stop; do not rejoin."""
        with self._lock:
            if self.fatal_error is not None:
                return
            self.fatal_error = (
                f"the controller no longer accepts this agent's token ({exc}); the host was "
                "deleted or joined again elsewhere. The agent stops; to join again, set "
                "ZOOMIES_JOIN_TOKEN to a new join token and start it"
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

    # -- what the host is -----------------------------------------------------------------

    def host_info(self) -> dict[str, Any]:
        """The join/heartbeat fields describing this host (HOST-07, HOST-08)."""
        info: dict[str, Any] = {
            "backends": list(self.backends),
            "capacity": self.capacity,
            "labels": dict(self.labels),
            "version": AGENT_VERSION,
        }
        # The first backend's answer is the host's size: a daemon's view beats our cgroup's.
        try:
            size = next(iter(self.backends.values())).probe()
            info.update(platform=size.platform, cpus=size.cpus, memory_mb=size.memory_mb)
        except (BackendError, OSError) as exc:
            log.warning("cannot probe the host's size: %s", exc)
        space = work_dir_space(self.work_dir)
        if space is not None:
            info.update(disk_total_mb=space.total_mb, disk_free_mb=space.free_mb)
        return info

    # -- adoption (AGENT-23, AGENT-24) ----------------------------------------------------

    def adopt_existing(self) -> list[int]:
        """List every backend and adopt each workload labelled with a runner id."""
        adopted = []
        for name, backend in self.backends.items():
            try:
                workloads = backend.list()
            except (BackendError, OSError) as exc:
                log.error("cannot list the %s backend's workloads: %s", name, exc)
                continue
            for workload in workloads:
                self._track_adopted(workload, name)
                adopted.append(workload.runner_id)
        if adopted:
            log.info("adopted runners %s", sorted(adopted))
        return adopted

    def _adopt(self, runner_id: int, backend_name: str | None = None) -> TrackedRunner | None:
        names = [backend_name] if backend_name in self.backends else list(self.backends)
        for name in names:
            assert name is not None
            workload = self.backends[name].inspect(runner_id)
            if workload.status != WorkloadStatus.MISSING:
                return self._track_adopted(workload, name)
        return None

    def _track_adopted(self, workload: Workload, backend_name: str) -> TrackedRunner:
        with self._lock:
            tracked = self._tracked.get(workload.runner_id)
            if tracked is None:
                tracked = TrackedRunner(
                    runner_id=workload.runner_id,
                    backend=backend_name,
                    created_at=self._clock(),
                    adopted=True,
                )
                self._tracked[workload.runner_id] = tracked
            self._first_seen.pop((backend_name, workload.runner_id), None)
            return tracked

    @property
    def tracked(self) -> dict[int, TrackedRunner]:
        with self._lock:
            return dict(self._tracked)

    # -- heartbeat (HOST-01) --------------------------------------------------------------

    def heartbeat_once(self) -> float:
        """Send one heartbeat; answer the interval to sleep before the next."""
        body = self.host_info()
        body["usage"] = self._usage.sample()
        answer = self.client.heartbeat(body)
        with self._lock:
            self.heartbeat_interval = _sane_interval(answer.heartbeat_interval)
            self.cordoned = answer.cordoned
            return self.heartbeat_interval

    def heartbeat_loop(self, wait: Wait | None = None) -> None:
        wait = wait or self._stopping.wait
        backoff = 1.0
        while not self._stopping.is_set():
            try:
                interval = self.heartbeat_once()
                backoff = 1.0
            except Unauthorized as exc:
                self._fatal(exc)
                return
            except Exception as exc:  # a bug must not end the heartbeat for good
                log.warning(
                    "heartbeat failed: %s", exc, exc_info=not isinstance(exc, ControllerError)
                )
                interval = min(backoff, self.heartbeat_interval)
                backoff = min(backoff * 2, MAX_BACKOFF)
            if wait(interval):
                return

    # -- tasks ----------------------------------------------------------------------------

    def poll_once(self, wait: float = POLL_WAIT, *, block: bool = True) -> list[Task]:
        """Take the tasks waiting for this host and start each on a thread of its own.

        With block=True it returns once they have all finished and posted their results.
        """
        if self._stopping.is_set():
            return []
        tasks = self.client.poll_tasks(wait)
        started = []
        with self._lock:
            self.polls_completed += 1
        for task in tasks:
            if self._stopping.is_set():
                # AGENT-19: no new task; its lease ends and the controller offers it again.
                log.info("shutting down: task %s is left for redelivery", task.id)
                continue
            ticket = None
            with self._lock:
                if task.kind == "create_runner" and task.runner_id is not None:
                    # AGENT-02: the place in the queue is the order the tasks arrived in.
                    ticket = self._admission.ticket()
                    self._waiting_creates.add(task.runner_id)
                elif task.runner_id in self._waiting_creates:
                    # AGENT-06: the create still waiting for the slot must not start.
                    self._superseded.add(task.runner_id)
                thread = threading.Thread(
                    target=self._run_task,
                    args=(task, ticket),
                    name=f"agent-task-{task.id}",
                    daemon=True,
                )
                self._inflight.add(thread)
            self._admission.wake()
            thread.start()
            started.append(thread)
        if block:
            for thread in started:
                thread.join()
        return tasks

    def wait_for_tasks(self, timeout: float | None = None) -> bool:
        """Wait for the tasks in flight; True when none is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                threads = list(self._inflight)
            if not threads:
                return True
            for thread in threads:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(remaining)
            if deadline is not None and time.monotonic() >= deadline:
                with self._lock:
                    return not self._inflight

    def poll_loop(self, wait: float = POLL_WAIT, pause: Wait | None = None) -> None:
        pause = pause or self._stopping.wait
        backoff = 1.0
        while not self._stopping.is_set():
            try:
                self.poll_once(wait, block=False)
                backoff = 1.0
            except Unauthorized as exc:
                self._fatal(exc)
                return
            except Exception as exc:  # a closed client at shutdown, or a bug: back off
                if self._stopping.is_set():
                    return
                log.warning(
                    "task poll failed: %s", exc, exc_info=not isinstance(exc, ControllerError)
                )
                if pause(backoff):
                    return
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _run_task(self, task: Task, ticket: int | None = None) -> None:
        try:
            try:
                ok, error, answer = self._execute(task, ticket)
            except Unauthorized as exc:
                self._fatal(exc)
                return
            except Exception as exc:  # a task must always be answered, whatever broke
                log.exception("task %s (%s) failed", task.id, task.kind)
                ok, error, answer = False, f"{type(exc).__name__}: {exc}", True
            if answer:
                self._post_result(task, ok, error)
        finally:
            with self._lock:
                self._inflight.discard(threading.current_thread())

    def _execute(self, task: Task, ticket: int | None) -> tuple[bool, str | None, bool]:
        """(ok, error, whether to answer at all) for one task."""
        rid = task.runner_id
        if task.kind == "create_runner" and rid is not None and ticket is not None:
            return self._create(task, rid, ticket)
        if rid is None:
            return False, f"the {task.kind} task names no runner", True
        with self._lock:
            known = rid in self._tracked
        if not known:
            self._adopt(rid)  # AGENT-24
        if task.kind == "stop_runner":
            return self._stop(task, rid)
        if task.kind == "remove_runner":
            return self._remove(rid)
        return False, f"this agent does not know the task kind {task.kind!r}", True

    def _create(self, task: Task, rid: int, ticket: int) -> tuple[bool, str | None, bool]:
        admitted = settled = False
        try:
            try:
                spec = RunnerSpec.from_payload(task.payload, runner_id=rid)
            except (BackendError, TypeError, ValueError) as exc:
                return False, f"the create_runner payload is unusable: {exc}", True
            backend = self.backends.get(spec.backend)
            if backend is None:
                offered = ", ".join(self.backends)
                return (
                    False,
                    f"this host has no {spec.backend!r} backend (it offers {offered})",
                    True,
                )
            admitted = self._admission.acquire(
                ticket, give_up=lambda: self._stopping.is_set() or rid in self._superseded
            )
            settled = True
            with self._lock:
                self._waiting_creates.discard(rid)
                superseded = rid in self._superseded
                self._superseded.discard(rid)
            if not admitted:
                if superseded:
                    return False, "skipped: a stop or remove for this runner arrived first", True
                # AGENT-07: shutdown cancels a waiting create; the controller offers it again.
                return False, None, False
            return self._create_admitted(spec, backend)
        finally:
            with self._lock:
                self._waiting_creates.discard(rid)
            if admitted:
                self._admission.release()
            elif not settled:
                # A create that never queued must not hold up the ones behind its ticket.
                self._admission.abandon(ticket)
            self._wake_reconcile.set()

    def _create_admitted(self, spec: RunnerSpec, backend: Backend) -> tuple[bool, str | None, bool]:
        """Holding the host's one create slot (AGENT-01)."""
        rid = spec.runner_id
        if self.cordoned:  # AGENT-08: checked again at the front of the queue
            return False, "the host is cordoned", True
        with self._lock:
            existing = self._tracked.get(rid)
        if existing is None:
            existing = self._adopt(rid, spec.backend)  # AGENT-24
        if existing is not None:
            # A redelivered create: the workload exists, so never build a second one.
            with self._lock:
                if not existing.registering_sent and existing.end is None:
                    existing.registering_due = True
            return True, None, True
        try:
            backend.create(spec)
        except WorkloadExists:
            self._adopt(rid, spec.backend)
            return True, None, True
        except BackendError as exc:
            return False, str(exc), True  # RUN-14: the runner fails with this message
        with self._lock:
            self._tracked[rid] = TrackedRunner(
                runner_id=rid,
                backend=spec.backend,
                created_at=self._clock(),
                adopted=False,
                registering_due=True,
            )
        log.info("started runner %s (%s)", rid, spec.runner_name)
        return True, None, True

    def _stop(self, task: Task, rid: int) -> tuple[bool, str | None, bool]:
        with self._lock:
            tracked = self._tracked.get(rid)
            if tracked is None:
                return True, None, True  # nothing on this host to stop
            tracked.stopped_by_agent = True
        grace = _seconds(task.payload.get("grace"), DEFAULT_STOP_GRACE)
        timeout = _seconds(task.payload.get("timeout"), DEFAULT_STOP_TIMEOUT)
        try:
            self.backends[tracked.backend].stop(rid, timeout, grace=grace)
        except BackendError as exc:
            return False, str(exc), True
        self._wake_reconcile.set()
        return True, None, True

    def _remove(self, rid: int) -> tuple[bool, str | None, bool]:
        with self._lock:
            tracked = self._tracked.get(rid)
        names = [tracked.backend] if tracked else list(self.backends)
        if tracked is not None:
            workload = self.backends[tracked.backend].inspect(rid)
            with self._lock:
                if tracked.end is None:
                    # The end is still owed: say how it ended, or that it was removed alive.
                    if workload.status == WorkloadStatus.EXITED:
                        tracked.end = self._end_report(tracked, workload)
                    else:
                        tracked.end = _report(
                            rid, "removed", "missing", None, "removed at the controller's request"
                        )
        try:
            for name in names:
                self.backends[name].remove(rid)
        except BackendError as exc:
            return False, str(exc), True
        with self._lock:
            if tracked is not None:
                tracked.workload_gone = True
                if tracked.end_acked_at is not None:
                    self._tracked.pop(rid, None)
        self._wake_reconcile.set()
        return True, None, True

    def _post_result(self, task: Task, ok: bool, error: str | None) -> None:
        delay = 1.0
        for attempt in range(RESULT_ATTEMPTS):
            try:
                accepted = self.client.post_result(
                    task.id, ok=ok, error=error, attempt=task.attempt
                )
            except Unauthorized as exc:
                self._fatal(exc)
                return
            except ControllerError as exc:
                log.warning("posting task %s's result failed: %s", task.id, exc)
                if attempt + 1 < RESULT_ATTEMPTS:
                    self._sleep(delay)
                    delay *= 2
                continue
            if not accepted:
                log.info("task %s's result was not accepted (no longer in flight)", task.id)
            return
        # The lease will end and the task come back; handling it again is idempotent.
        log.error("gave up posting task %s's result; it will be redelivered", task.id)

    # -- reconcile (RUN-15, RUN-17, AGENT-16..18) -----------------------------------------

    def reconcile_once(self, now: float | None = None, *, final: bool = False) -> bool:
        """Inspect every tracked runner, send what the controller has not heard, delete
        finished workloads the controller acknowledged and reap unclaimed ones.

        `final` is shutdown's last report: every live phase again, and nothing deleted.
        Answers whether anything is still waiting to be sent or deleted.
        """
        now = self._clock() if now is None else now
        with self._lock:
            runners = list(self._tracked.values())
        observed: dict[int, Workload] = {}
        for tracked in runners:
            if tracked.end is None and not tracked.workload_gone:
                try:
                    observed[tracked.runner_id] = self.backends[tracked.backend].inspect(
                        tracked.runner_id
                    )
                except (BackendError, OSError) as exc:
                    log.warning("cannot inspect runner %s: %s", tracked.runner_id, exc)

        outgoing: list[tuple[TrackedRunner, str, dict[str, Any]]] = []
        with self._lock:
            for tracked in runners:
                if self._tracked.get(tracked.runner_id) is not tracked:
                    continue  # removed meanwhile
                if tracked.end_acked_at is not None:
                    continue
                workload = observed.get(tracked.runner_id)
                if tracked.end is None and workload is not None:
                    outgoing.extend(self._observe(tracked, workload, now, final))
                if tracked.end is not None:
                    outgoing.append((tracked, "end", tracked.end))

        answer = None
        if outgoing:
            try:
                answer = self.client.post_reports([body for _, _, body in outgoing])
            except Unauthorized:
                raise
            except ControllerError as exc:
                # Nothing is marked sent, so the next pass says it all again.
                log.warning("sending runner reports failed: %s", exc)
        if answer is not None:
            with self._lock:
                for tracked, kind, body in outgoing:
                    rid = tracked.runner_id
                    if kind == "registering":
                        tracked.registering_due = False
                        tracked.registering_sent = True
                    elif kind == "phase":
                        tracked.phase_sent = body["phase"]
                    elif rid in answer.accepted or rid in answer.refused:
                        # A refusal is final too (RUN-18): nobody will ever accept it.
                        tracked.end_acked_at = now
                    if rid in answer.refused:
                        log.warning("the controller refused the report about runner %s", rid)
        if final:
            return False
        deleting = self._delete_finished(now)
        self._reap_orphans(now)
        with self._lock:
            return deleting or any(t.end is not None for t in self._tracked.values())

    def _observe(
        self, tracked: TrackedRunner, workload: Workload, now: float, final: bool
    ) -> list[tuple[TrackedRunner, str, dict[str, Any]]]:
        """The reports one inspected workload calls for; decides its end at most once."""
        rid = tracked.runner_id
        out: list[tuple[TrackedRunner, str, dict[str, Any]]] = []
        if workload.status == WorkloadStatus.MISSING:
            if now - tracked.created_at < MISSING_GRACE:
                return out  # AGENT-17: the backend may not list it yet
            tracked.workload_gone = True
            tracked.end = _report(
                rid, "failed", "missing", None, f"runner {rid}'s workload disappeared from the host"
            )
            return out
        phase = workload.status.value
        if tracked.registering_due:
            # Its own report, before the phase, so registering lands first (RUN-15, RUN-16).
            out.append((tracked, "registering", _report(rid, "registering", phase, None, None)))
        elif workload.status == WorkloadStatus.RUNNING and (tracked.phase_sent != phase or final):
            out.append((tracked, "phase", _report(rid, None, phase, None, None)))
        if workload.status == WorkloadStatus.EXITED:
            tracked.end = self._end_report(tracked, workload)
        return out

    def _end_report(self, tracked: TrackedRunner, workload: Workload) -> dict[str, Any]:
        rid = tracked.runner_id
        code = workload.exit_code
        where = f"; its output is in {workload.log_ref}" if workload.log_ref else ""
        stopped = " after the agent stopped it" if tracked.stopped_by_agent else ""
        if code == 0:
            return _report(rid, "removed", "exited", 0, f"the runner exited with code 0{stopped}")
        if code is None:
            message = f"the runner ended without recording an exit code{stopped}{where}"
        else:
            message = f"the runner exited with code {code}{stopped}{where}"
        return _report(rid, "failed", "exited", code, message)

    def _delete_finished(self, now: float) -> bool:
        """AGENT-18: only after the end was acknowledged and the retention has passed."""
        with self._lock:
            finished = [t for t in self._tracked.values() if t.end_acked_at is not None]
        waiting = False
        for tracked in finished:
            acked_at = tracked.end_acked_at or 0.0
            if now < acked_at + self.finished_retention:
                waiting = True
                continue
            if not tracked.workload_gone:
                try:
                    self.backends[tracked.backend].remove(tracked.runner_id)
                except (BackendError, OSError) as exc:
                    log.warning("cannot delete runner %s: %s", tracked.runner_id, exc)
                    waiting = True
                    continue
            with self._lock:
                if self._tracked.get(tracked.runner_id) is tracked:
                    del self._tracked[tracked.runner_id]
        return waiting

    def _reap_orphans(self, now: float) -> None:
        """AGENT-16: a workload nobody tracks goes 2 min after first seen, and only once a
        task poll has completed, so a controller that is down never looks like "nobody"."""
        listed: set[tuple[str, int]] = set()
        for name, backend in self.backends.items():
            try:
                workloads = backend.list()
            except (BackendError, OSError) as exc:
                log.warning("cannot list the %s backend's workloads: %s", name, exc)
                continue
            for workload in workloads:
                key = (name, workload.runner_id)
                with self._lock:
                    if workload.runner_id in self._tracked:
                        self._first_seen.pop(key, None)
                        continue
                    listed.add(key)
                    first = self._first_seen.setdefault(key, now)
                    due = self.polls_completed > 0 and now - first >= ORPHAN_GRACE
                if due:
                    try:
                        backend.remove(workload.runner_id)
                    except (BackendError, OSError) as exc:
                        log.warning("cannot reap runner %s: %s", workload.runner_id, exc)
                        continue
                    log.info("reaped runner %s's workload: no record of it", workload.runner_id)
                    listed.discard(key)
        with self._lock:
            for key in list(self._first_seen):
                if key not in listed:
                    del self._first_seen[key]

    def reconcile_loop(
        self,
        interval: float = RECONCILE_INTERVAL,
        clock: Clock | None = None,
        wait: Wait | None = None,
    ) -> None:
        clock = clock or self._clock
        wait = wait or self._wait_for_reconcile
        while not self._stopping.is_set():
            try:
                self.reconcile_once(clock())
            except Unauthorized as exc:
                self._fatal(exc)
                return
            except ControllerError as exc:
                log.warning("sending runner reports failed: %s", exc)
            except Exception:
                log.exception("a reconcile pass failed")
            if wait(interval):
                return

    def _wait_for_reconcile(self, seconds: float) -> bool:
        self._wake_reconcile.wait(seconds)
        self._wake_reconcile.clear()
        return self._stopping.is_set()

    # -- running and stopping -------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> None:
        """Join (or reuse agent.json), adopt, run the loops until stopped, then shut down.

        Raises AgentError for what the operator must fix (a spent join token, a 401).
        """
        if install_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: self.request_stop())
        self._connect_with_retry()
        if self._stopping.is_set():
            self._raise_if_fatal()
            return
        self.adopt_existing()  # AGENT-23: before any loop can see an empty set
        loops = [
            threading.Thread(target=self.heartbeat_loop, name="agent-heartbeat", daemon=True),
            threading.Thread(target=self.poll_loop, name="agent-tasks", daemon=True),
            threading.Thread(target=self.reconcile_loop, name="agent-reconcile", daemon=True),
        ]
        for thread in loops:
            thread.start()
        while not self._stopping.wait(1.0):
            pass
        if self.fatal_error is None:
            self.stop()
        self.client.close()
        self._raise_if_fatal()

    def _connect_with_retry(self) -> None:
        backoff = 1.0
        while not self._stopping.is_set():
            try:
                self.connect()
                return
            except ControllerError as exc:
                if isinstance(exc, Unauthorized):
                    raise AgentError(str(exc)) from exc
                log.warning("cannot reach the controller to join: %s", exc)
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _raise_if_fatal(self) -> None:
        if self.fatal_error is not None:
            raise AgentError(self.fatal_error)

    def request_stop(self) -> None:
        """Only sets the flag: safe from a signal handler (STYLE 9)."""
        self._stopping.set()
        self._wake_reconcile.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self, grace: float = SHUTDOWN_GRACE) -> None:
        """AGENT-19: start no new task, wait up to `grace` for those in flight, send one
        last report, and never stop or remove a runner."""
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
        self.request_stop()
        self._admission.wake()  # AGENT-07: creates waiting for the slot give up now
        if not self.wait_for_tasks(grace):
            log.warning("shutting down with tasks still in flight after %.0f s", grace)
        if self.fatal_error is None:
            try:
                self.reconcile_once(final=True)
            except ControllerError as exc:
                log.warning("the last report did not reach the controller: %s", exc)
        log.info("agent stopped; its runners carry on")


def _report(
    runner_id: int, state: str | None, phase: str, exit_code: int | None, message: str | None
) -> dict[str, Any]:
    return {
        "runner_id": runner_id,
        "state": state,
        "phase": phase,
        "exit_code": exit_code,
        "message": message,
    }


def _seconds(value: Any, default: float) -> float:
    """A payload's duration in seconds; the default for one absent or not a sane number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    value = float(value)
    if not 0 <= value < 86400:  # also catches NaN
        return default
    return value


def _sane_interval(value: float) -> float:
    # A zero, negative or absurd answer must neither busy-loop the heartbeat nor silence it.
    if not value > 0:  # also catches NaN
        return DEFAULT_HEARTBEAT_INTERVAL
    return min(max(float(value), 1.0), 3600.0)
