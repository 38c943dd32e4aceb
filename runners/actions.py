"""Runner and job actions: the only code that writes jobs and the GitHub-driven runner moves."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction

from accounts import audit
from runners.models import Installation, Job, Runner
from runners.states import JOB_RANK, JobStatus, RunnerState, job_statuses_before
from runners.transitions import transition_runner

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
    cannot move it backwards either.
    """
    status = normalise_status(update.status)
    if status is None:
        log.info("job %s: ignoring unknown status %r", update.github_id, update.status)
        return None, False
    fields = {
        "status": status,
        "updated_at": now,
        "source": source,
    }
    if update.conclusion:
        fields["conclusion"] = update.conclusion
    if update.runner_name:
        fields["runner_name"] = update.runner_name
    if update.started_at:
        fields["started_at"] = update.started_at
    if update.completed_at or status == JobStatus.COMPLETED:
        fields["completed_at"] = update.completed_at or now
    with transaction.atomic():
        job = Job.objects.filter(github_id=update.github_id).first()
        if job is None:
            try:
                with transaction.atomic():
                    job = Job.objects.create(
                        github_id=update.github_id,
                        run_id=update.run_id,
                        installation=installation,
                        repository=update.repository,
                        name=update.name,
                        labels=list(update.labels),
                        created_at=update.created_at or now,
                        **fields,
                    )
            except IntegrityError:
                # A concurrent delivery created it first; fall through to the guarded move.
                job = Job.objects.get(github_id=update.github_id)
            else:
                audit.record(
                    actor=actor, action=f"job.{status}", target=job, detail={"source": source}
                )
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
        job.refresh_from_db()
    return job, bool(moved)


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
    if JOB_RANK[job.status] == JOB_RANK[JobStatus.IN_PROGRESS]:
        transition_runner(
            runner.pk, RunnerState.BUSY, now=now, actor=actor, reason=f"job {job.github_id} started"
        )
    return runner


def finish_job_runner(job: Job, *, now: datetime, actor: str) -> None:
    """HOOK-06: a completed job starts the removal of its ephemeral runner.

    The runner exits by itself after its one job; draining plus a stop task makes sure a
    runner that does not is still taken away, and the agent's report ends it.
    """
    runner = link_job_runner(job, now=now, actor=actor)
    if runner is None:
        return
    runner.refresh_from_db()
    if runner.ephemeral:
        from runners.lifecycle import drain_runner

        drain_runner(runner, now=now, actor=actor, reason=f"job {job.github_id} completed")
    elif runner.state == RunnerState.BUSY:
        transition_runner(runner.pk, RunnerState.IDLE, now=now, actor=actor, reason="job finished")


def apply_job_update(
    update: JobUpdate,
    *,
    installation: Installation | None,
    now: datetime,
    source: str,
    actor: str,
) -> Job | None:
    """The path webhooks and the poller share: record the job, then move its runner."""
    job, moved = record_job(update, installation=installation, now=now, source=source, actor=actor)
    if job is None or not moved:
        # A stale or repeated update moves no runner: a late `completed` must not flip a
        # reusable runner that has since taken another job back to idle.
        return job
    if job.status == JobStatus.IN_PROGRESS:
        link_job_runner(job, now=now, actor=actor)
    elif job.status == JobStatus.COMPLETED:
        finish_job_runner(job, now=now, actor=actor)
    return job
