"""An agent's task results: closing an in-flight task with its answer, one by one
(`fleet.actions.record_task_result`) or a group of answers in one transaction
(`record_task_results`, issue 28: a burst's creates end as a burst of results, and one
write transaction each was the largest holder of SQLite's write lock in the burst of 500).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from fleet.errors import TaskNotFound, TaskNotInFlight
from fleet.host_checks import note_host_check
from fleet.models import AgentTask, Host
from fleet.runner_side import runner_side
from fleet.states import TaskKind, TaskState
from fleet.transitions import transition_task


@dataclass(frozen=True)
class TaskAnswer:
    """One result as the agent posted it (`POST tasks/{id}/result`), and when it arrived."""

    host: Host
    task_id: int
    ok: bool
    error: str | None
    attempt: int | None
    now: datetime
    report: Mapping[str, Any] | None = None


def close_task(
    *,
    host: Host,
    task_id: int,
    ok: bool,
    error: str | None,
    attempt: int | None,
    now: datetime,
    actor: str,
    report: Mapping[str, Any] | None = None,
) -> AgentTask:
    """Close an in-flight task with its answer, inside the caller's transaction.

    TASK-14: another host's task is not found. A task not in flight, or in flight under a
    later attempt than the one answered, is a conflict (its lease ended and it was offered
    again, or it was cancelled). What a failed create or stop means for its runner is
    `runners.actions.steps.runner_task_failed` (RUN-14, TASK-05); a failed remove is issued
    again by housekeeping until the host confirms one (TASK-08).
    """
    error = (error or "").strip()
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
    task.refresh_from_db()
    return task


def record_task_results(
    answers: Sequence[TaskAnswer], *, actor_of: Any
) -> list[AgentTask | Exception]:
    """Each answer closed as `record_task_result` would close it alone, all in ONE
    transaction: the closed task for each, or what refused it (TaskNotFound, a conflict, or
    whatever broke). Each answer has a savepoint of its own, so one that is refused or fails
    undoes only its own writes and the rest commit. A failure of the transaction itself (the
    database busy or unwritable at BEGIN or COMMIT) raises: nothing of the group was written.
    `actor_of(host)` names the agent in the audit trail, as the one-by-one path does."""
    outcomes: list[AgentTask | Exception] = []
    with transaction.atomic(durable=True):
        for answer in answers:
            try:
                with transaction.atomic():
                    outcomes.append(
                        close_task(
                            host=answer.host,
                            task_id=answer.task_id,
                            ok=answer.ok,
                            error=answer.error,
                            attempt=answer.attempt,
                            now=answer.now,
                            actor=actor_of(answer.host),
                            report=answer.report,
                        )
                    )
            except Exception as exc:  # this answer's alone: the others go on
                outcomes.append(exc)
    return outcomes
