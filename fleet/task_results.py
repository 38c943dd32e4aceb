"""An agent's answers to its tasks: each closes an in-flight task, and a failure is the
runners side's to act on (TASK-02, TASK-05, TASK-14, RUN-14; docs/agent-protocol.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction

from fleet import protocol
from fleet.errors import TaskNotFound, TaskNotInFlight
from fleet.host_checks import note_host_check
from fleet.models import AgentTask, Host
from fleet.runner_side import runner_side
from fleet.states import TaskKind, TaskState
from fleet.transitions import transition_task


def record_task_result(
    *,
    host: Host,
    task_id: int,
    ok: bool,
    error: str | None,
    attempt: int | None,
    now: datetime,
    actor: str | None = None,
    report: Mapping[str, Any] | None = None,
) -> AgentTask:
    """Close an in-flight task with the agent's answer (or the controller's, `actor`, for a
    task it could not deliver), and let the runners side act on a failure, in one
    transaction.

    TASK-14: another host's task is not found. A task not in flight, or in flight under a
    later attempt than the one answered, is a conflict (its lease ended and it was offered
    again, or it was cancelled). What a failed create or stop means for its runner is
    `runners.actions.steps.runner_task_failed` (RUN-14, TASK-05); a failed remove is issued
    again by housekeeping until the host confirms one (TASK-08).
    """
    with transaction.atomic(durable=True):
        answer = protocol.TaskResult(ok=ok, error=error, attempt=attempt, report=report)
        task = _close_task(host, task_id, answer, now=now, actor=actor)
        task.refresh_from_db()
    return task


def record_task_results(
    *, host: Host, results: Sequence[protocol.TaskResultItem], now: datetime
) -> list[protocol.TaskResultOutcome]:
    """Several of an agent's results in one transaction, each as `record_task_result` would
    record it alone, in a savepoint of its own: a result refused (not this host's task, no
    longer in flight) is that result's outcome and leaves the others recorded (issue 28).
    A database error is no result's outcome: it ends the transaction, and nothing is kept."""
    outcomes = []
    with transaction.atomic(durable=True):
        for item in results:
            try:
                with transaction.atomic():
                    _close_task(host, item.id, item.result, now=now, actor=None)
            except (TaskNotFound, TaskNotInFlight) as exc:
                outcomes.append(protocol.TaskResultOutcome(item.id, False, exc.status, str(exc)))
            else:
                outcomes.append(protocol.TaskResultOutcome(item.id, True))
    return outcomes


def _close_task(
    host: Host, task_id: int, answer: protocol.TaskResult, *, now: datetime, actor: str | None
) -> AgentTask:
    """`record_task_result`'s work, inside the caller's transaction."""
    actor = actor or host.actor
    ok, attempt, report = answer.ok, answer.attempt, answer.report
    error = (answer.error or "").strip()
    if task_id > protocol.INT64_MAX:  # no row has such an id; the database would overflow
        raise TaskNotFound(f"task {task_id} is not a task of this host")
    task = AgentTask.objects.filter(pk=task_id, host=host).select_related("runner").first()
    if task is None:
        raise TaskNotFound(f"task {task_id} is not a task of this host")
    new_state = TaskState.DONE if ok else TaskState.FAILED
    if task.state != TaskState.IN_FLIGHT:
        raise TaskNotInFlight(f"task {task_id} is {task.state}, not in flight")
    if not transition_task(
        task.pk,
        new_state,
        now=now,
        actor=actor,
        reason=error,
        attempt=attempt,
        fields={"error": "" if ok else error},
    ):
        task.refresh_from_db()
        if task.state != TaskState.IN_FLIGHT:
            raise TaskNotInFlight(f"task {task_id} is {task.state}, not in flight")
        raise TaskNotInFlight(
            f"task {task_id} is in flight as attempt {task.attempt}, not {attempt}"
        )
    if not ok:
        runner_side().task_failed(task, error=error, now=now, actor=actor)
    if task.kind == TaskKind.CHECK_HOST:
        found = dict(report or {})
        clock = found.get("clock")
        if isinstance(clock, int | float) and not isinstance(clock, bool):
            found["clock_skew_s"] = round(clock - now.timestamp(), 1)  # + is ahead
        note_host_check(host.pk, task, state="done" if ok else "failed", now=now,
                        report=found, error=error)  # fmt: skip
    return task
