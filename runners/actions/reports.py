"""Applying an agent's runner reports (RUN-15..18): what the host says its workloads did."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q

from fleet import protocol
from fleet.errors import InvalidRequest
from fleet.models import AgentTask, Host
from fleet.states import TaskKind, TaskState
from fleet.taskqueue import cancel_tasks
from runners.actions import steps
from runners.models import Job, Runner
from runners.states import TERMINAL_STATES, JobStatus, RunnerState
from runners.transitions import RunnerMove, transition_read_runners, transition_runner
from runners.wake import wake_reconcile
from zoomies_site.core.events import emit, emit_each

REPORTED_STATES = {
    "registering": RunnerState.REGISTERING,
    "removed": RunnerState.REMOVED,
    "failed": RunnerState.FAILED,
}


def clean_reports(reports: Any) -> tuple[protocol.RunnerReport, ...]:
    """Reports as the protocol defines them (issue 22 item 3: one definition, read once).
    The agent API hands them over read; a list of plain objects (the tests, a script) is
    read here, a malformed one a 400. An unknown state is the caller's refusal, not here."""
    if isinstance(reports, (list, tuple)) and all(
        isinstance(r, protocol.RunnerReport) for r in reports
    ):
        return tuple(reports)
    try:
        return protocol.read_reports(list(reports) if isinstance(reports, tuple) else reports)
    except protocol.ProtocolError as exc:
        raise InvalidRequest(str(exc)) from None


# Reports applied in one transaction: a burst's agent reports hundreds of runners a pass,
# and each its own transaction was that many waits for SQLite's write lock (issue 28).
REPORTS_PER_TRANSACTION = 50


def apply_agent_reports(*, host: Host, reports: Any, now: datetime) -> tuple[list[int], list[int]]:
    """Apply an agent's runner reports; returns (accepted, refused) runner ids, in the order
    the reports came.

    Up to REPORTS_PER_TRANSACTION reports are one durable transaction, runner by runner in
    ascending id (the order every group of runner locks is taken in), each runner's reports
    in the order sent. A report that raises takes its transaction's reports with it and the
    request fails: the agent sends every report not acknowledged again. RUN-18: a report
    about a runner that is not on this host is refused. RUN-15: the agent asserts
    `registering`, then only phases, then `removed` or `failed`. RUN-16: a running phase
    makes a registering runner idle, never busy (only GitHub makes a runner busy). A report
    about a runner already ended is accepted and changes nothing but its phase and exit
    code, so the agent may clean up (AGENT-18).
    """
    read = clean_reports(reports)
    answers: dict[int, bool] = {}  # the report's index -> accepted
    readable = []
    for index, report in enumerate(read):
        if report.state is not None and report.state not in REPORTED_STATES:
            answers[index] = False
        else:
            readable.append((index, report))
    readable.sort(key=lambda item: item[1].runner_id)  # stable: a runner's own order stays
    ended = False
    actor = host.actor
    for start in range(0, len(readable), REPORTS_PER_TRANSACTION):
        group = readable[start : start + REPORTS_PER_TRANSACTION]
        with transaction.atomic(durable=True):
            # Locked to the commit, so a GitHub signal cannot slip in between the read of
            # `registering` and the move to idle (it would make busy -> idle).
            ids = sorted({report.runner_id for _, report in group})
            locked = {
                r.pk: r
                for r in Runner.objects.select_for_update().filter(pk__in=ids).order_by("pk")
            }
            came_up = _came_up_together(group, locked, host=host, now=now, actor=actor)
            for index, report in group:
                if index in came_up:
                    answers[index] = True
                    continue
                runner = locked.get(report.runner_id)
                if runner is None or runner.host_id != host.pk:
                    answers[index] = False
                    continue
                runner.refresh_from_db()  # an earlier report of the group may have moved it
                _apply_report(runner, report, now=now, actor=actor)
                answers[index] = True
                ended = ended or report.state in ("removed", "failed")
    if ended:
        # A slot came free: the next pass should not wait for the ticker.
        wake_reconcile()
    accepted = [read[i].runner_id for i in sorted(answers) if answers[i]]
    refused = [read[i].runner_id for i in sorted(answers) if not answers[i]]
    return accepted, refused


def _came_up_together(
    group: list[tuple[int, protocol.RunnerReport]],
    locked: dict[int, Runner],
    *,
    host: Host,
    now: datetime,
    actor: str,
) -> set[int]:
    """A burst's commonest reports, applied as a group: a provisioning runner of this host
    whose one report in the group says `registering` with its workload running (or not yet
    said) and nothing else. Each is what `_apply_report` does for it (provisioning ->
    registering, running -> idle, RUN-16; the phase kept; a job GitHub started on it caught
    up), with one INSERT for the group's audit rows and events instead of a transaction's
    worth of statements a runner (issue 28: the reports held SQLite's write lock longest in
    a burst). The indexes applied here; every other report goes through `_apply_report`."""
    counts = Counter(report.runner_id for _, report in group)
    plain = [
        (index, report, locked[report.runner_id])
        for index, report in group
        if counts[report.runner_id] == 1
        and report.runner_id in locked
        and locked[report.runner_id].host_id == host.pk
        and locked[report.runner_id].state == RunnerState.PROVISIONING
        and report.state == "registering"
        and report.phase in (None, "running")
        and report.exit_code is None
    ]
    if len(plain) < 2:
        return set()  # one alone costs the same either way
    transition_read_runners(
        [RunnerMove(r, RunnerState.REGISTERING, now, "the agent started the workload")
         for _, _, r in plain],
        actor=actor,
    )  # fmt: skip
    running = [(i, rep, r) for i, rep, r in plain if rep.phase == "running"]
    transition_read_runners(
        [RunnerMove(r, RunnerState.IDLE, now, "the runner process is running",
                    moved_to=RunnerState.REGISTERING)
         for _, _, r in running],
        actor=actor,
    )  # fmt: skip
    # RUN-16, HOOK-05: a job GitHub already started on one of them (one query for the group).
    names = [r.name for _, _, r in plain]
    started = Job.objects.filter(
        Q(runner_name__in=names) | Q(runner__in=[r.pk for _, _, r in plain]),
        status=JobStatus.IN_PROGRESS,
    ).values_list("runner_name", "runner_id")
    named = {name for name, _ in started}
    linked = {pk for _, pk in started}
    for _, _, runner in plain:
        if runner.name in named or runner.pk in linked:
            _catch_up_started_job(runner, now=now, actor=actor)
    changed = [r for _, _, r in running if r.phase != "running"]
    Runner.objects.filter(pk__in=[r.pk for _, _, r in running]).update(phase="running")
    emit_each([("runner.reported", r, now) for r in changed])
    return {index for index, _, _ in plain}


def _catch_up_started_job(runner: Runner, *, now: datetime, actor: str) -> None:
    """RUN-16, HOOK-05: GitHub's in_progress can arrive while the runner is still
    provisioning, where busy is off the allow-list and the move was dropped; the job row kept
    it. Once the runner is registering or idle, that stored GitHub signal makes it busy
    (registering->busy and idle->busy are drawn edges), so a running job is never left on a
    runner the scheduler thinks is idle."""
    job = (
        Job.objects.filter(
            Q(runner_name=runner.name) | Q(runner=runner), status=JobStatus.IN_PROGRESS
        )
        .order_by("pk")
        .first()
    )
    if job is None:
        return
    if steps.link_job_runner(job, now=now, actor=actor) is None and job.runner_id == runner.pk:
        # Linked by id but unnamed: link_job_runner finds runners by name only.
        transition_runner(
            runner.pk, RunnerState.BUSY, now=now, actor=actor, reason=f"job {job.github_id} started"
        )


def _ran_on(report: protocol.RunnerReport) -> bool:
    """Whether a report shows the workload lived: it runs, or it exited by itself (a
    workload that went missing or was never started shows nothing of the kind)."""
    return report.phase == "running" or (report.phase == "exited" and report.exit_code is not None)


def _taken_away(runner: Runner) -> bool:
    """A draining runner whose registration GitHub confirmed deleted: its end, whatever its
    code (the listener's "registration removed" 1, or the stop's signal), is the drain's."""
    return runner.state == RunnerState.DRAINING and runner.deregistered_at is not None


def _apply_report(
    runner: Runner, report: protocol.RunnerReport, *, now: datetime, actor: str
) -> None:
    state = report.state
    phase = report.phase
    exit_code = report.exit_code
    message = (report.message or "").strip()
    if runner.state == RunnerState.FAILED and _ran_on(report) and runner.host is not None:
        # Issue 21 item 20: failed because its host was lost, yet its agent shows it ran on
        # (it keeps its job at GitHub): the row is put back to busy before the report is
        # read, so an end reported now ends a runner that ran, not a failed one.
        if steps.revive_after_host_loss(runner.host, runners=[runner], now=now, actor=actor):
            runner.refresh_from_db()
    live = runner.state not in TERMINAL_STATES
    # Whether this report moved the runner to where GitHub's in_progress can land (below).
    came_online = False
    # `registering` moves only a row still provisioning: one drained meanwhile stays draining.
    if runner.state == RunnerState.PROVISIONING and state == "registering":
        came_online = transition_runner(
            runner.pk,
            RunnerState.REGISTERING,
            now=now,
            actor=actor,
            reason="the agent started the workload",
        ).changed
    elif live and state == "removed":
        transition_runner(
            runner.pk, RunnerState.REMOVED, now=now, actor=actor, reason="the workload exited"
        )
    elif live and state == "failed" and _taken_away(runner):
        # An idle runner is drained by deleting its registration first, then stopped; its
        # listener ends with 1 (actions/runner's TerminatedError, "registration removed") or
        # by the stop's signal, as the drain meant it to: taken away, not a failure of it.
        transition_runner(
            runner.pk, RunnerState.REMOVED, now=now, actor=actor,
            reason="the workload exited as its registration was deleted to drain it",
        )  # fmt: skip
    elif live and state == "failed":
        if not message:
            message = (
                f"the runner exited with code {exit_code}"
                if exit_code is not None
                else "the agent reported the runner failed"
            )
        transition_runner(
            runner.pk,
            RunnerState.FAILED,
            now=now,
            actor=actor,
            reason="the workload failed",
            message=message,
        )
    if live and phase == "running":
        current = Runner.objects.filter(pk=runner.pk).values_list("state", flat=True).first()
        if current == RunnerState.REGISTERING:
            came_online |= transition_runner(
                runner.pk,
                RunnerState.IDLE,
                now=now,
                actor=actor,
                reason="the runner process is running",
            ).changed
    if came_online:
        _catch_up_started_job(runner, now=now, actor=actor)
    if not live and phase == "running" and runner.host is not None:
        # Issue 11 item 4: a failed runner its host says is still running keeps its job.
        steps.spare_busy_workloads(runner.host, now=now, actor=actor, runners=[runner])
    extra: dict[str, Any] = {}
    if phase is not None:
        extra["phase"] = phase[:32]
    if exit_code is not None:
        extra["exit_code"] = exit_code
    if (
        state in ("failed", "removed")
        and report.output_tail
        and runner.state != RunnerState.REMOVED
    ):
        # Issue 8 item 14, issue 9: the workload and its log go; the row keeps their end.
        extra["output_tail"] = report.output_tail
    if extra:
        Runner.objects.filter(pk=runner.pk).update(**extra)
        # Agents repeat the phase in every report: only a change is news.
        if any(getattr(runner, field) != value for field, value in extra.items()):
            emit("runner.reported", runner, at=now)
    if state in ("removed", "failed"):
        # The workload is gone: a create or stop still queued for it has nothing to act on.
        cancel_tasks(
            AgentTask.objects.filter(
                runner=runner,
                kind__in=[TaskKind.CREATE_RUNNER, TaskKind.STOP_RUNNER],
                state=TaskState.PENDING,
            ),
            now=now,
            actor=actor,
            reason=f"the runner was {state}",
        )
