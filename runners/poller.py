"""The poll fallback (spec "When webhooks cannot reach you"; POLL-01..07).

`poll_step(now)` is one sweep over the installations; the loop that calls it every
`github.poll_interval` lives elsewhere. Both of its decisions are per installation:

* an installation whose own webhooks are arriving is skipped (POLL-03). "Arriving" means a
  delivery credited to it (HOOK-07) within `webhook_fresh_window()`: three poll intervals,
  and never less than ten minutes, so one quiet interval between two jobs does not flip an
  installation to polling, while a dead webhook is noticed within minutes;
* a rate-limited installation is stood down until GitHub said its quota returns, and the
  sweep carries on with the rest (POLL-05..07). The stand-down is the installation's, so
  the registration reap (`runners.reap`) honours it and sets it the same way.

Every job found goes through `runners.actions.apply_job_update`, the path webhook deliveries
take, so a job is never moved backwards and a runner is made busy in one place (POLL-02).
A job we hold as open that has left the active listing (its run finished, or it was
cancelled) is asked after through its run, because without a webhook nothing else would end
it and a job left queued is demand for ever. No transaction is held across a GitHub call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import transaction

from runners.actions import apply_job_update, normalise_status
from runners.github.errors import GitHubError, NotFound, RateLimited
from runners.models import Installation, Job, Runner
from runners.states import JobStatus
from runners.webhooks import BadPayload, job_update_from_github

log = logging.getLogger("zoomies.poller")

ACTOR = "system:poller"
# POLL-03: how recent a delivery must be for the installation's webhooks to count as arriving.
WEBHOOK_FRESH_INTERVALS = 3
WEBHOOK_FRESH_FLOOR = timedelta(minutes=10)
# Runs looked up per repository per sweep for open jobs that left the active listing.
MAX_RUN_LOOKUPS = 20
OPEN_STATUSES = (JobStatus.WAITING, JobStatus.QUEUED, JobStatus.IN_PROGRESS)

Clock = Callable[[], float]


def _registry(key: str):
    from zoomies_site import registry

    return registry.get(key)


def webhook_fresh_window() -> timedelta:
    """How long after its last delivery an installation still counts as receiving webhooks."""
    return max(WEBHOOK_FRESH_INTERVALS * _registry("github.poll_interval"), WEBHOOK_FRESH_FLOOR)


def webhooks_arriving(
    installation: Installation, now: datetime, started_at: datetime | None = None
) -> bool:
    """Whether this installation's own deliveries are arriving (POLL-03).

    Only deliveries since this controller started count: GitHub does not redeliver what a
    stopped or crashed controller refused, so the first sweep after a start polls every
    installation and catches up on whatever happened meanwhile.
    """
    last = installation.last_webhook_at
    if last is None or (started_at is not None and last < started_at):
        return False
    return now - last < webhook_fresh_window()


def under_standdown(installation: Installation, now: datetime) -> bool:
    return installation.standdown_until is not None and installation.standdown_until > now


# -- the stand-down (POLL-05..09), shared with the registration reap ------------------------------


def standdown_until(exc: RateLimited, now: datetime, *, clock: Clock | None = None) -> datetime:
    """When a rate-limited installation may be asked again.

    GitHub's own time when it gave one (POLL-06): `retry_at` is epoch seconds on the client's
    clock, so with `clock` (that clock) it is turned into a wait and added to `now`; without
    one it is read as a plain instant. No time at all earns `github.rate_limit_fallback`
    (POLL-07). Never more than `github.rate_limit_cap` ahead, because GitHub's window is an
    hour and anything longer is a clock out of step, and never before `now`.
    """
    cap = _registry("github.rate_limit_cap")
    if exc.retry_at is None:
        until = now + _registry("github.rate_limit_fallback")
    elif clock is not None:
        until = now + timedelta(seconds=exc.retry_at - clock())
    else:
        until = datetime.fromtimestamp(exc.retry_at, UTC)
    return min(max(until, now), now + cap)


def stand_down(
    installation: Installation,
    exc: RateLimited,
    *,
    now: datetime,
    by: str,
    clock: Clock | None = None,
) -> datetime:
    """Record the installation's stand-down and why; returns until when."""
    until = standdown_until(exc, now, clock=clock)
    if exc.retry_at is None:
        why = "GitHub gave no time, so the fallback wait applies"
    else:
        why = "until GitHub said the quota returns"
    if until == now + _registry("github.rate_limit_cap") and exc.retry_at is not None:
        why = "GitHub's time was further off than the cap, so the cap applies"
    call = f"{exc.method} {exc.path}" if exc.method and exc.path else "a call"
    reason = f"rate limited by GitHub ({by}: {call} answered {exc.status}); {why}"
    Installation.objects.filter(pk=installation.pk).update(
        standdown_until=until, standdown_reason=reason[:300]
    )
    installation.standdown_until = until
    installation.standdown_reason = reason[:300]
    log.warning(
        "installation %s (%s): standing down until %s: %s",
        installation.github_id,
        installation.account,
        until.isoformat(),
        reason,
    )
    return until


def clear_expired_standdown(installation: Installation, now: datetime) -> None:
    """After a sweep that GitHub answered, forget a stand-down that has run out."""
    if installation.standdown_until is not None and installation.standdown_until <= now:
        Installation.objects.filter(
            pk=installation.pk, standdown_until=installation.standdown_until
        ).update(standdown_until=None, standdown_reason="")
        installation.standdown_until = None
        installation.standdown_reason = ""


# -- the sweep -----------------------------------------------------------------------------------


@dataclass
class PollReport:
    """What one sweep did, per installation (by GitHub installation id)."""

    enabled: bool = True
    configured: bool = True
    polled: list[int] = field(default_factory=list)
    skipped_webhooks: list[int] = field(default_factory=list)
    skipped_standdown: list[int] = field(default_factory=list)
    stood_down: dict[int, datetime] = field(default_factory=dict)
    errors: dict[int, list[str]] = field(default_factory=dict)
    jobs_seen: int = 0
    jobs_changed: int = 0

    @property
    def changed(self) -> bool:
        return self.jobs_changed > 0


def _repositories(installation: Installation, client) -> list[str]:
    listed = [r for r in (installation.repositories or []) if isinstance(r, str) and "/" in r]
    return listed if listed else client.repositories()


def _worth_recording(job: dict, status: str, known: dict[int, str], our_runners: set[str]) -> bool:
    """Which of GitHub's jobs the poller feeds through.

    Queued (and waiting) jobs always: they are the demand. A job already running counts when
    it runs on one of our runners (POLL-02), or when we know the job, so one taken by some
    other runner stops counting as demand. A finished one only when we know it and have not
    heard it finish: that ends its runner. Other jobs of those runs are nobody's business here.
    """
    if status in (JobStatus.QUEUED, JobStatus.WAITING):
        return True
    github_id = job.get("id")
    if status == JobStatus.IN_PROGRESS:
        return github_id in known or job.get("runner_name") in our_runners
    if status == JobStatus.COMPLETED:
        return github_id in known and known[github_id] != JobStatus.COMPLETED
    return False


def _feed(
    jobs: list, repo: str, installation: Installation, now: datetime, report: PollReport
) -> None:
    """Feed GitHub job objects through `apply_job_update`, the path webhooks take."""
    gid = installation.github_id
    jobs = [j for j in jobs if isinstance(j, dict) and isinstance(j.get("id"), int)]
    known = dict(
        Job.objects.filter(github_id__in=[j["id"] for j in jobs]).values_list("github_id", "status")
    )
    names = {j.get("runner_name") for j in jobs} - {None, ""}
    ours = set(Runner.objects.filter(name__in=names).values_list("name", flat=True))
    for job in jobs:
        status = normalise_status(str(job.get("status") or ""))
        if status is None or not _worth_recording(job, status, known, ours):
            continue
        try:
            update = job_update_from_github(job, repository=repo)
        except BadPayload as exc:
            report.errors.setdefault(gid, []).append(f"{repo}: job skipped: {exc}")
            continue
        report.jobs_seen += 1
        recorded = apply_job_update(
            update, installation=installation, now=now, source="poll", actor=ACTOR
        )
        if recorded is not None and known.get(update.github_id) != recorded.status:
            report.jobs_changed += 1


def _settle_vanished(
    installation: Installation,
    client,
    repo: str,
    listed: set[int],
    now: datetime,
    report: PollReport,
) -> None:
    """Ask after open jobs of ours that are no longer in an active run.

    Their run finished, or they were cancelled, between two sweeps; with no webhook nothing
    else would say so, and a job left queued here is demand for ever. One call per run, at
    most MAX_RUN_LOOKUPS runs a repository a sweep; the rest are asked after next time.
    """
    open_jobs = (
        Job.objects.filter(repository__iexact=repo, status__in=OPEN_STATUSES)
        .exclude(github_id__in=listed)
        .exclude(run_id=None)
        .order_by("run_id")
    )
    vanished = dict(open_jobs.values_list("github_id", "run_id"))
    for run_id in sorted(set(vanished.values()))[:MAX_RUN_LOOKUPS]:
        try:
            jobs = client.list_run_jobs(repo, run_id)
        except NotFound as exc:
            report.errors.setdefault(installation.github_id, []).append(str(exc))
            continue
        _feed(
            [j for j in jobs if isinstance(j, dict) and j.get("id") in vanished],
            repo,
            installation,
            now,
            report,
        )


def _poll_installation(installation: Installation, client, now: datetime, report: PollReport):
    """One installation's active jobs, and what became of the ones that left; errors propagate."""
    for repo in _repositories(installation, client):
        try:
            jobs = client.active_jobs(repo)
        except NotFound as exc:
            # A repository removed from the installation; the others still need polling.
            report.errors.setdefault(installation.github_id, []).append(str(exc))
            continue
        _feed(jobs, repo, installation, now, report)
        listed = {j["id"] for j in jobs if isinstance(j, dict) and isinstance(j.get("id"), int)}
        _settle_vanished(installation, client, repo, listed, now, report)


def poll_step(
    now: datetime,
    *,
    app=None,
    clock: Clock | None = None,
    started_at: datetime | None = None,
) -> PollReport:
    """One sweep of the poll fallback over every active installation (POLL-01..07).

    `app` is the GitHubApp (default: the configured one); `clock` is the clock its
    `RateLimited.retry_at` is measured on (see `standdown_until`). The reconcile pass is
    woken when any job changed.
    """
    report = PollReport()
    if not _registry("github.poll_fallback"):
        report.enabled = False
        return report
    if app is None:
        from runners.github.config import get_app

        app = get_app()
    if app is None:
        report.configured = False
        return report
    for installation in Installation.objects.filter(active=True).order_by("pk"):
        gid = installation.github_id
        if under_standdown(installation, now):
            report.skipped_standdown.append(gid)
            continue
        if webhooks_arriving(installation, now, started_at):
            report.skipped_webhooks.append(gid)
            continue
        client = app.for_installation(gid)
        try:
            _poll_installation(installation, client, now, report)
        except RateLimited as exc:
            # POLL-05: this installation only; the quota is per installation.
            report.stood_down[gid] = stand_down(
                installation, exc, now=now, by="poller", clock=clock
            )
            continue
        except GitHubError as exc:
            log.warning("poller: installation %s (%s): %s", gid, installation.account, exc)
            report.errors.setdefault(gid, []).append(str(exc))
            continue
        clear_expired_standdown(installation, now)
        Installation.objects.filter(pk=installation.pk).update(last_polled_at=now)
        report.polled.append(gid)
    if report.changed:
        from runners.wake import wake_reconcile

        transaction.on_commit(wake_reconcile)
    return report
