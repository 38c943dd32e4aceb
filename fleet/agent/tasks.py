"""The agent's task loop: long-poll the controller, run each task on a thread of its own,
answer its result (TASK-02, AGENT-01..08, RUN-11, RUN-14, AGENT-24).

A mixin of `fleet.agent.agent.Agent`, which holds the state these methods share.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from fleet import protocol
from fleet.agent.backends.base import (
    Backend,
    BackendError,
    RunnerSpec,
    WorkloadExists,
    WorkloadStatus,
)
from fleet.agent.client import ControllerError, Task, Unauthorized
from fleet.agent.host import work_dir_space
from fleet.agent.logs import LOG_TASK_KINDS, LogRelay, handle_log_task
from fleet.agent.results import ResultPoster
from fleet.agent.tracking import AgentParts, TrackedRunner, Wait, end_report, report

log = logging.getLogger("fleet.agent")

MAX_BACKOFF = 30.0
# How long a task's result is offered again while the controller cannot take it (a locked
# or restarting database answers 503 or not at all). Three tries in about 23 s gave up
# inside a 45 s write lock, and the task then waited out its lease (10 min for a stop).
# The waits double from 1 s up to RESULT_MAX_WAIT; a stopping agent stops trying.
RESULT_PATIENCE = 300.0
RESULT_MAX_WAIT = 15.0
# AGENT-11: three more inventory asks, about seventeen seconds in all.
INVENTORY_RETRIES = (2.0, 5.0, 10.0)
PREWARM = "image_prewarm"  # AGENT-14: no runner; shares the create slot as a background task
CHECK_HOST = "check_host"  # TASK-09: an operator's look at this host; no runner, no slot
# Less than this free in the work directory fails a host check (a runner unpacks ~1 GB).
MIN_FREE_DISK_MB = 1024


class TaskLoop(AgentParts):
    """Long-polls for tasks (`poll_once`, `poll_loop`) and runs each on its own thread."""

    _log_relay: LogRelay
    _results: ResultPoster

    def poll_once(self, wait: float | None = None, *, block: bool = True) -> list[Task]:
        """Take the tasks waiting for this host and start each on a thread of its own.

        With block=True it returns once they have all finished and posted their results.
        """
        if self._stopping.is_set():
            return []
        taken = self.client.poll_tasks(self.tunables.long_poll_wait if wait is None else wait)
        tasks = list(taken.tasks)
        started = []
        with self._lock:
            self.polls_completed += 1
            if taken.cordoned is not None:
                # Before any of these creates reaches the front (AGENT-08): the cordon
                # they were placed under, fresher than the last heartbeat's (issue 21 item 6).
                self.cordoned = taken.cordoned
                self.cordon_from_tasks_at = self._clock()
        for task in tasks:
            if self._stopping.is_set():
                # AGENT-19: no new task; its lease ends and the controller offers it again.
                log.info("shutting down: task %s is left for redelivery", task.id)
                continue
            ticket, superseded = None, False
            with self._lock:
                if task.kind == "create_runner" and task.runner_id is not None:
                    # AGENT-02: the place in the queue is the order the tasks arrived in.
                    ticket = self._admission.ticket()
                    self._waiting_creates.add(task.runner_id)
                elif task.kind == PREWARM:
                    # AGENT-01, AGENT-02: the same slot, behind every waiting create.
                    ticket = self._admission.ticket(background=True)
                elif task.runner_id in self._waiting_creates:
                    # AGENT-06: the create still waiting for the slot must not start.
                    self._superseded.add(task.runner_id)
                    superseded = True
                thread = threading.Thread(
                    target=self._run_task,
                    args=(task, ticket),
                    name=f"agent-task-{task.id}",
                    daemon=True,
                )
                self._inflight.add(thread)
            if superseded:
                self._admission.wake()  # the superseded create gives up now, not at its next look
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

    def poll_loop(self, wait: float | None = None, pause: Wait | None = None) -> None:
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
        if task.kind == PREWARM and ticket is not None:
            return self._prewarm(task, ticket)
        if task.kind == CHECK_HOST:
            self._post_result(task, *self._check_host())
            return True, None, False  # answered above, with its report
        if rid is None:
            return False, f"the {task.kind} task names no runner", True
        if task.kind in LOG_TASK_KINDS:  # LOG-02, LOG-04: nothing to adopt for a read
            ok, error = handle_log_task(
                task.kind,
                dict(task.payload),
                rid,
                relay=self._log_relay,
                backend=self._backend_holding(rid),
            )
            return ok, error, True
        with self._lock:
            known = rid in self._tracked
        if not known:
            self._adopt(rid)  # AGENT-24
        if task.kind == "stop_runner":
            return self._stop(task, rid)
        if task.kind == "remove_runner":
            return self._remove(rid)
        return False, f"this agent does not know the task kind {task.kind!r}", True

    def _backend_holding(self, rid: int) -> Backend | None:
        """The backend with the runner's workload: the tracked one, else the first that
        has it (an agent restarted since the create has adopted it, or will)."""
        with self._lock:
            tracked = self._tracked.get(rid)
        if tracked is not None:
            return self.backends.get(tracked.backend)
        for backend in self.backends.values():
            try:
                if backend.inspect(rid).status != WorkloadStatus.MISSING:
                    return backend
            except (BackendError, OSError):
                continue
        return None

    def _create(self, task: Task, rid: int, ticket: int) -> tuple[bool, str | None, bool]:
        admitted = settled = False
        try:
            try:
                spec = RunnerSpec.from_payload(dict(task.payload), runner_id=rid)
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
            return self._create_admitted(spec, backend, task.attempt)
        finally:
            with self._lock:
                self._waiting_creates.discard(rid)
            if admitted:
                self._admission.release()
            elif not settled:
                # A create that never queued must not hold up the ones behind its ticket.
                self._admission.abandon(ticket)
            self._wake_reconcile.set()

    def _prewarm(self, task: Task, ticket: int) -> tuple[bool, str | None, bool]:
        """AGENT-14: the pool's images prepared in the host's one slot, behind every waiting
        create (AGENT-02); what the backend prepared in the last minute is not asked for
        again (AGENT-15, in the backend)."""
        admitted = False
        try:
            try:
                prewarm = protocol.ImagePrewarmPayload.from_json(task.payload)
            except protocol.ProtocolError as exc:
                return False, f"the image_prewarm payload is unusable: {exc}", True
            backend = self.backends.get(prewarm.backend)
            if backend is None:
                return False, f"this host has no {prewarm.backend!r} backend", True
            admitted = self._admission.acquire(ticket, give_up=self._stopping.is_set)
            if not admitted:
                return False, None, False  # shutting down: the controller offers it again
            try:
                prepared = backend.prewarm(prewarm.image, dind=prewarm.dind)
            except BackendError as exc:
                if getattr(exc, "transport_failure", False):
                    self._start_hold.failed()  # AGENT-09: the engine stopped answering
                return False, str(exc), True
            log.info("prewarmed %s for %s: %s", prewarm.image, prewarm.pool, prepared or "reused")
            return True, None, True
        finally:
            if admitted:
                self._admission.release()
            else:
                self._admission.abandon(ticket)

    def _create_admitted(
        self, spec: RunnerSpec, backend: Backend, attempt: int | None = None
    ) -> tuple[bool, str | None, bool]:
        """Holding the host's one create slot (AGENT-01)."""
        rid = spec.runner_id
        if self.cordoned:  # AGENT-08: checked again at the front of the queue
            return False, "the host is cordoned", True
        # AGENT-09: after the engine stopped answering, every start waits out the hold.
        held = self._start_hold.remaining()
        if held > 0 and self._pause(held):
            return False, None, False  # shutting down: left for redelivery
        with self._lock:
            existing = self._tracked.get(rid)
        if existing is None:
            try:
                existing = self._adopt_for_create(rid, spec.backend)  # AGENT-24
            except BackendError as exc:
                if getattr(exc, "transport_failure", False):
                    self._start_hold.failed()  # AGENT-09: the engine stopped answering
                if self._stopping.is_set():
                    return False, None, False
                # AGENT-12: on a first delivery no workload of this runner's can exist, so
                # fail out loud and let the scheduler replace it; a redelivery (or a task
                # with no attempt) may have one mid-job behind a silent engine: no answer.
                if attempt == 1:
                    return False, f"cannot tell whether runner {rid}'s workload exists: {exc}", True
                log.warning("runner %s: inventory uncertain (%s); left for redelivery", rid, exc)
                return False, None, False
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
            # AGENT-10: only an engine that did not answer opens the hold, not a timeout.
            if getattr(exc, "transport_failure", False):
                held = self._start_hold.failed()
                log.warning("%s; holding further starts for %.0f s", exc, held)
            return False, str(exc), True  # RUN-14: the runner fails with this message
        self._start_hold.succeeded()
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

    def _adopt_for_create(self, rid: int, backend_name: str) -> TrackedRunner | None:
        """AGENT-11: an inventory that cannot tell never authorises a replacement; ask
        three more times over about seventeen seconds before giving up."""
        for delay in (*INVENTORY_RETRIES, None):
            try:
                return self._adopt(rid, backend_name)
            except (BackendError, OSError) as exc:
                if delay is None or self._pause(delay):
                    if isinstance(exc, BackendError):
                        raise
                    raise BackendError(str(exc)) from exc
        return None  # not reached: the last round returns or raises

    def _stop(self, task: Task, rid: int) -> tuple[bool, str | None, bool]:
        with self._lock:
            tracked = self._tracked.get(rid)
            if tracked is None:
                return True, None, True  # nothing on this host to stop
            tracked.stopped_by_agent = True
        stop = protocol.StopRunnerPayload.from_json(task.payload, runner_id=rid)
        try:
            self.backends[tracked.backend].stop(rid, stop.timeout, grace=stop.grace)
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
                        tracked.end = end_report(tracked, workload)
                    else:
                        tracked.end = report(
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

    def _check_host(self) -> tuple[bool, str | None, dict[str, Any]]:
        """TASK-09: each backend's engine, the work directory's free space and this host's
        wall clock (the controller works out the skew), as an operator's check asks. Each
        probe is bounded by its backend's own timeouts, inside the agent's 45 s."""
        report: dict[str, Any] = {"clock": round(time.time(), 3)}
        problems = []
        for name, backend in sorted(self.backends.items()):
            try:
                backend.probe()
                report[f"engine.{name}"] = "reachable"
            except BackendError as exc:
                report[f"engine.{name}"] = f"unreachable: {exc}"[:300]
                problems.append(f"{name} does not answer")
        space = work_dir_space(self.work_dir)
        if space is None:
            problems.append("the work directory's filesystem cannot be read")
        else:
            report["disk_free_mb"], report["disk_total_mb"] = space.free_mb, space.total_mb
            if space.free_mb < MIN_FREE_DISK_MB:
                problems.append(f"{space.free_mb} MB free in the work directory")
        return not problems, "; ".join(problems) or None, report

    def _post_result(
        self, task: Task, ok: bool, error: str | None, report: dict[str, Any] | None = None
    ) -> None:
        delay, waited = 1.0, 0.0
        while True:
            try:
                accepted = self._results.post(
                    self.client, task.id, ok=ok, error=error, attempt=task.attempt, report=report
                )
            except Unauthorized as exc:
                self._fatal(exc)
                return
            except ControllerError as exc:
                log.warning("posting task %s's result failed: %s", task.id, exc)
                if waited + delay > RESULT_PATIENCE or self._stopping.is_set():
                    break
                self._sleep(delay)
                waited += delay
                delay = min(delay * 2, RESULT_MAX_WAIT)
                continue
            if not accepted:
                log.info("task %s's result was not accepted (no longer in flight)", task.id)
            return
        # The lease will end and the task come back; handling it again is idempotent.
        log.error("gave up posting task %s's result; it will be redelivered", task.id)
