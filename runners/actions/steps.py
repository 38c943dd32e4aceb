"""The building blocks of runner and job actions, run inside an action's transaction.

Each is a step, not an action: it opens no transaction of its own that would commit on
its own, so an action (here, or a fleet action whose change ends runners, such as a host
joining again or being lost) composes them into one transaction with its own rows. Every
runner move is `runners.transitions.transition_runner`; every task is enqueued or cancelled
through `fleet.taskqueue`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from accounts import audit
from fleet.models import AgentTask, Host
from fleet.states import OPEN_TASK_STATES, HostHealth, TaskKind, TaskState
from fleet.taskqueue import cancel_tasks, enqueue_task, enqueue_tasks
from runners.models import Job, Runner
from runners.states import JOB_RANK, LIVE_STATES, JobStatus, RunnerState
from runners.transitions import (
    RunnerMove,
    TransitionResult,
    revive_runner,
    transition_read_runners,
    transition_runner,
)
from zoomies_site.core import registry
from zoomies_site.core.events import emit

log = logging.getLogger("zoomies.runners")


def _has_open_task(runner: Runner, kind: str) -> bool:
    return runner.tasks.filter(kind=kind, state__in=OPEN_TASK_STATES).exists()


def drain(
    runner: Runner,
    *,
    now: datetime,
    actor: str,
    reason: str,
    expected_from: Iterable[str] | None = None,
    deregistered_at: datetime | None = None,
) -> TransitionResult:
    """Runner -> draining, and its host gets a stop task.

    A busy runner is given `runners.drain_grace` to finish its job before it is signalled
    (RUN-11); any other runner is signalled at once. Whether it was busy is read from the
    row the transition moved, never from the caller's copy. A create still waiting for the
    agent is cancelled: it would start a workload nobody wants (AGENT-06). `deregistered_at`
    records that GitHub confirmed the registration deleted (an idle drain).
    """
    result = transition_runner(
        runner.pk,
        RunnerState.DRAINING,
        now=now,
        actor=actor,
        reason=reason,
        expected_from=expected_from,
        extra={"deregistered_at": deregistered_at} if deregistered_at else None,
    )
    if not result.changed or not runner.host_id:
        return result
    cancel_tasks(
        runner.tasks.filter(kind=TaskKind.CREATE_RUNNER, state=TaskState.PENDING),
        now=now,
        actor=actor,
        reason="its runner is draining",
    )
    if not _has_open_task(runner, TaskKind.STOP_RUNNER):
        enqueue_task(**_stop_task(runner, was_busy=result.previous == RunnerState.BUSY, now=now))
    return result


def _stop_task(runner: Runner, *, was_busy: bool, now: datetime) -> dict[str, Any]:
    """A draining runner's stop task, as `enqueue_task`'s keywords: a busy runner is given
    `runners.drain_grace` to finish its job (RUN-11), any other is signalled at once."""
    grace = registry.get("runners.drain_grace") if was_busy else timedelta(0)
    return {
        "host_id": runner.host_id,
        "runner_id": runner.pk,
        "kind": TaskKind.STOP_RUNNER,
        "payload": {
            "runner_id": runner.pk,
            "grace": int(grace.total_seconds()),
            "timeout": int(registry.get("agent.stop_margin").total_seconds()),
        },
        "now": now,
    }


def fail(
    runner: Runner,
    *,
    now: datetime,
    actor: str,
    message: str,
    reason: str = "",
    expected_from: Iterable[str] | None = None,
) -> TransitionResult:
    """Runner -> failed with a sentence saying why; its host is asked to clean up."""
    result = transition_runner(
        runner.pk,
        RunnerState.FAILED,
        now=now,
        actor=actor,
        reason=reason or message,
        message=message,
        expected_from=expected_from,
    )
    if not result.changed or not runner.host_id:
        return result
    # A create still waiting for the agent would start a doomed workload.
    cancel_tasks(
        runner.tasks.filter(kind=TaskKind.CREATE_RUNNER, state=TaskState.PENDING),
        now=now,
        actor=actor,
        reason="its runner failed",
    )
    if not _has_open_task(runner, TaskKind.REMOVE_RUNNER):
        enqueue_task(
            host_id=runner.host_id,
            runner_id=runner.pk,
            kind=TaskKind.REMOVE_RUNNER,
            payload={"runner_id": runner.pk},
            now=now,
        )
    return result


# What a lost host's runners and jobs are failed with (fleet.health, HOST-04), here so that
# the one failure a returning host can prove wrong is recognised by the same words.
HOST_LOST_JOB_FAILURE = "its runner's host was lost"


def host_lost_prefix(host_name: str) -> str:
    """The start of the failure message of a runner failed because its host was lost."""
    return f"host {host_name} lost: "


def mark_fleet_failure(runners: Iterable[Runner], *, reason: str, now: datetime, actor: str) -> int:
    """HOST-04: a job still running on one of `runners` is marked as the fleet's failure.

    The one writer of `Job.fleet_failure` (with `clear_fleet_failure`, its undo when a host
    loss proves wrong): a compare-and-set from blank, so a job keeps the first reason it
    was given.
    """
    runners = list(runners)
    if not runners:
        return 0
    jobs = list(
        Job.objects.filter(
            Q(runner__in=runners) | Q(runner_name__in=[r.name for r in runners]),
            fleet_failure="",
        ).exclude(status=JobStatus.COMPLETED)
    )
    marked = 0
    for job in jobs:
        if Job.objects.filter(pk=job.pk, fleet_failure="").update(
            fleet_failure=reason[:300], updated_at=now
        ):
            marked += 1
            audit.record(
                actor=actor,
                action="job.fleet_failure",
                target=job,
                detail={"reason": reason, "runner": job.runner_name or job.runner_id},
                at=now,
            )
            emit("job.fleet_failure", job, at=now)
    return marked


def clear_fleet_failure(
    jobs: Iterable[Job], *, failure: str, reason: str, now: datetime, actor: str
) -> int:
    """Take back `failure` from those of `jobs` that carry it (issue 21 item 20: the host
    loss that marked them proved wrong). The other writer of `Job.fleet_failure`, the undo
    of `mark_fleet_failure`: a compare-and-set from that very reason, so a job marked for
    another reason keeps it."""
    cleared = 0
    for job in jobs:
        if job.fleet_failure != failure:
            continue
        if Job.objects.filter(pk=job.pk, fleet_failure=failure).update(
            fleet_failure="", updated_at=now
        ):
            cleared += 1
            audit.record(
                actor=actor,
                action="job.fleet_failure_cleared",
                target=job,
                detail={"reason": reason, "was": failure},
                at=now,
            )
            emit("job.fleet_failure_cleared", job, at=now)
    return cleared


def fail_live_runners(
    host: Host, *, now: datetime, actor: str, message: str, job_failure: str
) -> list[str]:
    """Fail every runner still live on `host`; a job one was running is the fleet's failure."""
    failed: list[Runner] = []
    for runner in Runner.objects.filter(host=host, state__in=list(LIVE_STATES)).order_by("pk"):
        if fail(runner, now=now, actor=actor, message=message).changed:
            failed.append(runner)
    mark_fleet_failure(failed, reason=job_failure, now=now, actor=actor)
    return [f"runner {r.name} failed: {message}" for r in failed]


def runner_task_failed(task: AgentTask, *, error: str, now: datetime, actor: str) -> None:
    """What a failed agent task means for its runner.

    RUN-14: a failed create fails the runner with the agent's reason. TASK-05: a failed stop
    fails it too (which asks the host for a remove and frees the slot): nothing else would
    end a runner its host could not stop. A failed remove is issued again by housekeeping
    until the host confirms one (TASK-08).
    """
    runner = task.runner
    if runner is None:
        return
    if task.kind == TaskKind.CREATE_RUNNER:
        fail(runner, now=now, actor=actor, message=error or "the agent could not start the runner")
    elif task.kind == TaskKind.STOP_RUNNER:
        message = "the host could not stop the runner"
        fail(
            runner,
            now=now,
            actor=actor,
            message=f"{message}: {error}" if error else message,
            expected_from=LIVE_STATES,
        )


def lock_runner_named(name: str) -> None:
    """Lock the runner row called `name`, if there is one, for the caller's transaction
    (SQLite's writers are serialised already; Django takes no row lock there)."""
    list(Runner.objects.select_for_update().filter(name=name).values_list("pk", flat=True))


def link_job_runner(job: Job, *, now: datetime, actor: str) -> Runner | None:
    """HOOK-05: an in-progress job names its runner; that runner is busy, and linked.

    Only a GitHub signal (a webhook or the poller) makes a runner busy (RUN-16).
    """
    if not job.runner_name:
        return None
    runner = Runner.objects.filter(name=job.runner_name).first()
    if runner is None:
        return None
    if job.runner_id != runner.pk:
        Job.objects.filter(pk=job.pk).update(runner=runner)
        job.runner_id = runner.pk
        emit("job.linked", job, at=now)
    if JOB_RANK[JobStatus(job.status)] == JOB_RANK[JobStatus.IN_PROGRESS]:
        if runner.state == RunnerState.PROVISIONING:
            note_started_while_provisioning(runner, job)
            return runner
        transition_runner(
            runner.pk, RunnerState.BUSY, now=now, actor=actor, reason=f"job {job.github_id} started"
        )
    return runner


def note_started_while_provisioning(runner: Runner, job: Job) -> None:
    """An expected race, routine in a burst: the runner took its job before its agent's
    create result landed. Busy is off the allow-list from provisioning; the registering
    report makes it busy from the job row (RUN-16, reports.py), so only this line says so."""
    log.info("runner %s: job %s started while it is provisioning; busy once it is registering",
             runner.name, job.github_id)  # fmt: skip


def finish_job_runner(job: Job, *, now: datetime, actor: str) -> None:
    """HOOK-06: a completed job starts the removal of its ephemeral runner.

    The runner exits by itself after its one job; draining plus a stop task makes sure a
    runner that does not is still taken away, and the agent's report ends it.
    """
    runner = link_job_runner(job, now=now, actor=actor)
    if runner is None:
        return
    # The job GitHub was busy with has ended: an idle drain it refused may be asked again.
    Runner.objects.filter(pk=runner.pk, drain_deferred_until__isnull=False).update(
        drain_deferred_until=None
    )
    runner.refresh_from_db()
    if runner.ephemeral:
        if runner.state in (RunnerState.IDLE, RunnerState.REGISTERING):
            # Its `in_progress` was lost, but GitHub says it ran this job: it is exiting after
            # its one job, not idle. As busy it gets the drain grace to exit by itself; a stop
            # at once would kill it mid-exit, and that failure holds the pool's starts back.
            transition_runner(
                runner.pk,
                RunnerState.BUSY,
                now=now,
                actor=actor,
                reason=f"job {job.github_id} ran on it (its start was not heard)",
            )
        drain(runner, now=now, actor=actor, reason=f"job {job.github_id} completed")
    elif runner.state == RunnerState.BUSY:
        transition_runner(runner.pk, RunnerState.IDLE, now=now, actor=actor, reason="job finished")


def drain_finished_together(finished: list[tuple[Runner, int, datetime]], *, actor: str) -> None:
    """HOOK-06 for a group of (busy or provisioning ephemeral runner as read and locked, the
    github id of its job that completed, when): what `finish_job_runner` and `drain` do for
    each, in a few statements for all. The caller chose runners with a host, no create
    waiting to be taken and no stop asked, so nothing is cancelled and each gets its stop
    task: after the drain grace for a busy one (RUN-11), at once for any other."""
    if not finished:
        return
    Runner.objects.filter(
        pk__in=[runner.pk for runner, _, _ in finished], drain_deferred_until__isnull=False
    ).update(drain_deferred_until=None)
    transition_read_runners(
        [
            RunnerMove(runner, RunnerState.DRAINING, now, f"job {github_id} completed")
            for runner, github_id, now in finished
        ],
        actor=actor,
    )
    enqueue_tasks(
        [
            _stop_task(runner, was_busy=runner.state == RunnerState.BUSY, now=now)
            for runner, _, now in finished
        ]
    )


def spare_busy_workloads(
    host: Host, *, now: datetime, actor: str, runners: Iterable[Runner] | None = None
) -> list[str]:
    """Issue 11 item 4 (docs/reliability.md): a host back after being judged lost keeps the
    workloads still running jobs GitHub shows in progress.

    The rows stay failed (HOST-04: the host was lost, its runners were failed and their jobs
    marked as the fleet's failure); only the removes queued for those workloads are
    cancelled, so the jobs finish. A cancelled remove is not re-issued (TASK-08 re-issues
    failed and abandoned ones), and the ephemeral runner exits once its job ends. `runners`
    narrows the check to those (an agent's report); by default every failed runner of the
    host. Runs inside the caller's transaction.
    """
    failed = Runner.objects.filter(host=host, state=RunnerState.FAILED)
    if runners is not None:
        failed = failed.filter(pk__in=[r.pk for r in runners])
    by_name = {r.name: r for r in failed}
    if not by_name:
        return []
    busy = Job.objects.filter(status=JobStatus.IN_PROGRESS).filter(
        Q(runner__in=list(by_name.values())) | Q(runner_name__in=list(by_name))
    )
    lines = []
    for job in busy.order_by("pk"):
        runner = by_name.get(job.runner_name) or next(
            (r for r in by_name.values() if r.pk == job.runner_id), None
        )
        if runner is None:
            continue
        cancelled = cancel_tasks(
            runner.tasks.filter(kind=TaskKind.REMOVE_RUNNER),
            now=now,
            actor=actor,
            reason=f"its host came back and job {job.github_id} is still in progress",
        )
        if cancelled:
            lines.append(
                f"runner {runner.name}: remove cancelled, job {job.github_id} still running"
            )
    return lines


def revive_after_host_loss(
    host: Host, *, runners: Iterable[Runner], now: datetime, actor: str
) -> list[str]:
    """Issue 21 item 20: a runner failed because its host was lost, whose returning agent
    shows its workload ran on (adopted at the agent's start, reported running, or reported
    ended), is put back to the truth.

    Only a runner failed with the host loss's message, on a host no longer lost, that GitHub
    gave a job (in progress or completed by now): that job is the proof it was never gone.
    The row goes failed -> busy (`transitions.revive_runner`, the one guarded way back), a
    remove still queued for it is cancelled, and its jobs lose the loss's fleet-failure mark.
    A job GitHub has already completed then ends it as any completed job does, so the row
    reaches removed through draining. Runs inside the caller's transaction.
    """
    if Host.objects.filter(pk=host.pk, health=HostHealth.LOST).exists():
        # Still lost: the next health tick would fail it again. The heartbeat that brings
        # the host back comes first (`fleet.actions.record_inventory` records one).
        return []
    prefix = host_lost_prefix(host.name)
    candidates = Runner.objects.filter(
        host=host,
        state=RunnerState.FAILED,
        message__startswith=prefix,
        pk__in=[r.pk for r in runners],
    )
    lines = []
    for runner in candidates.order_by("pk"):
        jobs = Job.objects.filter(Q(runner=runner) | Q(runner_name=runner.name))
        job = (
            jobs.filter(status__in=[JobStatus.IN_PROGRESS, JobStatus.COMPLETED])
            .order_by("pk")
            .first()
        )
        if job is None:
            continue  # nothing shows it ran on: the loss's verdict stands
        revived = revive_runner(
            runner.pk,
            failed_message_prefix=prefix,
            now=now,
            actor=actor,
            reason=f"its host came back and it ran on with job {job.github_id}",
            message="its host was judged lost and came back; the runner ran on",
        )
        if not revived.changed:
            continue
        cancel_tasks(
            runner.tasks.filter(kind=TaskKind.REMOVE_RUNNER, state=TaskState.PENDING),
            now=now,
            actor=actor,
            reason="its host came back and the runner ran on",
        )
        clear_fleet_failure(
            jobs,
            failure=HOST_LOST_JOB_FAILURE,
            reason=f"runner {runner.name} ran on after its host came back",
            now=now,
            actor=actor,
        )
        if job.status == JobStatus.COMPLETED:
            finish_job_runner(job, now=now, actor=actor)
        lines.append(f"runner {runner.name}: busy again, it ran on with job {job.github_id}")
    return lines
