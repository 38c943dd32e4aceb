"""Runner actions: create, drain, fail, remove, reap, and what housekeeping owes runners.

Each public function is one durable transaction that moves its rows through
`runners.actions.steps` and writes its audit rows; loops, views and the agent API call
them alike.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from accounts import audit
from fleet import protocol
from fleet.agent.backends.resources import FROM_HOST, FROM_POOL
from fleet.models import AgentTask
from fleet.states import OPEN_TASK_STATES, TaskKind, TaskState
from fleet.taskqueue import enqueue_task, lease_for
from runners.actions import steps
from runners.actions.installations import note_registered_repository
from runners.models import Installation, Pool, Runner
from runners.selectors import removes_owed, unconfirmed_stops, unlinked_exits
from runners.states import RunnerState
from runners.transitions import TransitionResult, transition_runner
from zoomies_site.core import registry
from zoomies_site.core.events import emit, emit_many

log = logging.getLogger("zoomies.runners")

HOUSEKEEPING = "system:housekeeping"
STOP_UNCONFIRMED = "the host never reported the runner gone after its stop"

# TASK-08: a failed or abandoned remove is issued again this long after it ended, doubling
# with each further failure up to the ceiling, so a host that keeps failing one is asked at
# most once a minute and a runner whose removal never succeeds costs a few rows an hour.
REMOVE_RETRY_BACKOFF = timedelta(minutes=1)
MAX_REMOVE_RETRY_BACKOFF = timedelta(minutes=15)


@dataclass(frozen=True)
class NewRunner:
    """What the reconcile pass decided and GitHub minted for one runner (SCHED-15/16)."""

    name: str
    pool: Pool
    host_id: int
    installation: Installation
    image: str
    cpus: float | None
    memory_mb: int | None
    github_runner_id: int | None
    env: dict[str, str]
    command: list[str] | None
    reason: str
    placement: str = ""


def given_by(pool_figure: float | None, figure: float | None) -> str:
    """BACK-09: "pool" for a figure the pool typed, "host" for a slot share, "" for none."""
    if figure is None:
        return ""
    return FROM_POOL if pool_figure is not None else FROM_HOST


def create_runner(new: NewRunner, *, now: datetime, actor: str) -> Runner:
    """The provisioning row and its create task, in one transaction (SCHED-16)."""
    return create_runners([new], now=now, actor=actor)[0]


def create_runners(news: list[NewRunner], *, now: datetime, actor: str) -> list[Runner]:
    """Several runners, each its row and its create task (SCHED-16), in one transaction: a
    burst's mints come back together, and a transaction each was a wait for SQLite's write
    lock each, ahead of the agent's takes (issue 28). All of them or none."""
    with transaction.atomic(durable=True):
        return [_write_runner(new, now=now, actor=actor) for new in news]


def _write_runner(new: NewRunner, *, now: datetime, actor: str) -> Runner:
    pool = new.pool
    # BACK-09: a figure the pool typed is the pool's; any other is the host's slot share.
    cpus_from = given_by(pool.cpus, new.cpus)
    memory_from = given_by(pool.memory_mb, new.memory_mb)
    if pool.repository and new.installation is not None:
        note_registered_repository(new.installation.pk, pool.repository)
    runner = Runner.objects.create(
        name=new.name,
        pool=pool,
        host_id=new.host_id,
        installation=new.installation,
        state=RunnerState.PROVISIONING,
        created_at=now,
        state_changed_at=now,
        github_runner_id=new.github_runner_id,
        image=new.image,
        cpus=new.cpus,
        memory_mb=new.memory_mb,
        cpus_from=cpus_from,
        memory_from=memory_from,
        ephemeral=pool.ephemeral,
        message=new.reason,
    )
    enqueue_task(
        host_id=new.host_id,
        runner_id=runner.pk,
        kind=TaskKind.CREATE_RUNNER,
        payload=protocol.CreateRunnerPayload(
            runner_id=runner.pk,
            runner_name=runner.name,
            pool=pool.name,
            backend=pool.backend,
            image=new.image,
            command=None if new.command is None else tuple(new.command),
            env=new.env,
            cpus=new.cpus,
            memory_mb=new.memory_mb,
            cpus_from=cpus_from or None,
            memory_from=memory_from or None,
            dind=pool.dind,
            ephemeral=pool.ephemeral,
        ).to_json(),
        now=now,
    )
    audit.record(
        actor=actor,
        action="runner.provisioning",
        target=runner,
        detail={"reason": new.reason, "placement": new.placement},
        at=now,
    )
    emit("runner.created", runner, at=now)
    return runner


def drain_runner(
    runner: Runner,
    *,
    now: datetime,
    actor: str,
    reason: str,
    expected_from: Iterable[str] | None = None,
    deregistered_at: datetime | None = None,
) -> TransitionResult:
    """Tell a runner to stop taking work and exit; its host gets a stop task (RUN-11)."""
    with transaction.atomic(durable=True):
        return steps.drain(
            runner,
            now=now,
            actor=actor,
            reason=reason,
            expected_from=expected_from,
            deregistered_at=deregistered_at,
        )


def defer_idle_drain(
    runner: Runner, *, until: datetime, now: datetime, actor: str, reason: str
) -> bool:
    """GitHub says the runner is running a job (422 to the idle drain's DELETE): leave it
    alone until `until` instead of asking on every pass (issue 8 item 7). The end of its job
    clears the wait (`steps.finish_job_runner`). True if this call set it."""
    with transaction.atomic(durable=True):
        moved = Runner.objects.filter(pk=runner.pk, state=RunnerState.IDLE).update(
            drain_deferred_until=until
        )
        if moved:
            audit.record(
                actor=actor,
                action="runner.drain_deferred",
                target=runner,
                detail={"until": until.isoformat(), "reason": reason},
                at=now,
            )
    return bool(moved)


def note_registration_id(runner: Runner, github_runner_id: int) -> bool:
    """A config.sh runner's registration id, found at GitHub by its name (SCHED-15): kept
    once, for its deregistration. True if this call kept it."""
    kept = Runner.objects.filter(pk=runner.pk, github_runner_id__isnull=True).update(
        github_runner_id=github_runner_id
    )
    runner.github_runner_id = github_runner_id
    return bool(kept)


def note_runner_online(runner: Runner, *, now: datetime, actor: str) -> bool:
    """GitHub shows the runner's registration online (issue 29 item 1): stamp `online_at`
    once, and a runner still registering becomes idle. A runner is idle only once GitHub
    says so: its process running proves nothing (one that cannot reach GitHub retries for
    ever). True if this call stamped it."""
    with transaction.atomic(durable=True):
        stamped = Runner.objects.filter(pk=runner.pk, online_at__isnull=True).update(online_at=now)
        if not stamped:
            return False
        current = Runner.objects.filter(pk=runner.pk).values_list("state", flat=True).first()
        moved = (
            current == RunnerState.REGISTERING
            and transition_runner(
                runner.pk,
                RunnerState.IDLE,
                now=now,
                actor=actor,
                reason="GitHub shows it online",
                expected_from=[RunnerState.REGISTERING],
            ).changed
        )
        if not moved:
            # Already idle (its process said it was running) or past it: the stamp is news.
            audit.record(actor=actor, action="runner.online", target=runner,
                         detail={"reason": "GitHub shows it online"}, at=now)  # fmt: skip
            emit("runner.online", runner, at=now)
    return True


def note_registration_gone(
    runner: Runner, *, now: datetime, actor: str, answer: str, retry_at: datetime | None = None
) -> None:
    """What GitHub answered when asked to delete an ended runner's registration (issue 29
    item 4): "deleted" or "gone" stamps `deregistered_at`; anything else waits until
    `retry_at` before it is asked again (`drain_deferred_until`)."""
    with transaction.atomic(durable=True):
        if answer in ("deleted", "gone"):
            Runner.objects.filter(pk=runner.pk, deregistered_at__isnull=True).update(
                deregistered_at=now, drain_deferred_until=None
            )
            if answer == "deleted":
                audit.record(actor=actor, action="runner.deregistered", target=runner,
                             detail={"github_runner_id": runner.github_runner_id,
                                     "state": runner.state}, at=now)  # fmt: skip
        else:
            Runner.objects.filter(pk=runner.pk).update(drain_deferred_until=retry_at)


def fail_runner(
    runner: Runner,
    *,
    now: datetime,
    actor: str,
    message: str,
    reason: str = "",
    expected_from: Iterable[str] | None = None,
) -> TransitionResult:
    """Fail a runner with a sentence saying why; its host is asked to clean up the workload."""
    with transaction.atomic(durable=True):
        return steps.fail(
            runner,
            now=now,
            actor=actor,
            message=message,
            reason=reason,
            expected_from=expected_from,
        )


def remove_runner(
    runner: Runner,
    *,
    now: datetime,
    actor: str,
    reason: str,
    expected_from: Iterable[str] | None = None,
) -> TransitionResult:
    """Runner -> removed: its workload is gone, or it was failed and its retention is over."""
    with transaction.atomic(durable=True):
        return transition_runner(
            runner.pk,
            RunnerState.REMOVED,
            now=now,
            actor=actor,
            reason=reason,
            expected_from=expected_from,
        )


def expire_failed_runners(now: datetime) -> list[str]:
    """RUN-10: a failed runner stays listed for the failed retention, then is removed."""
    cutoff = now - registry.get("scheduler.failed_retention")
    lines = []
    for runner in Runner.objects.filter(state=RunnerState.FAILED, finished_at__lte=cutoff):
        if remove_runner(
            runner,
            now=now,
            actor=HOUSEKEEPING,
            reason="failed retention over",
            expected_from=[RunnerState.FAILED],
        ).changed:
            lines.append(f"{runner.name}: failed retention over, removed")
    return lines


def reap_removed_runners(now: datetime) -> list[str]:
    """RUN-19: a removed runner's row is reaped once nothing still owes it work, and, when
    it left the end of its output, once that has been readable for the failed retention.

    Jobs keep the runner's name, so a finished job still says which runner ran it.
    """
    # An unexplained clean exit is kept while the scheduler still counts it (it stands for
    # a job whose news has not arrived yet).
    waiting = set(
        unlinked_exits(now, registry.get("scheduler.unlinked_exit_grace")).values_list(
            "pk", flat=True
        )
    )
    # TASK-08: a remove the host still owes (its last failed or was abandoned, none
    # succeeded) keeps the row, or the intent would be lost with it (its tasks go too).
    owed = set(removes_owed().filter(state=RunnerState.REMOVED).values_list("pk", flat=True))
    # A task still on its way to the host keeps the row too (TASK-08).
    open_tasks = AgentTask.objects.filter(runner_id=OuterRef("pk"), state__in=OPEN_TASK_STATES)
    # The end of a finished runner's output is readable for the failed retention, as a
    # failed runner's is: its workload and log are gone, and the row is all that is left.
    kept_output = Q(finished_at__gt=now - registry.get("scheduler.failed_retention")) & ~Q(
        output_tail=""
    )
    reapable = (
        Runner.objects.filter(state=RunnerState.REMOVED)
        .exclude(pk__in=waiting | owed)
        .exclude(Exists(open_tasks))
        .exclude(kept_output)
    )
    with transaction.atomic(durable=True):
        rows = dict(reapable.values_list("name", "pk"))
        names = list(rows)
        if not names:
            return []
        # One DELETE, guarded by the same filter, so a row that moved meanwhile is kept.
        reapable.filter(name__in=names).delete()
        emit_many("runner.reaped", Runner, rows.values(), at=now)
        audit.record(
            actor=HOUSEKEEPING,
            action="runner.reaped",
            detail={"names": names[:200], "count": len(names)},
            at=now,
        )
    return [f"{name}: reaped" for name in names]


def settle_abandoned_tasks(tasks: Iterable[AgentTask], *, now: datetime) -> list[str]:
    """What the task sweep's abandoned tasks mean for their runners.

    TASK-05: an abandoned stop fails its runner, since nothing else would notice it.
    TASK-06: an abandoned create is left to the runner's provision timeout, which explains
    it on the Runners page.
    """
    lines: list[str] = []
    for task in tasks:
        runner = Runner.objects.filter(pk=task.runner_id).first() if task.runner_id else None
        if task.kind == TaskKind.STOP_RUNNER and runner is not None:
            message = f"host never confirmed the stop after {task.attempt} attempts"
            if fail_runner(runner, now=now, actor=HOUSEKEEPING, message=message).changed:
                lines.append(f"stop_runner #{task.pk}: runner {runner.name} failed: {message}")
        elif task.kind == TaskKind.CREATE_RUNNER and runner is not None:
            lines.append(
                f"create_runner #{task.pk}: runner {runner.name} left to its provision timeout"
            )
    for line in lines:
        log.info("task sweep: %s", line)
    return lines


def fail_unconfirmed_stops(now: datetime) -> list[str]:
    """TASK-05: a draining runner whose stop its host answered (or gave up on) a stop lease
    ago, with no end report since, is failed: nothing else would ever end it, and failing it
    frees its slot and asks the host to remove what is left."""
    reasons: list[str] = []
    for runner in unconfirmed_stops(now - lease_for(TaskKind.STOP_RUNNER)):
        result = fail_runner(
            runner,
            now=now,
            actor=HOUSEKEEPING,
            message=STOP_UNCONFIRMED,
            expected_from=[RunnerState.DRAINING],
        )
        if result.changed:
            reason = f"runner {runner.name} failed: {STOP_UNCONFIRMED}"
            log.info("task sweep: %s", reason)
            reasons.append(reason)
    return reasons


def remove_retry_backoff(failures: int) -> timedelta:
    """The wait after the `failures`-th failed or abandoned remove: 1 min, doubling, 15 min."""
    wait: timedelta = REMOVE_RETRY_BACKOFF * 2 ** max(failures - 1, 0)
    return min(wait, MAX_REMOVE_RETRY_BACKOFF)


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
        with transaction.atomic(durable=True):
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
                actor=HOUSEKEEPING,
                action="task.reissued",
                target=task,
                detail={"kind": task.kind, "runner": runner.pk, "retry": len(ended)},
                at=now,
            )
        log.info("task sweep: %s", reason)
        reasons.append(reason)
    return reasons
