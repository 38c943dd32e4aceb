"""Job actions: the one writer of a job's status (HOOK-03) and of its fleet failure."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from accounts import audit
from fleet.models import AgentTask
from fleet.states import OPEN_TASK_STATES, TaskKind, TaskState
from runners.actions import steps
from runners.models import Installation, Job, Runner
from runners.states import JobStatus, RunnerState, can_transition, job_statuses_before
from runners.transitions import MoveLost, RunnerMove, transition_read_runners
from zoomies_site.core import metrics
from zoomies_site.core.events import emit, emit_each, emit_many

log = logging.getLogger("zoomies.runners")


@dataclass(frozen=True)
class JobUpdate:
    """One observation of a GitHub job, from a webhook delivery or the poller."""

    github_id: int
    status: str
    repository: str
    labels: tuple[str, ...] = ()
    run_id: int | None = None
    name: str = ""
    conclusion: str = ""
    runner_name: str = ""
    created_at: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None


def normalise_status(status: str) -> str | None:
    """GitHub's job statuses mapped onto ours; requested/pending count as queued."""
    if status in ("requested", "pending"):
        return JobStatus.QUEUED
    return status if status in JobStatus.values else None


def record_job(
    update: JobUpdate,
    *,
    installation: Installation | None,
    now: datetime,
    source: str,
    actor: str,
) -> tuple[Job | None, bool]:
    """Upsert a job, never moving it backwards (HOOK-03); returns (job, moved).

    The move is a compare-and-set on the status, so two deliveries racing for one job
    cannot move it backwards either. Joins the caller's transaction, without a savepoint
    (see apply_job_update).
    """
    status = normalise_status(update.status)
    if status is None:
        log.info("job %s: ignoring unknown status %r", update.github_id, update.status)
        return None, False
    fields = {"status": status, **_job_fields(update, status, now, source)}
    with transaction.atomic(savepoint=False):
        job = Job.objects.filter(github_id=update.github_id).first()
        if job is None:
            try:
                with transaction.atomic():
                    job = Job.objects.create(**_new_job_fields(update, installation, now), **fields)
            except IntegrityError:
                # A concurrent delivery created it first; fall through to the guarded move.
                job = Job.objects.get(github_id=update.github_id)
            else:
                audit.record(
                    actor=actor, action=f"job.{status}", target=job, detail={"source": source}
                )
                emit(f"job.{status}", job, at=now)
                return job, True
        moved = Job.objects.filter(pk=job.pk, status__in=job_statuses_before(status)).update(
            **fields
        )
        if moved:
            if installation is not None and job.installation_id is None:
                Job.objects.filter(pk=job.pk).update(installation=installation)
            audit.record(
                actor=actor,
                action=f"job.{status}",
                target=job,
                detail={"from": job.status, "source": source},
            )
            emit(f"job.{status}", job, at=now)
        job.refresh_from_db()
    return job, bool(moved)


def _job_fields(update: JobUpdate, status: str, now: datetime, source: str) -> dict[str, Any]:
    """What an update writes on its job, new or known, beside the status itself (which its
    two writers name, so the one-writer scan sees them)."""
    fields: dict[str, Any] = {"updated_at": now, "source": source}
    if update.conclusion:
        fields["conclusion"] = update.conclusion
    if update.runner_name:
        fields["runner_name"] = update.runner_name
    if update.started_at:
        fields["started_at"] = update.started_at
    if update.completed_at or status == JobStatus.COMPLETED:
        fields["completed_at"] = update.completed_at or now
    return fields


def _new_job_fields(
    update: JobUpdate, installation: Installation | None, now: datetime
) -> dict[str, Any]:
    """What only a new job's row gets: who it is, written once."""
    return {
        "github_id": update.github_id,
        "run_id": update.run_id,
        "installation": installation,
        "repository": update.repository,
        "name": update.name,
        "labels": list(update.labels),
        "created_at": update.created_at or now,
    }


def record_new_queued_jobs(
    updates: list[tuple[JobUpdate, Installation, datetime]], *, source: str, actor: str
) -> list[Job]:
    """Insert jobs never seen before, each announced `queued`, in one INSERT each for the
    jobs, their audit rows and their events: what `record_job` writes for each, for a burst
    of webhooks (runners.webhooks). The caller has checked that none of these jobs exists
    and that each update says queued; a job that appeared meanwhile (another process) fails
    the INSERT, and the caller's savepoint takes the whole group back."""
    jobs = [
        Job(
            status=JobStatus.QUEUED,
            **_new_job_fields(update, installation, received),
            **_job_fields(update, JobStatus.QUEUED, received, source),
        )
        for update, installation, received in updates
    ]
    created = Job.objects.bulk_create(jobs)
    audit.record_many(actor=actor, action=f"job.{JobStatus.QUEUED}", targets=created,
                      detail={"source": source})  # fmt: skip
    emit_many(f"job.{JobStatus.QUEUED}", Job, [job.pk for job in created],
              at=max(received for _, _, received in updates))  # fmt: skip
    return created


@dataclass(frozen=True)
class JobMove:
    """One update of a group `apply_job_moves_together` writes, with the job and the runner
    it moves as `choose_job_moves` read them (the runner locked) in this transaction."""

    update: JobUpdate
    status: str  # the update's, normalised
    installation: Installation | None
    now: datetime
    job: Job
    runner: Runner


def choose_job_moves(
    updates: list[tuple[JobUpdate, Installation | None, datetime]],
) -> list[JobMove | None]:
    """For each update, its JobMove when it is a busy fleet's common case, else None (it
    goes through `apply_job_update`, one by one): a known job moving forward to in_progress
    on a runner that can turn busy or is still provisioning (the job linked to no other
    runner), or to completed on the busy or provisioning ephemeral runner it is linked to,
    which has a host, no create waiting to be taken and no stop asked. In three statements
    for the group; the runners are locked, as `apply_job_update` locks each. The caller
    sends each job and each runner name at most once."""
    names = sorted({update.runner_name for update, _, _ in updates})
    runners = {
        r.name: r for r in Runner.objects.select_for_update().filter(name__in=names).order_by("pk")
    }
    jobs = {
        j.github_id: j
        for j in Job.objects.filter(github_id__in=[update.github_id for update, _, _ in updates])
    }
    # What a drain would cancel (a create not yet taken) or find already asked (a stop).
    busy_tasks = set(
        AgentTask.objects.filter(runner_id__in=[r.pk for r in runners.values()])
        .filter(
            Q(kind=TaskKind.CREATE_RUNNER, state=TaskState.PENDING)
            | Q(kind=TaskKind.STOP_RUNNER, state__in=OPEN_TASK_STATES)
        )
        .values_list("runner_id", flat=True)
    )
    moves: list[JobMove | None] = []
    for update, installation, now in updates:
        job, runner = jobs.get(update.github_id), runners.get(update.runner_name)
        status = normalise_status(update.status)
        fits = (
            job is not None
            and runner is not None
            and status is not None
            and job.status in job_statuses_before(status)
            and _moves_together(status, job, runner, runner.pk in busy_tasks)
        )
        moves.append(
            JobMove(update, status, installation, now, job, runner) if fits else None  # type: ignore[arg-type]
        )
    return moves


def _moves_together(status: str, job: Job, runner: Runner, task_in_the_way: bool) -> bool:
    if status == JobStatus.IN_PROGRESS:
        # A provisioning runner is only linked: busy waits for its registering report.
        return job.runner_id in (None, runner.pk) and (
            runner.state == RunnerState.PROVISIONING
            or (runner.state != RunnerState.BUSY and can_transition(runner.state, RunnerState.BUSY))
        )
    return (
        status == JobStatus.COMPLETED
        and job.status == JobStatus.IN_PROGRESS
        and job.runner_id == runner.pk
        and runner.state in (RunnerState.BUSY, RunnerState.PROVISIONING)
        and runner.ephemeral
        and runner.host_id is not None
        and not task_in_the_way
    )


def apply_job_moves_together(moves: list[JobMove], *, source: str, actor: str) -> None:
    """What `apply_job_update` writes for each move `choose_job_moves` chose, with one
    UPDATE a job and a runner and one INSERT for all the audit rows, events and stop tasks
    of each kind: a burst of webhooks' in_progress and completed deliveries
    (runners.webhooks). A job or runner that moved since it was read raises MoveLost, and
    the caller's savepoint takes the whole group back."""
    audits: list[tuple[str, str, Any, dict[str, Any] | None, datetime]] = []
    events: list[tuple[str, Any, datetime]] = []
    started: list[RunnerMove] = []
    finished: list[tuple[Runner, int, datetime]] = []
    for move in moves:
        job, runner, update, status = move.job, move.runner, move.update, move.status
        fields = _job_fields(update, status, move.now, source)
        if move.installation is not None and job.installation_id is None:
            fields["installation"] = move.installation
        linked = job.runner_id != runner.pk
        if linked:
            fields["runner"] = runner  # HOOK-05
        moved = Job.objects.filter(pk=job.pk, status__in=job_statuses_before(status)).update(
            status=status, **fields
        )
        if not moved:
            raise MoveLost(f"job {job.github_id} is no longer {job.status}")
        audits.append((actor, f"job.{status}", job, {"from": job.status, "source": source},
                       timezone.now()))  # fmt: skip
        events.append((f"job.{status}", job, move.now))
        if linked:
            events.append(("job.linked", job, move.now))
        if status == JobStatus.IN_PROGRESS:
            if runner.state == RunnerState.PROVISIONING:
                steps.note_started_while_provisioning(runner, job)
            else:
                started.append(
                    RunnerMove(runner, RunnerState.BUSY, move.now, f"job {job.github_id} started")
                )
            created_at, started_at = job.created_at, update.started_at or job.started_at
            transaction.on_commit(
                lambda c=created_at, s=started_at: metrics.job_started(c, s)  # type: ignore[misc]
            )
        else:
            finished.append((runner, job.github_id, move.now))  # HOOK-06
    audit.record_each(audits)
    emit_each(events)
    transition_read_runners(started, actor=actor)
    steps.drain_finished_together(finished, actor=actor)


def apply_job_update(
    update: JobUpdate,
    *,
    installation: Installation | None,
    now: datetime,
    source: str,
    actor: str,
) -> Job | None:
    """The path webhooks and the poller share: record the job, then move its runner.

    Not durable, on purpose: a webhook delivery commits its WebhookDelivery row and the job
    it carries in one transaction (HOOK-02), so this joins the caller's when there is one,
    without a savepoint of its own (a burst of deliveries would pay two statements a job for
    it): a caller that carries on after a failure here wraps the call in its own savepoint,
    as runners.webhooks.record does for each delivery.
    """
    with transaction.atomic(savepoint=False):
        if update.runner_name:
            # The runner's row first, held to the end: an agent's report takes the runner
            # and then reads its jobs (runners/actions/reports.py). Read without the lock,
            # a report committing between that read and this commit (PostgreSQL) left a
            # running job's runner registering: the move to busy was dropped here as too
            # early, and the report's catch-up could not yet see this in_progress.
            steps.lock_runner_named(update.runner_name)
        job, moved = record_job(
            update, installation=installation, now=now, source=source, actor=actor
        )
        if job is None or not moved:
            # A stale or repeated update moves no runner: a late `completed` must not flip a
            # reusable runner that has since taken another job back to idle.
            return job
        if job.status == JobStatus.IN_PROGRESS:
            steps.link_job_runner(job, now=now, actor=actor)
            transaction.on_commit(lambda: metrics.job_started(job.created_at, job.started_at))
        elif job.status == JobStatus.COMPLETED:
            steps.finish_job_runner(job, now=now, actor=actor)
    return job


def mark_jobs_fleet_failure(
    runners: Iterable[Runner], *, reason: str, now: datetime, actor: str
) -> int:
    """HOST-04: a job still running on one of `runners` is marked as the fleet's failure."""
    with transaction.atomic(durable=True):
        return steps.mark_fleet_failure(runners, reason=reason, now=now, actor=actor)
