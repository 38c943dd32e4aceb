"""The runners app's answers to what the fleet reports about hosts and agents: the
implementation of `fleet.runner_side.RunnerSide`, registered at start (runners/apps.py).

Each function is a thin door onto the runners' own actions; the fleet calls them inside
its own transactions and never imports this app (issue 22 item 1).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef

from fleet import protocol
from fleet.memory_planner import RunnerMemory
from fleet.models import AgentTask, Host
from fleet.states import OPEN_TASK_STATES, TaskKind, TaskState
from runners import auto_pools
from runners.actions import steps
from runners.actions.lifecycle import settle_abandoned_tasks
from runners.actions.reports import apply_agent_reports
from runners.models import Job, Pool, Runner
from runners.states import LIVE_STATES, JobStatus, RunnerState
from zoomies_site.core.events import emit

log = logging.getLogger("zoomies.runners")

__all__ = ["LIVE_STATES"]


def fail_live_runners(
    host: Host, *, now: datetime, actor: str, message: str, job_failure: str
) -> list[str]:
    return steps.fail_live_runners(
        host, now=now, actor=actor, message=message, job_failure=job_failure
    )


def host_joined(host: Host, *, now: datetime) -> None:
    """A host joined (or joined again): the automatic pools may owe a new platform a pool
    (SCHED-30's wake, a hint; the next timed pass would see it too)."""
    auto_pools.wake_auto_pools()


def host_lost(host: Host, *, now: datetime, actor: str, why: str) -> list[str]:
    """HOST-04: every runner still live on a lost host fails, with the words
    `steps.revive_after_host_loss` recognises should the host prove to have run on."""
    return steps.fail_live_runners(
        host,
        now=now,
        actor=actor,
        message=f"{steps.host_lost_prefix(host.name)}{why}",
        job_failure=steps.HOST_LOST_JOB_FAILURE,
    )


def host_back_from_lost(host: Host, *, now: datetime, actor: str) -> list[str]:
    """Issue 11 item 4: a host back from lost keeps the workloads still running jobs."""
    return steps.spare_busy_workloads(host, now=now, actor=actor)


def drain_host_runners(host: Host, *, now: datetime, actor: str, reason: str) -> list[str]:
    """Drain every live runner on `host` not draining yet; the names of those moved."""
    drained = []
    live = Runner.objects.filter(host=host, state__in=list(LIVE_STATES)).exclude(
        state=RunnerState.DRAINING
    )
    for runner in live:
        if steps.drain(runner, now=now, actor=actor, reason=reason).changed:
            drained.append(runner.name)
    return drained


def task_failed(task: AgentTask, *, error: str, now: datetime, actor: str) -> None:
    steps.runner_task_failed(task, error=error, now=now, actor=actor)


def tasks_abandoned(tasks: Iterable[AgentTask], *, now: datetime) -> list[str]:
    return settle_abandoned_tasks(tasks, now=now)


def adopted_after_loss(
    host: Host, *, runner_ids: Iterable[int], now: datetime, actor: str
) -> list[str]:
    """Issue 21 item 20: runners a returning agent adopted, put back to the truth."""
    return steps.revive_after_host_loss(
        host, runners=Runner.objects.filter(host=host, pk__in=list(runner_ids)), now=now,
        actor=actor,
    )  # fmt: skip


def memory_of_runners(host: Host) -> list[RunnerMemory]:
    """HOST-25: each live runner on `host` with what it was given and what it was lent."""
    rows = Runner.objects.filter(host=host, state__in=list(LIVE_STATES)).values_list(
        "pk", "state", "memory_mb", "lent_memory_mb"
    )
    return [RunnerMemory(pk, state, memory, lent) for pk, state, memory, lent in rows]


def queued_start_memory(host: Host) -> int:
    """HOST-25's held-back start: with a job queued and a slot free on `host`, the most
    memory a new runner there could be given (a pool's typed figure, twice for a dind pair,
    or one slot's share of the host); 0 otherwise."""
    live = Runner.objects.filter(host=host, state__in=list(LIVE_STATES)).count()
    if live >= host.capacity or not Job.objects.filter(status=JobStatus.QUEUED).exists():
        return 0
    share = (host.memory_mb or 0) // max(1, host.capacity)
    typed = [
        (memory or 0) * (2 if dind else 1)
        for memory, dind in Pool.objects.filter(
            paused=False, backend__in=list(host.backends or []), memory_mb__isnull=False
        ).values_list("memory_mb", "dind")
    ]
    return max([share, *typed])


def record_memory_loans(host: Host, loans: Mapping[int, int], *, observed: bool = False) -> int:
    """HOST-29: each live runner of `host` named in `loans` records what its agent's valve
    lent it, only ever upwards (a loan is never taken back, and a report that arrives late
    says less than one that came before it). HOST-31: `observed` loans, an observing
    valve's, were never made: they go to their own column, which nothing charges. Answers
    how many rows rose."""
    moved = 0
    for runner_id, lent_mb in sorted(loans.items()):
        live = Runner.objects.filter(pk=runner_id, host=host, state__in=list(LIVE_STATES))
        if observed:
            moved += live.filter(would_lend_memory_mb__lt=lent_mb).update(
                would_lend_memory_mb=lent_mb
            )
        else:
            moved += live.filter(lent_memory_mb__lt=lent_mb).update(lent_memory_mb=lent_mb)
    return moved


# HOST-32 (memoryBlockedFor): how long a runner's refused raise is remembered and shown.
MEMORY_BLOCKED_FOR = timedelta(minutes=15)


def record_memory_blocked(host: Host, blocked: Mapping[int, str], *, now: datetime) -> int:
    """HOST-32: each live runner of `host` whose needed raise the rules refused keeps why,
    and when, for MEMORY_BLOCKED_FOR (the runner's API shows it that long)."""
    moved = 0
    for runner_id, why in sorted(blocked.items()):
        rows = Runner.objects.filter(pk=runner_id, host=host, state__in=list(LIVE_STATES))
        # A new refusal is announced and logged once; the same one again only renews when.
        fresh = rows.exclude(memory_blocked=why[:300])
        if fresh.update(memory_blocked=why[:300], memory_blocked_at=now):
            log.info("host %s: runner %s's memory raise was refused: %s", host.name, runner_id, why)
            emit("runner.memory_blocked", Runner(pk=runner_id), at=now)
            moved += 1
        else:
            rows.update(memory_blocked_at=now)
    return moved


def memory_blocked_now(runner: Runner, now: datetime) -> str:
    """The runner's refused raise while it is remembered, else ""."""
    at = runner.memory_blocked_at
    return runner.memory_blocked if at is not None and now - at < MEMORY_BLOCKED_FOR else ""


def apply_reports(*, host: Host, reports: Any, now: datetime) -> tuple[list[int], list[int]]:
    return apply_agent_reports(host=host, reports=reports, now=now)


def expected_runners(host: Host, now: datetime) -> list[protocol.ExpectedRunner]:
    """The inventory's answer: every live runner recorded on `host` that no open create will
    start, so its workload should be there. Each one's age counts from the latest moment its
    workload can have been made: its create's answer, else its last delivery, else the row's
    birth."""
    open_create = AgentTask.objects.filter(
        runner_id=OuterRef("pk"), kind=TaskKind.CREATE_RUNNER, state__in=OPEN_TASK_STATES
    )
    runners = list(
        Runner.objects.filter(host=host, state__in=list(LIVE_STATES))
        .exclude(Exists(open_create))
        .values("pk", "state", "created_at", "pool__backend")
        .order_by("pk")
    )
    made = {r["pk"]: r["created_at"] for r in runners}
    creates = AgentTask.objects.filter(
        runner_id__in=list(made), kind=TaskKind.CREATE_RUNNER
    ).values_list("runner_id", "state", "taken_at", "finished_at")
    for runner_id, state, taken_at, finished_at in creates:
        # Only a done create's end is an answer; any other ended when the controller said.
        answered = finished_at if state == TaskState.DONE else None
        moments = [m for m in (taken_at, answered) if m is not None]
        made[runner_id] = max([made[runner_id], *moments])
    return [
        protocol.ExpectedRunner(
            runner_id=r["pk"],
            backend=r["pool__backend"],
            state=r["state"],
            age=max((now - made[r["pk"]]).total_seconds(), 0.0),
        )
        for r in runners
    ]
