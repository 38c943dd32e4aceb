"""The agent task queue: rows with leases (DESIGN.md), delivered at least once.

`enqueue_task` is called inside the caller's transaction, so a runner row and its create
task commit together (SCHED-16). `take_tasks` hands a host its pending tasks under a lease;
`sweep_tasks` puts a task whose lease ended back on the queue, at most `max_attempts`
offers in all (TASK-02, TASK-04). Every move is a compare-and-set on the task's state.

A task's `env` (a runner's JIT configuration or registration token) is sealed in the row
(AUTH-07): `enqueue_task` seals each value, `wire_payload` unseals them only for the answer
to the task's own agent, and `blank_env` drops them once the task is final, so a row holds
a runner credential only while the credential can still be used, and never in plain text.

What is still owed to a host is rebuilt from rows on every housekeeping tick, so a
controller restart loses none of it (TASK-08): `reissue_owed_removes` issues a remove again
until the host confirms one, and `fail_unconfirmed_stops` fails a draining runner whose
host answered its stop but never reported it gone.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, F, OuterRef, QuerySet

from accounts import audit
from accounts.sealing import seal, unseal_text
from fleet.models import AgentTask, Host
from fleet.states import OPEN_TASK_STATES, HostHealth, TaskKind, TaskState
from runners.states import RunnerState

log = logging.getLogger("zoomies.fleet")

SWEEP_ACTOR = "system:housekeeping"

# TASK-03: which registry entry holds each kind's lease.
LEASE_SETTING = {
    TaskKind.CREATE_RUNNER: "tasks.create_lease",
    TaskKind.STOP_RUNNER: "tasks.stop_lease",
    TaskKind.REMOVE_RUNNER: "tasks.remove_lease",
}

# AGENT-06 (the controller's half): a create for a runner in one of these states would
# start a workload nobody wants, so it is cancelled instead of delivered.
SKIP_CREATE_FOR = frozenset({RunnerState.DRAINING, RunnerState.FAILED, RunnerState.REMOVED})


# A sealed env value in a task row: this prefix, then `accounts.sealing.seal`'s "v1:..." text.
SEALED_PREFIX = "sealed:"
FINAL_TASK_STATES = (TaskState.DONE, TaskState.FAILED, TaskState.ABANDONED, TaskState.CANCELLED)

# TASK-08: a failed or abandoned remove is issued again this long after it ended, doubling
# with each further failure up to the ceiling, so a host that keeps failing one is asked at
# most once a minute and a runner whose removal never succeeds costs a few rows an hour.
REMOVE_RETRY_BACKOFF = timedelta(minutes=1)
MAX_REMOVE_RETRY_BACKOFF = timedelta(minutes=15)
# The phases only an agent's end report leaves on a runner row (RUN-15): once the agent has
# said how a runner ended it deletes the workload itself (AGENT-18), so no remove is owed.
AGENT_ENDED_PHASES = ("exited", "missing")
STOP_UNCONFIRMED = "the host never reported the runner gone after its stop"


def lease_for(kind: str):
    from zoomies_site import registry

    return registry.get(LEASE_SETTING[TaskKind(kind)])


def enqueue_task(
    *, host_id: int, runner_id: int | None, kind: str, payload: dict, now: datetime
) -> AgentTask:
    from zoomies_site import registry

    task = AgentTask.objects.create(
        host_id=host_id,
        runner_id=runner_id,
        kind=kind,
        payload=seal_env(payload),
        state=TaskState.PENDING,
        attempt=0,
        max_attempts=registry.get("tasks.max_attempts"),
        lease_seconds=int(lease_for(kind).total_seconds()),
        created_at=now,
    )
    notify_host_on_commit(host_id)
    return task


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
    own (TLS) connection. Raises accounts.sealing.SealError when a value cannot be unsealed."""
    payload = task.payload
    env = payload.get("env") if isinstance(payload, dict) else None
    if not isinstance(env, dict):
        return payload
    return {**payload, "env": {key: _unsealed(value) for key, value in env.items()}}


def _unsealed(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(SEALED_PREFIX):
        return unseal_text(value[len(SEALED_PREFIX) :])
    return value  # a row written before env was sealed


def blank_env(**scope: Any) -> int:
    """Drop `env` from the final tasks among `scope` (every final task when none is given):
    a finished task's credential is spent or unused, and the row outlives it. The names stay,
    as `env_keys`. Returns how many rows were blanked."""
    blanked = 0
    finished = AgentTask.objects.filter(state__in=FINAL_TASK_STATES, payload__has_key="env")
    for task in finished.filter(**scope).only("pk", "payload"):
        payload = dict(task.payload)
        env = payload.pop("env")
        if isinstance(env, dict):
            payload["env_keys"] = sorted(env)
        blanked += AgentTask.objects.filter(pk=task.pk, state__in=FINAL_TASK_STATES).update(
            payload=payload
        )
    return blanked


def notify_host_on_commit(host_id: int) -> None:
    """Wake this process's polls for `host_id` once the task is visible to them."""
    from fleet.wakeups import notify_host

    transaction.on_commit(lambda: notify_host(host_id))


def take_tasks(host: Host | int, now: datetime, limit: int = 10) -> list[AgentTask]:
    """Put up to `limit` of the host's pending tasks in flight, oldest first, and return them.

    Each delivery is stamped: attempt + 1, `taken_at`, and a lease deadline from the task's
    own lease. The move is a compare-and-set from pending, so two polls racing for one
    host never both take a task.
    """
    host_id = host if isinstance(host, int) else host.pk
    pending = AgentTask.objects.filter(host_id=host_id, state=TaskState.PENDING)
    # A cheap read first: an idle host's poll must not take the write lock every time.
    candidates = list(
        pending.select_related("runner").order_by("created_at", "pk")[: max(limit, 0)]
    )
    if not candidates:
        return []
    taken: list[int] = []
    with transaction.atomic():
        for task in candidates:
            runner = task.runner
            if task.kind == TaskKind.CREATE_RUNNER and runner and runner.state in SKIP_CREATE_FOR:
                _cancel_pending(task, now, f"its runner is {runner.state}")
                continue
            moved = AgentTask.objects.filter(pk=task.pk, state=TaskState.PENDING).update(
                state=TaskState.IN_FLIGHT,
                attempt=F("attempt") + 1,
                taken_at=now,
                lease_deadline=now + timedelta(seconds=task.lease_seconds),
            )
            if moved:
                taken.append(task.pk)
    if not taken:
        return []
    return list(AgentTask.objects.filter(pk__in=taken).order_by("created_at", "pk"))


def _cancel_pending(task: AgentTask, now: datetime, why: str) -> bool:
    cancelled = AgentTask.objects.filter(pk=task.pk, state=TaskState.PENDING).update(
        state=TaskState.CANCELLED, finished_at=now, error=why
    )
    if cancelled:
        blank_env(pk=task.pk)
        audit.record(
            actor="system:taskqueue",
            action="task.cancelled",
            target=task,
            detail={"kind": task.kind, "runner": task.runner_id, "reason": why},
            at=now,
        )
    return bool(cancelled)


def sweep_tasks(now: datetime) -> list[str]:
    """Re-queue or abandon every in-flight task whose lease has ended; say what was done.

    TASK-02: back on its host's queue while it has offers left. TASK-04: after
    `max_attempts` offers it is abandoned. TASK-05: an abandoned stop fails its runner,
    since nothing else would notice it. TASK-06: an abandoned create is left to the
    runner's provision timeout, which explains it on the Runners page.
    """
    reasons: list[str] = []
    expired = (
        AgentTask.objects.filter(state=TaskState.IN_FLIGHT, lease_deadline__lte=now)
        .select_related("host", "runner")
        .order_by("lease_deadline", "pk")
    )
    for task in expired:
        reason = _sweep_one(task, now)
        if reason:
            reasons.append(reason)
    return reasons


def _sweep_one(task: AgentTask, now: datetime) -> str | None:
    # Imported here: runners.lifecycle imports this module to enqueue its tasks.
    from runners.lifecycle import fail_runner

    label = f"{task.kind} #{task.pk} for host {task.host.name}"
    with transaction.atomic():
        expired = AgentTask.objects.filter(
            pk=task.pk, state=TaskState.IN_FLIGHT, attempt=task.attempt, lease_deadline__lte=now
        )
        if task.attempt < task.max_attempts:
            if not expired.update(state=TaskState.PENDING, lease_deadline=None):
                return None  # its result arrived meanwhile
            reason = f"{label}: lease ended without a result; offered again ({task.attempt + 1})"
            audit.record(
                actor=SWEEP_ACTOR,
                action="task.requeued",
                target=task,
                detail={"kind": task.kind, "attempt": task.attempt, "reason": reason},
                at=now,
            )
            notify_host_on_commit(task.host_id)
            return reason
        error = f"no result after {task.attempt} offers"
        if not expired.update(
            state=TaskState.ABANDONED, lease_deadline=None, finished_at=now, error=error
        ):
            return None
        blank_env(pk=task.pk)
        reason = f"{label}: abandoned, {error}"
        audit.record(
            actor=SWEEP_ACTOR,
            action="task.abandoned",
            target=task,
            detail={"kind": task.kind, "attempt": task.attempt, "reason": reason},
            at=now,
        )
        if task.kind == TaskKind.STOP_RUNNER and task.runner is not None:
            message = f"host never confirmed the stop after {task.attempt} attempts"
            result = fail_runner(task.runner, now=now, actor=SWEEP_ACTOR, message=message)
            if result.changed:
                reason += f"; runner {task.runner.name} failed: {message}"
        elif task.kind == TaskKind.CREATE_RUNNER:
            reason += "; left to the runner's provision timeout"
    log.info("task sweep: %s", reason)
    return reason


# -- work still owed to hosts, rebuilt from rows (TASK-05, TASK-08) ------------------------


def removes_owed() -> QuerySet:
    """Runners whose host still owes a removal nobody is asking for: a remove was issued,
    the last one failed or was abandoned, none succeeded and none is open, the agent has not
    reported the runner's end itself, and its host is still there and not lost.

    A lost or deleted host is given up on: nothing would take the task, and a host that
    comes back reaps what it has no record of (AGENT-16).
    """
    from runners.models import Runner

    removes = AgentTask.objects.filter(runner=OuterRef("pk"), kind=TaskKind.REMOVE_RUNNER)
    return (
        Runner.objects.filter(host__isnull=False)
        .exclude(host__health=HostHealth.LOST)
        .exclude(phase__in=AGENT_ENDED_PHASES)
        .filter(Exists(removes.filter(state__in=[TaskState.FAILED, TaskState.ABANDONED])))
        .exclude(Exists(removes.filter(state__in=[*OPEN_TASK_STATES, TaskState.DONE])))
    )


def remove_retry_backoff(failures: int) -> timedelta:
    """The wait after the `failures`-th failed or abandoned remove: 1 min, doubling, 15 min."""
    return min(REMOVE_RETRY_BACKOFF * 2 ** max(failures - 1, 0), MAX_REMOVE_RETRY_BACKOFF)


def reissue_owed_removes(now: datetime) -> list[str]:
    """TASK-08: issue a remove again for every runner its host still owes one, once the
    backoff since the last failed or abandoned one has passed; say what was issued."""
    reasons: list[str] = []
    for runner in removes_owed().select_related("host").order_by("pk"):
        ended = list(
            AgentTask.objects.filter(
                runner=runner,
                kind=TaskKind.REMOVE_RUNNER,
                state__in=[TaskState.FAILED, TaskState.ABANDONED],
            ).values_list("finished_at", flat=True)
        )
        last = max((t for t in ended if t is not None), default=None)
        if last is not None and now < last + remove_retry_backoff(len(ended)):
            continue
        with transaction.atomic():
            # Checked again under the write lock: a result or another tick may have settled it.
            if not removes_owed().filter(pk=runner.pk).exists():
                continue
            task = enqueue_task(
                host_id=runner.host_id,
                runner_id=runner.pk,
                kind=TaskKind.REMOVE_RUNNER,
                payload={"runner_id": runner.pk, "retry": len(ended)},
                now=now,
            )
            reason = (
                f"remove_runner #{task.pk} for runner {runner.name} on host {runner.host.name}: "
                f"issued again (retry {len(ended)}); the host has not confirmed the removal"
            )
            audit.record(
                actor=SWEEP_ACTOR,
                action="task.reissued",
                target=task,
                detail={"kind": task.kind, "runner": runner.pk, "retry": len(ended)},
                at=now,
            )
        log.info("task sweep: %s", reason)
        reasons.append(reason)
    return reasons


def fail_unconfirmed_stops(now: datetime) -> list[str]:
    """TASK-05: a draining runner whose stop its host answered (or gave up on) a stop lease
    ago, with no end report since, is failed: nothing else would ever end it, and failing it
    frees its slot and asks the host to remove what is left."""
    from runners.lifecycle import fail_runner
    from runners.models import Runner

    cutoff = now - lease_for(TaskKind.STOP_RUNNER)
    stops = AgentTask.objects.filter(runner=OuterRef("pk"), kind=TaskKind.STOP_RUNNER)
    stuck = (
        Runner.objects.filter(state=RunnerState.DRAINING, host__isnull=False)
        .filter(Exists(stops.filter(state__in=[TaskState.DONE, TaskState.ABANDONED])))
        # Every stop it was sent ended before the cutoff, and none is still open.
        .exclude(Exists(stops.filter(state__in=OPEN_TASK_STATES)))
        .exclude(
            Exists(
                stops.filter(
                    state__in=[TaskState.DONE, TaskState.ABANDONED], finished_at__gt=cutoff
                )
            )
        )
        .order_by("pk")
    )
    reasons: list[str] = []
    for runner in stuck:
        result = fail_runner(
            runner,
            now=now,
            actor=SWEEP_ACTOR,
            message=STOP_UNCONFIRMED,
            expected_from=[RunnerState.DRAINING],
        )
        if result.changed:
            reason = f"runner {runner.name} failed: {STOP_UNCONFIRMED}"
            log.info("task sweep: %s", reason)
            reasons.append(reason)
    return reasons
