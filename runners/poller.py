"""The poll fallback and the safety sweep (spec "When webhooks cannot reach you"; POLL-01..07).

`poll_step(now)` is one sweep over the installations; the loop that calls it every
`github.poll_interval` lives elsewhere. Its decisions are per installation:

* an installation whose own webhooks are not arriving is swept in full (POLL-01, POLL-02):
  its queued and in-progress runs, and what became of open jobs whose run left both lists.
  "Arriving" means a delivery credited to it (HOOK-07) within `webhook_fresh_window()`:
  three poll intervals, and never less than ten minutes, so one quiet interval between two
  jobs does not flip an installation to polling, while a dead webhook is noticed within
  minutes;
* one whose webhooks arrive is not polled in full (POLL-03), but gets a safety sweep of its
  queued runs every `github.safety_sweep_interval`: GitHub never redelivers a dropped
  `queued`, so in a busy organisation that job would otherwise wait until webhooks stop;
* a rate-limited installation is stood down until GitHub said its quota returns, and the
  sweep carries on with the rest (POLL-05..07). The stand-down is the installation's, so
  the registration reap (`runners.reap`) honours it and sets it the same way.

What a sweep costs does not grow with the number of queued jobs: each list is asked for
with the ETag of its last answer (a 304 is not counted by GitHub), a run's jobs are listed
only when none of them is known or the run changed since it was last seen (a memory kept in
the database, so a restart does not list them all again), and no call is made once
`github.sweep_budget` of the hour's quota is spent (`SweepBudget`). Every sweep also lists
the runs created since the one before (`created_since`, one call a repository) and records
the jobs of those no delivery told of, finished ones too: a job every delivery of which was
lost, that started or ended between two sweeps, is in no queued or in-progress list. Known
limits: a run it first meets with some of its jobs known is trusted to the webhooks until it
changes; and a re-run keeps its run's first `created_at`, so a re-run's jobs are found by
that listing only while it is queued.

Every job found goes through `runners.actions.apply_job_update`, the path webhook deliveries
take, so a job is never moved backwards and a runner is made busy in one place (POLL-02).
No transaction is held across a GitHub call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Coalesce

from runners import naming
from runners.actions import (
    JobUpdate,
    apply_job_update,
    clear_standdown,
    normalise_status,
    stand_down_installation,
)
from runners.github.config import get_app
from runners.github.errors import GitHubError, NotFound, RateLimited
from runners.job_objects import BadPayload, job_update_from_github
from runners.models import Installation, Job, Runner, SweptRun
from runners.states import TERMINAL_STATES, JobStatus
from runners.wake import wake_reconcile
from zoomies_site.core import registry

log = logging.getLogger("zoomies.poller")

ACTOR = "system:poller"
# POLL-03: how recent a delivery must be for the installation's webhooks to count as arriving.
WEBHOOK_FRESH_INTERVALS = 3
WEBHOOK_FRESH_FLOOR = timedelta(minutes=10)
# Runs looked up per repository per sweep for open jobs that left the active listing, and
# again for runs created since the last sweep that no delivery told of.
MAX_RUN_LOOKUPS = 20
# Each sweep also lists the newest runs (one page, 100) created since the one before it, less
# CREATED_OVERLAP (GitHub's clock and ours may differ), floored to the hour so that an hour's
# sweeps ask the same URL and a quiet repository's answer is a 304, which GitHub does not
# count: one counted call a repository an hour, and one each time its runs change.
CREATED_OVERLAP = timedelta(minutes=5)
CREATED_FLOOR = timedelta(hours=1)
OPEN_STATUSES = (JobStatus.WAITING, JobStatus.QUEUED, JobStatus.IN_PROGRESS)

Clock = Callable[[], float]


def _registry(key: str):
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
    stand_down_installation(installation, until=until, reason=reason, now=now, actor=f"system:{by}")
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
    clear_standdown(installation, now=now, actor=ACTOR)


# -- the sweep -----------------------------------------------------------------------------------


class BudgetSpent(Exception):
    """The sweep has spent its share of the installation's hourly quota."""


class SweepBudget:
    """The share of an installation's hourly quota the sweep may take (`github.sweep_budget`).

    Read from GitHub's own headers on the answers the client has seen: the sweep makes no
    call once `X-RateLimit-Used` (limit minus remaining) has reached `share` of
    `X-RateLimit-Limit`, so the rest of the hour stays for minting runners and removing
    them, the calls that serve jobs. Before any answer has been seen nothing is known, and
    one call is allowed to learn it. 304 answers are not counted by GitHub, so a sweep
    whose lists did not change spends nothing.
    """

    def __init__(self, client, share: float):
        self.client = client
        self.share = share

    def check(self) -> None:
        stats = self.client.stats
        limit, remaining = stats.rate_limit_limit, stats.rate_limit_remaining
        if limit is None or remaining is None or limit <= 0:
            return
        reset = stats.rate_limit_reset
        if reset is not None and reset <= self.client.app.now():
            return  # the window those numbers were about has ended: the quota is back
        if limit - remaining >= self.share * limit:
            raise BudgetSpent(
                f"{limit - remaining} of {limit} calls this hour are spent, and the sweep "
                f"keeps to {self.share:.0%} of them (github.sweep_budget)"
            )


@dataclass
class PollReport:
    """What one sweep did, per installation (by GitHub installation id).

    `polled` were swept in full (their webhooks are not arriving); `safety_swept` got the
    safety sweep of queued runs though their webhooks arrive; `skipped_webhooks` had
    webhooks arriving and a safety sweep within `github.safety_sweep_interval`.
    """

    enabled: bool = True
    configured: bool = True
    polled: list[int] = field(default_factory=list)
    safety_swept: list[int] = field(default_factory=list)
    skipped_webhooks: list[int] = field(default_factory=list)
    skipped_standdown: list[int] = field(default_factory=list)
    stood_down: dict[int, datetime] = field(default_factory=dict)
    over_budget: dict[int, str] = field(default_factory=dict)
    errors: dict[int, list[str]] = field(default_factory=dict)
    jobs_seen: int = 0
    jobs_changed: int = 0
    runs_listed: int = 0

    @property
    def changed(self) -> bool:
        return self.jobs_changed > 0


# Per (installation, repository): each run whose jobs were listed (or that a safety sweep
# met already known), and the run's status and `updated_at` then. A run whose stamp has not
# moved has nothing new to say, so its jobs are not listed again. Kept in the database
# (SweptRun), not in the process: with a memory per process every restarted controller and
# every django-q worker listed each queued run's jobs again, which during a burst with ten
# kills can spend the sweep's whole share of the hour, and then nothing lost is asked after.


def _load_memo(installation: Installation, repo: str) -> dict[int, str]:
    rows = SweptRun.objects.filter(installation=installation, repository=repo.lower())
    return dict(rows.values_list("run_id", "stamp"))


def _save_memo(
    installation: Installation, repo: str, before: dict[int, str], memo: dict[int, str]
) -> None:
    """Write what changed in `memo` since `before`: a bookkeeping cache, so no action and
    no audit row; written only after the jobs it stands for were recorded."""
    repo = repo.lower()
    gone = set(before) - set(memo)
    if gone:
        SweptRun.objects.filter(
            installation=installation, repository=repo, run_id__in=gone
        ).delete()
    changed = [
        SweptRun(installation=installation, repository=repo, run_id=run_id, stamp=stamp)
        for run_id, stamp in memo.items()
        if before.get(run_id) != stamp
    ]
    if changed:
        SweptRun.objects.bulk_create(
            changed,
            update_conflicts=True,
            unique_fields=["installation", "repository", "run_id"],
            update_fields=["stamp"],
        )


def _repositories(installation: Installation, client, budget: SweepBudget) -> list[str]:
    listed = [r for r in (installation.repositories or []) if isinstance(r, str) and "/" in r]
    if listed:
        return listed
    budget.check()
    return client.repositories()


def _worth_recording(
    job: dict, status: str, known: dict[int, str], our_runners: set[str], *, unheard: bool = False
) -> bool:
    """Which of GitHub's jobs the poller feeds through.

    Queued (and waiting) jobs always: they are the demand. A job already running counts when
    it runs on one of our runners (POLL-02), or when we know the job, so one taken by some
    other runner stops counting as demand. A finished one when we know it and have not heard
    it finish: that ends its runner; and one of a run no delivery told us of (`unheard`): its
    every delivery was lost, and it is recorded as the webhook would have. Other jobs of those
    runs are nobody's business here.
    """
    if status in (JobStatus.QUEUED, JobStatus.WAITING):
        return True
    github_id = job.get("id")
    if status == JobStatus.IN_PROGRESS:
        return github_id in known or job.get("runner_name") in our_runners
    if status == JobStatus.COMPLETED:
        if github_id not in known:
            return unheard
        return known[github_id] != JobStatus.COMPLETED
    return False


def _feed(
    jobs: list,
    repo: str,
    installation: Installation,
    now: datetime,
    report: PollReport,
    *,
    unheard: bool = False,
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
        if status is None or not _worth_recording(job, status, known, ours, unheard=unheard):
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


def _runs_to_list(runs: list, memo: dict[int, str], *, full: bool) -> list[tuple[int, str]]:
    """The runs whose jobs are worth a call, oldest first: (run id, status and updated_at).

    A run none of whose jobs we hold is listed (a dropped `queued` delivery is found this
    way), and so is a run whose status or `updated_at` moved since we last looked (a job
    joined it, or in a full sweep one of its jobs started or ended while no webhook told
    us). A run we hold jobs of and first see in a safety sweep is remembered unlisted: the
    webhooks told us of it. Everything else costs nothing. (`updated_at` has whole seconds:
    a second change within the second of our listing waits for the run's next change.)
    """
    runs = [r for r in runs if isinstance(r, dict) and isinstance(r.get("id"), int)]
    ids = [r["id"] for r in runs]
    held = set(Job.objects.filter(run_id__in=ids).values_list("run_id", flat=True).distinct())
    wanted = []
    for run in sorted(runs, key=lambda r: r["id"]):
        stamp = _stamp(run)
        seen = memo.get(run["id"])
        if seen == stamp:
            continue
        if run["id"] in held and seen is None and not full:
            memo[run["id"]] = stamp
            continue
        wanted.append((run["id"], stamp))
    return wanted


@dataclass
class _Sweep:
    """One installation's sweep: who asks, within what budget, at what `now`, told where."""

    installation: Installation
    client: Any
    budget: SweepBudget
    now: datetime
    report: PollReport


def _stamp(run: dict) -> str:
    """What the memo keeps of a run: a change in either means its jobs may have changed."""
    return f"{run.get('status')} {run.get('updated_at')}"


def _list_run(
    sw: _Sweep, repo: str, run_id: int, stamp: str, memo: dict[int, str], *, unheard: bool
) -> None:
    """One run's jobs, fed through, and the run remembered as listed at `stamp`."""
    sw.budget.check()
    try:
        jobs = sw.client.run_jobs(repo, run_id).items
    except NotFound as exc:  # the run was deleted between the two calls
        sw.report.errors.setdefault(sw.installation.github_id, []).append(str(exc))
        return
    sw.report.runs_listed += 1
    _feed(jobs, repo, sw.installation, sw.now, sw.report, unheard=unheard)
    memo[run_id] = stamp


def _list_and_feed(sw: _Sweep, repo: str, runs: list, memo: dict[int, str], *, full: bool):
    for run_id, stamp in _runs_to_list(runs, memo, full=full):
        _list_run(sw, repo, run_id, stamp, memo, unheard=False)


def _list_unheard(sw: _Sweep, repo: str, runs: list, memo: dict[int, str]) -> None:
    """The jobs of runs created since the last sweep that no delivery told us of: none of
    their jobs is held here. A job whose `queued`, `in_progress` and `completed` deliveries
    were all lost (and the redeliveries asked for them) is found this way within a sweep
    interval, finished or not; the queued listing alone never sees a run that started, or
    ended, between two sweeps. At most MAX_RUN_LOOKUPS runs a repository a sweep, oldest
    first; a run's listing is remembered, so it costs one call until it changes."""
    runs = [r for r in runs if isinstance(r, dict) and isinstance(r.get("id"), int)]
    ids = [r["id"] for r in runs]
    held = set(Job.objects.filter(run_id__in=ids).values_list("run_id", flat=True).distinct())
    looked = 0
    for run in sorted(runs, key=lambda r: r["id"]):
        stamp = _stamp(run)
        if run["id"] in held or memo.get(run["id"]) == stamp:
            continue
        if looked == MAX_RUN_LOOKUPS:
            break  # the rest next sweep
        looked += 1
        _list_run(sw, repo, run["id"], stamp, memo, unheard=True)


def created_since(installation: Installation) -> datetime | None:
    """Where a sweep's listing of new runs starts: the last sweep less CREATED_OVERLAP,
    floored to CREATED_FLOOR; None on an installation's first sweep (the runs before it are
    not Zoomies' to record, and its queued ones are listed). After a long outage it starts
    at the last sweep still, and reads the newest page only: the redelivery pass is the way
    back from an outage, this listing is for what fell between two sweeps."""
    last = installation.last_polled_at
    if last is None:
        return None
    step = int(CREATED_FLOOR.total_seconds())
    start = int((last - CREATED_OVERLAP).timestamp()) // step * step
    return datetime.fromtimestamp(start, UTC)


def runner_gone_jobs() -> QuerySet[Job]:
    """Jobs still in progress here whose runner is gone (issue 21 item 3): its row ended
    (failed, or removed before GitHub's `completed` was heard), or was reaped (one of our
    names with no row left). A job on someone else's runner is not among them."""
    reaped = Q(runner__isnull=True, runner_name__startswith=naming.PREFIX) & ~Exists(
        Runner.objects.filter(name=OuterRef("runner_name"))
    )
    return Job.objects.filter(status=JobStatus.IN_PROGRESS).filter(
        Q(runner__state__in=list(TERMINAL_STATES)) | reaped
    )


def _settle_vanished(sw: _Sweep, repo: str, active_runs: set[int]) -> None:
    """Ask after open jobs of ours whose run is not among the runs just listed, and after
    every job in progress whose runner is gone.

    Their run finished, or they were cancelled, between two sweeps; with no webhook nothing
    else would say so, and a job left queued here is demand for ever. In a safety sweep
    (only queued runs listed) this also asks after jobs whose run is in progress, so a lost
    `in_progress` or `completed` delivery is made good (issue 11 item 2). A job whose runner
    is gone is asked after even while its run is listed as active (issue 21 item 3): the
    run's listing changes only when GitHub changes it, so a job stopped with its controller
    stayed `in_progress` here for good. Those runs first, then one call per run, at most
    MAX_RUN_LOOKUPS runs a repository a sweep; the rest are asked after next time.
    """
    installation, client, budget, now, report = (
        sw.installation, sw.client, sw.budget, sw.now, sw.report
    )  # fmt: skip
    open_jobs = (
        Job.objects.filter(repository__iexact=repo, status__in=OPEN_STATUSES)
        .exclude(run_id__in=active_runs)
        .exclude(run_id=None)
        .order_by("run_id")
    )
    vanished = dict(open_jobs.values_list("github_id", "run_id"))
    orphaned = dict(
        runner_gone_jobs()
        .filter(repository__iexact=repo)
        .exclude(run_id=None)
        .values_list("github_id", "run_id")
    )
    vanished.update(orphaned)
    # At most half the lookups for those, so runs that vanished still get asked after
    # while a lost host's runners' jobs run on (issue 11 item 4) for hours.
    first = sorted(set(orphaned.values()))[: MAX_RUN_LOOKUPS // 2]
    runs = first + sorted(set(vanished.values()) - set(first))
    for run_id in runs[:MAX_RUN_LOOKUPS]:
        budget.check()
        try:
            jobs = client.run_jobs(repo, run_id).items
        except NotFound:
            _run_gone(sw, repo, run_id, [gid for gid, run in vanished.items() if run == run_id])
            continue
        report.runs_listed += 1
        _feed([j for j in jobs if isinstance(j, dict) and j.get("id") in vanished],
              repo, installation, now, report)  # fmt: skip


def _run_gone(sw: _Sweep, repo: str, run_id: int, job_ids: list[int]) -> None:
    """GitHub answers 404 for the run of open jobs here (issue 29 item 4): the run or its
    repository is gone, or out of this installation's reach. Each job is asked after by its
    own id first, so one answer GitHub has not caught up on ends nothing: a job GitHub
    still has is recorded as it says; one it answers 404 for too is completed here, with no
    conclusion (GitHub gave none) and no runner named, so it stops being demand and asked
    after on every sweep."""
    gone = 0
    open_jobs = Job.objects.filter(github_id__in=job_ids).exclude(status=JobStatus.COMPLETED)
    for job in open_jobs:
        sw.budget.check()
        try:
            found = sw.client.job(repo, job.github_id)
        except NotFound:
            pass
        except GitHubError as exc:
            sw.report.errors.setdefault(sw.installation.github_id, []).append(str(exc))
            continue  # asked again next sweep
        else:
            _feed([found], repo, sw.installation, sw.now, sw.report)
            continue
        update = JobUpdate(
            github_id=job.github_id, status=JobStatus.COMPLETED, repository=repo,
            labels=tuple(job.labels), run_id=run_id, name=job.name, completed_at=sw.now,
        )  # fmt: skip
        recorded = apply_job_update(
            update, installation=sw.installation, now=sw.now, source="poll", actor=ACTOR
        )
        if recorded is not None and recorded.status == JobStatus.COMPLETED:
            gone += 1
    if gone:
        sw.report.jobs_changed += gone
        log.warning(
            "%s run %s: GitHub answers 404 for it and its jobs; %d open job(s) here completed",
            repo, run_id, gone,
        )  # fmt: skip


def _sweep_installation(sw: _Sweep, *, full: bool) -> None:
    """One installation: its queued runs (and, in full, in-progress ones); errors propagate.

    Safety sweep (`full=False`, webhooks arriving): the queued runs of each repository, one
    conditional call a page, and the jobs of queued runs none of whose jobs we hold. Full
    sweep (the poll fallback): in-progress runs too, the jobs of runs that changed, and what
    became of open jobs whose run left both lists. Both: the runs created since the last
    sweep that no delivery told of (`_list_unheard`).
    """
    installation, client, budget = sw.installation, sw.client, sw.budget
    since = created_since(installation)
    for repo in _repositories(installation, client, budget):
        lists: list[list] = []
        recent: list = []
        try:
            for status in ("queued", "in_progress") if full else ("queued",):
                budget.check()
                lists.append(client.runs(repo, status).items)
            if since is not None:
                budget.check()
                recent = client.runs_created_since(repo, since).items
        except NotFound as exc:
            # A repository removed from the installation; the others still need sweeping.
            sw.report.errors.setdefault(installation.github_id, []).append(str(exc))
            continue
        active_ids = {r["id"] for runs in lists for r in runs if isinstance(r, dict) and "id" in r}
        recent = [r for r in recent if isinstance(r, dict) and r.get("id") not in active_ids]
        recent_ids = {r.get("id") for r in recent}
        # Both sweeps, first: a job we hold open whose run left the lists is asked after, so
        # a lost `in_progress` or `completed` delivery is made good within a sweep interval
        # even while other deliveries keep arriving (issue 11 item 2). Before the runs'
        # listings, so that a sweep the budget stops half-way has still made these good;
        # MAX_RUN_LOOKUPS bounds it.
        _settle_vanished(sw, repo, active_ids)
        before = _load_memo(installation, repo)
        # Forget runs that left the lists, so the memory stays the size of what is active.
        memo = {
            run_id: stamp
            for run_id, stamp in before.items()
            if run_id in active_ids or run_id in recent_ids
        }
        try:
            for runs in lists:
                _list_and_feed(sw, repo, runs, memo, full=full)
            _list_unheard(sw, repo, recent, memo)
        finally:
            # Also when the budget or GitHub stopped the sweep: what was listed stays known.
            _save_memo(installation, repo, before, memo)


def safety_sweep_due(installation: Installation, now: datetime) -> bool:
    """Whether an installation whose webhooks arrive is due its safety sweep."""
    last = installation.last_polled_at
    return last is None or now - last >= _registry("github.safety_sweep_interval")


def poll_step(
    now: datetime,
    *,
    app=None,
    clock: Clock | None = None,
    started_at: datetime | None = None,
) -> PollReport:
    """One sweep over every active installation (POLL-01..07, and the safety sweep).

    An installation whose webhooks are not arriving is swept in full (the poll fallback); one
    whose webhooks arrive gets the safety sweep every `github.safety_sweep_interval`, because
    GitHub never redelivers a dropped `queued` and its job would otherwise wait unseen.
    Either keeps within `github.sweep_budget` of the hour's quota.

    `app` is the GitHubApp (default: the configured one); `clock` is the clock its
    `RateLimited.retry_at` is measured on (see `standdown_until`). The reconcile pass is
    woken when any job changed.
    """
    report = PollReport()
    if not _registry("github.poll_fallback"):
        report.enabled = False
        return report
    if app is None:
        app = get_app()
    if app is None:
        report.configured = False
        return report
    share = _registry("github.sweep_budget")
    for installation in Installation.objects.filter(active=True).order_by("pk"):
        gid = installation.github_id
        if under_standdown(installation, now):
            report.skipped_standdown.append(gid)
            continue
        full = not webhooks_arriving(installation, now, started_at)
        if not full and not safety_sweep_due(installation, now):
            report.skipped_webhooks.append(gid)
            continue
        client = app.for_installation(gid)
        budget = SweepBudget(client, share)
        try:
            _sweep_installation(_Sweep(installation, client, budget, now, report), full=full)
        except BudgetSpent as exc:
            # What was not looked at is looked at next time; the hour's rest is for runners.
            log.warning("poller: installation %s (%s): %s", gid, installation.account, exc)
            report.over_budget[gid] = str(exc)
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
        (report.polled if full else report.safety_swept).append(gid)
    if report.changed:
        transaction.on_commit(wake_reconcile)
    return report


# How many jobs the runner-gone problem names.
GONE_JOBS_NAMED = 5


def runner_gone_problems(now: datetime) -> list[dict]:
    """Issue 21 item 3: jobs still in progress `runners.runner_gone_job_warning` after their
    runner ended (since its end; since the job's last change when the row is reaped). The
    sweep asks GitHub after each every time it runs; one GitHub still shows running, or
    whose run it cannot find, stayed `in_progress` here for good with nothing said."""
    bound: timedelta = _registry("runners.runner_gone_job_warning")
    stuck = (
        runner_gone_jobs()
        .annotate(gone_since=Coalesce("runner__finished_at", "updated_at"))
        .filter(gone_since__lte=now - bound)
        .order_by("gone_since", "pk")
    )
    rows = list(
        stuck.values_list("repository", "github_id", "runner_name", "runner__state")[
            : GONE_JOBS_NAMED + 1
        ]
    )
    if not rows:
        return []
    total = len(rows) if len(rows) <= GONE_JOBS_NAMED else stuck.count()
    named = [
        f"{repo} job {github_id} (runner {name or '?'} {state or 'gone'})"
        for repo, github_id, name, state in rows[:GONE_JOBS_NAMED]
    ]
    more = f" and {total - GONE_JOBS_NAMED} more" if total > GONE_JOBS_NAMED else ""
    minutes = int(bound.total_seconds() // 60)
    return [
        {
            "key": "jobs.runner_gone",
            "severity": "warning",
            "title": (
                f"{total} job(s) still in progress more than {minutes} min after their runner ended"
            ),
            "detail": (
                f"{', '.join(named)}{more}. The poller asks GitHub after each on every sweep, "
                "and GitHub still shows it running or cannot find its run. Look at the run on "
                "GitHub and cancel it if nothing runs it; runners.runner_gone_job_warning "
                "sets when a job is named here."
            ),
        }
    ]
