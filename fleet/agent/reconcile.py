"""The agent's reconcile loop: inspect every runner it tracks, tell the controller what it
has not heard, delete finished workloads once acknowledged, and reap unclaimed ones
(RUN-15, RUN-17, AGENT-16..18).

A mixin of `fleet.agent.agent.Agent`, which holds the state these methods share.
"""

from __future__ import annotations

import logging

from fleet import protocol
from fleet.agent.backends.base import BackendError, Workload, WorkloadStatus
from fleet.agent.client import ControllerError, Unauthorized
from fleet.agent.tracking import AgentParts, Clock, TrackedRunner, Wait, end_report, report

log = logging.getLogger("fleet.agent")

RECONCILE_INTERVAL = 2.0
# The backends' listing for orphans is at most this often, unless a stray comes due sooner:
# a burst wakes the pass for every create, and each listing walks every workload (or asks
# the engine for all its containers), which was O(runners) a pass for nothing new.
ORPHAN_LISTING_EVERY = RECONCILE_INTERVAL


class ReconcileLoop(AgentParts):
    """Inspects tracked runners and reports them (`reconcile_once`, `reconcile_loop`)."""

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

        outgoing: list[tuple[TrackedRunner, str, protocol.RunnerReport]] = []
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
                        # It carried the phase too: a running one is not news next pass.
                        tracked.phase_sent = body.phase
                    elif kind == "phase":
                        tracked.phase_sent = body.phase
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
    ) -> list[tuple[TrackedRunner, str, protocol.RunnerReport]]:
        """The reports one inspected workload calls for; decides its end at most once."""
        rid = tracked.runner_id
        out: list[tuple[TrackedRunner, str, protocol.RunnerReport]] = []
        if workload.status == WorkloadStatus.MISSING:
            if now - tracked.created_at < self.tunables.missing_grace:
                return out  # AGENT-17: the backend may not list it yet
            tracked.workload_gone = True
            tracked.end = report(
                rid, "failed", "missing", None, f"runner {rid}'s workload disappeared from the host"
            )
            return out
        phase = workload.status.value
        if tracked.registering_due:
            # Its own report, before the phase, so registering lands first (RUN-15, RUN-16).
            out.append((tracked, "registering", report(rid, "registering", phase, None, None)))
        elif workload.status == WorkloadStatus.RUNNING and (tracked.phase_sent != phase or final):
            out.append((tracked, "phase", report(rid, None, phase, None, None)))
        if workload.status == WorkloadStatus.EXITED:
            tracked.end = end_report(tracked, workload)
        return out

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
        with self._lock:
            last = self._orphans_listed_at
            grace = self.tunables.orphan_grace
            due_soonest = min(self._first_seen.values(), default=None)
        if (
            last is not None
            and 0 <= now - last < ORPHAN_LISTING_EVERY
            and (due_soonest is None or now - due_soonest < grace)
        ):
            return
        self._orphans_listed_at = now
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
                    due = self.polls_completed > 0 and now - first >= self.tunables.orphan_grace
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
