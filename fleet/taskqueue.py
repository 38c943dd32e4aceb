"""The agent task queue: rows with leases, delivered at least once.

Queue mechanics only; what a task means for a runner is decided on the runners side.
`enqueue_task` is called inside the caller's transaction, so a runner row and its create
task commit together (SCHED-16). `take_tasks` hands a host its pending tasks under a lease;
`sweep_tasks` puts a task whose lease ended back on the queue, at most `max_attempts`
offers in all (TASK-02, TASK-04), and returns the tasks it abandoned; `cancel_tasks` is
the one way open tasks are cancelled. Every move goes through
`fleet.transitions.transition_task`, a compare-and-set on the task's state.

A task's `env` (a runner's JIT configuration or registration token) is sealed in the row
(AUTH-07): `enqueue_task` seals each value, `wire_payload` unseals them only for the answer
to the task's own agent, and the move to a final state drops them in the same UPDATE, so a
row holds a runner credential only while it can still be used, and never in plain text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from fleet.host_checks import note_host_check
from fleet.models import AgentTask, Host
from fleet.states import OPEN_TASK_STATES, TaskKind, TaskState
from fleet.transitions import take_pending_tasks, transition_task
from fleet.wakeups import announce_pending_tasks, notify_host
from zoomies_site.core import registry
from zoomies_site.core.sealing import seal, unseal_text

log = logging.getLogger("zoomies.fleet")

SWEEP_ACTOR = "system:housekeeping"

# TASK-03: which registry entry holds each kind's lease.
LEASE_SETTING = {
    TaskKind.CREATE_RUNNER: "tasks.create_lease",
    TaskKind.STOP_RUNNER: "tasks.stop_lease",
    TaskKind.REMOVE_RUNNER: "tasks.remove_lease",
    # A prewarm is a create's image preparation alone: a cold pull needs a create's lease.
    TaskKind.IMAGE_PREWARM: "tasks.create_lease",
}

# A sealed env value in a task row: this prefix, then `core.sealing.seal`'s "v1:..." text.
SEALED_PREFIX = "sealed:"


# A log relay is tied to a browser that may be gone by its lease's end, so it is offered
# once and never re-queued (the spec's exception to TASK-02); the agent answers it as soon
# as it has started (or stopped) reading, well inside this lease.
LOG_TASK_KINDS = (TaskKind.STREAM_LOGS, TaskKind.CANCEL_LOGS)
LOG_TASK_LEASE = timedelta(seconds=60)


# TASK-09: a host check has a lease of its own, above the agent's 45 s bound on one run,
# and is offered once; TASK-10: dropped when no agent took it within 20 s.
HOST_CHECK_LEASE = timedelta(seconds=90)
HOST_CHECK_TAKE_WITHIN = timedelta(seconds=20)
# Offered once and never put back on the queue.
ONCE_KINDS = (*LOG_TASK_KINDS, TaskKind.CHECK_HOST)


def lease_for(kind: str) -> timedelta:
    if kind in LOG_TASK_KINDS:
        return LOG_TASK_LEASE
    if kind == TaskKind.CHECK_HOST:
        return HOST_CHECK_LEASE
    return registry.get(LEASE_SETTING[TaskKind(kind)])


def enqueue_task(
    *, host_id: int, runner_id: int | None, kind: str, payload: dict, now: datetime
) -> AgentTask:
    """A pending task, written in the caller's transaction; its host's polls are woken once
    it commits."""
    task = AgentTask.objects.create(
        state=TaskState.PENDING,
        **_pending_fields(
            host_id=host_id, runner_id=runner_id, kind=kind, payload=payload, now=now
        ),
    )
    notify_host_on_commit(host_id)
    return task


def enqueue_tasks(tasks: list[dict[str, Any]]) -> list[AgentTask]:
    """Pending tasks (each given as `enqueue_task`'s keywords) in one INSERT, in the caller's
    transaction; each host's polls woken once when it commits."""
    created = AgentTask.objects.bulk_create(
        [AgentTask(state=TaskState.PENDING, **_pending_fields(**t)) for t in tasks]
    )
    for host_id in dict.fromkeys(t["host_id"] for t in tasks):
        notify_host_on_commit(host_id)
    return created


def _pending_fields(
    *, host_id: int, runner_id: int | None, kind: str, payload: dict, now: datetime
) -> dict[str, Any]:
    return {
        "host_id": host_id,
        "runner_id": runner_id,
        "kind": kind,
        "payload": seal_env(payload),
        "attempt": 0,
        "max_attempts": 1 if kind in ONCE_KINDS else registry.get("tasks.max_attempts"),
        "lease_seconds": int(lease_for(kind).total_seconds()),
        "created_at": now,
    }


def seal_env(payload: dict) -> dict:
    """The payload with each `env` value sealed: no runner credential is stored in plain text."""
    env = payload.get("env")
    if not isinstance(env, dict) or not env:
        return payload
    sealed = {}
    for key, value in env.items():
        text = str(value)  # what the agent would make of it (RunnerSpec.from_payload)
        sealed[str(key)] = text if text.startswith(SEALED_PREFIX) else SEALED_PREFIX + seal(text)
    return {**payload, "env": sealed}


def wire_payload(task: AgentTask) -> dict:
    """The payload as the task's agent receives it: `env` in plain values, over the agent's
    own (TLS) connection. Raises core.sealing.SealError when a value cannot be unsealed."""
    payload = task.payload
    env = payload.get("env") if isinstance(payload, dict) else None
    if not isinstance(env, dict):
        return payload
    return {**payload, "env": {key: _unsealed(value) for key, value in env.items()}}


def _unsealed(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(SEALED_PREFIX):
        return unseal_text(value[len(SEALED_PREFIX) :])
    return value  # a row written before env was sealed


def notify_host_on_commit(host_id: int) -> None:
    """Wake the polls for `host_id`, in this process and others, once they can see the task."""
    transaction.on_commit(lambda: notify_host(host_id))
    announce_pending_tasks()


def take_tasks(
    host: Host | int, now: datetime, limit: int = 10, *, polled_at: datetime | None = None
) -> list[AgentTask]:
    """Put up to `limit` of the host's pending tasks in flight, oldest first, and return them.

    Each delivery is stamped: attempt + 1, `taken_at`, and a lease deadline from the task's
    own lease. The move is a compare-and-set from pending, so two polls racing for one
    host never both take a task. A create whose runner was drained or failed meanwhile was
    cancelled by that action, so it is no longer pending here (AGENT-06). A poll that began
    (`polled_at`) before the host's agent last started is its dead predecessor's, left open
    on the server: it takes nothing.
    """
    host_id = host if isinstance(host, int) else host.pk
    pending = AgentTask.objects.filter(host_id=host_id, state=TaskState.PENDING)
    if polled_at is not None:
        pending = pending.exclude(host__agent_started_at__gt=polled_at)
    # A cheap read first: an idle host's poll must not take the write lock every time.
    candidates = list(
        pending.order_by("created_at", "pk").only("pk", "attempt", "lease_seconds")[: max(limit, 0)]
    )
    if not candidates:
        return []
    with transaction.atomic():
        taken = take_pending_tasks(candidates, now=now)
    if not taken:
        return []
    return list(AgentTask.objects.filter(pk__in=taken).order_by("created_at", "pk"))


def cancel_tasks(
    tasks: QuerySet | Iterable[AgentTask], *, now: datetime, actor: str, reason: str
) -> list[int]:
    """Cancel every open task among `tasks`; returns the ids this call cancelled.

    The one way tasks are cancelled: each is a compare-and-set from pending or in flight
    that drops the task's stored credential in the same UPDATE and writes its audit row. A
    task that finished meanwhile is left as it ended. Call it inside the action whose change
    makes the tasks pointless, so both commit together.
    """
    if isinstance(tasks, QuerySet):
        ids = list(tasks.filter(state__in=OPEN_TASK_STATES).values_list("pk", flat=True))
    else:
        ids = [t.pk for t in tasks if t.state in OPEN_TASK_STATES]
    return [
        pk
        for pk in sorted(ids)
        if transition_task(
            pk,
            TaskState.CANCELLED,
            now=now,
            actor=actor,
            reason=reason,
            fields={"error": reason},
        )
    ]


@dataclass
class SweepResult:
    """What a sweep did: one line per task moved, and the tasks it abandoned (as they were
    read before the move), for the runners side to act on."""

    lines: list[str] = field(default_factory=list)
    abandoned: list[AgentTask] = field(default_factory=list)


def sweep_tasks(now: datetime) -> SweepResult:
    """Re-queue or abandon every in-flight task whose lease has ended.

    TASK-02: back on its host's queue while it has offers left. TASK-04: after
    `max_attempts` offers it is abandoned, and returned in `abandoned`; what that means for
    its runner (TASK-05, TASK-06) is for the caller to decide.
    """
    result = SweepResult()
    expired = (
        AgentTask.objects.filter(state=TaskState.IN_FLIGHT, lease_deadline__lte=now)
        .select_related("host")
        .order_by("lease_deadline", "pk")
    )
    for task in expired:
        # Guarded on the delivery and the lease the listing saw: a result that arrived
        # meanwhile, or a later delivery, makes the move a no-op.
        _offer_again(
            task,
            now=now,
            actor=SWEEP_ACTOR,
            why="lease ended without a result",
            guard={"lease_deadline__lte": now},
            result=result,
        )
    result.lines.extend(drop_untaken_host_checks(now))
    for line in result.lines:
        log.info("task sweep: %s", line)
    return result


def drop_untaken_host_checks(now: datetime) -> list[str]:
    """TASK-10: a host check no agent took within 20 s is dropped (cancelled): the host
    did not answer, which is itself what the operator learns."""
    stale = AgentTask.objects.filter(
        kind=TaskKind.CHECK_HOST,
        state=TaskState.PENDING,
        created_at__lte=now - HOST_CHECK_TAKE_WITHIN,
    )
    dropped = cancel_tasks(stale, now=now, actor=SWEEP_ACTOR, reason="no agent took it within 20 s")
    for task in AgentTask.objects.filter(pk__in=dropped):
        note_host_check(task.host_id, task, state="dropped", now=now,
                        error="no agent took it within 20 s")  # fmt: skip
    return [f"host check {pk} dropped: no agent took it within 20 s" for pk in dropped]


def requeue_in_flight(host_id: int, *, now: datetime, actor: str, why: str) -> SweepResult:
    """Offer again at once every task in flight to `host_id`, as if its lease had ended.

    For when the agent that took them is known to be gone (the embedded agent died with a
    killed controller): waiting out a create's lease would leave its runner provisioning for
    minutes (issue 11 item 3). Same attempt budget and outcome as `sweep_tasks`.
    """
    result = SweepResult()
    in_flight = (
        AgentTask.objects.filter(host_id=host_id, state=TaskState.IN_FLIGHT)
        .select_related("host")
        .order_by("taken_at", "pk")
    )
    for task in in_flight:
        _offer_again(task, now=now, actor=actor, why=why, guard={}, result=result)
    for line in result.lines:
        log.info("task requeue: %s", line)
    return result


def settle_in_flight(
    host_id: int, *, present: set[int], complete: bool, now: datetime, actor: str
) -> SweepResult:
    """Settle every task in flight to `host_id` from its restarted agent's inventory instead
    of waiting out the leases (issue 11 item 3). The agent sends it before its first poll,
    so whatever it holds in flight was taken by its dead predecessor and will never be
    answered; `taken_at` before `now` keeps a task this agent took after all out of it.

    A create whose workload is on the host worked: done. A stop or remove whose runner has no
    workload left, by a `complete` inventory, has nothing more to do: done. Anything else is
    offered again now, with the same attempt budget as an ended lease (TASK-02, TASK-04):
    creates, stops and removes are idempotent by runner id (AGENT-11, AGENT-24).
    """
    result = SweepResult()
    in_flight = (
        AgentTask.objects.filter(host_id=host_id, state=TaskState.IN_FLIGHT, taken_at__lt=now)
        .select_related("host")
        .order_by("taken_at", "pk")
    )
    guard = {"taken_at__lt": now}
    for task in in_flight:
        exists = task.runner_id in present
        if task.kind == TaskKind.CREATE_RUNNER and exists:
            why = "its workload is on the host's inventory"
        elif (
            task.kind in (TaskKind.STOP_RUNNER, TaskKind.REMOVE_RUNNER) and complete and not exists
        ):
            why = "the host's inventory has no workload of its runner left"
        else:
            why = "its agent restarted without answering"
            _offer_again(task, now=now, actor=actor, why=why, guard=guard, result=result)
            continue
        if transition_task(
            task.pk,
            TaskState.DONE,
            now=now,
            actor=actor,
            reason=why,
            attempt=task.attempt,
            guard=guard,
            action="task.settled",
        ):
            result.lines.append(f"{task.kind} #{task.pk} for host {task.host.name}: done, {why}")
    for line in result.lines:
        log.info("task settled: %s", line)
    return result


def _offer_again(
    task: AgentTask, *, now: datetime, actor: str, why: str, guard: dict, result: SweepResult
) -> None:
    """Back to pending while it has offers left (TASK-02), else abandoned (TASK-04)."""
    label = f"{task.kind} #{task.pk} for host {task.host.name}"
    if task.attempt < task.max_attempts:
        reason = f"{label}: {why}; offered again ({task.attempt + 1})"
        if transition_task(
            task.pk,
            TaskState.PENDING,
            now=now,
            actor=actor,
            reason=reason,
            attempt=task.attempt,
            guard=guard,
            fields={"lease_deadline": None},
            action="task.requeued",
        ):
            notify_host_on_commit(task.host_id)
            result.lines.append(reason)
        return
    error = f"no result after {task.attempt} offers"
    reason = f"{label}: abandoned, {error}"
    if transition_task(
        task.pk,
        TaskState.ABANDONED,
        now=now,
        actor=actor,
        reason=reason,
        attempt=task.attempt,
        guard=guard,
        fields={"error": error},
    ):
        result.lines.append(reason)
        result.abandoned.append(task)
        if task.kind == TaskKind.CHECK_HOST:
            note_host_check(task.host_id, task, state="expired", now=now,
                            error="the agent took it and never answered")  # fmt: skip
