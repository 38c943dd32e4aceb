"""What the problems drawer says about GitHub (POLL-04, POLL-06), pools and waiting jobs.

A fleet that silently stopped receiving webhooks looks exactly like a quiet fleet, so when
the poller is doing the work webhooks should, the drawer says so in plain words; and each
installation GitHub has rate-limited is listed with when it will be asked again. Likewise
a pool the reconcile pass cannot read, and a job that has waited too long for a runner
(issue 8 items 1 and 2): each would otherwise look like a quiet fleet too.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Max

from runners import naming
from runners.models import Installation, Job, Pool, Runner
from runners.poller import runner_gone_problems, webhook_fresh_window
from runners.pool_views import read_pools
from runners.states import JobStatus
from zoomies_site.core import registry

WARNING = "warning"
# Polls count as happening while the latest is within this many poll intervals.
RECENT_POLL_INTERVALS = 3


def _registry(key: str):
    return registry.get(key)


def _when(at: datetime, now: datetime) -> str:
    minutes = int((now - at).total_seconds() // 60)
    ago = "less than a minute ago" if minutes < 1 else f"{minutes} min ago"
    return f"{at:%Y-%m-%d %H:%M:%S} UTC ({ago})"


def _polling_only(now: datetime) -> dict | None:
    """POLL-04: the poller has polled recently and no installation's webhooks are arriving."""
    active = Installation.objects.filter(active=True)
    seen = active.aggregate(polled=Max("last_polled_at"), hooked=Max("last_webhook_at"))
    polled, hooked = seen["polled"], seen["hooked"]
    if polled is None or now - polled > RECENT_POLL_INTERVALS * _registry("github.poll_interval"):
        return None
    window = webhook_fresh_window()
    if hooked is not None and now - hooked < window:
        return None
    if hooked is None:
        title = "Running on polling alone: no webhook from GitHub has ever arrived"
    else:
        title = (
            "Running on polling alone: no webhook from GitHub has arrived since "
            f"{_when(hooked, now)}"
        )
    interval = int(_registry("github.poll_interval").total_seconds())
    return {
        "key": "github.polling_only",
        "severity": WARNING,
        "title": title,
        "detail": (
            f"Jobs are being found by the poll fallback every {interval} s instead, so each "
            "one waits up to that long before a runner is started for it, and every poll "
            "spends API quota. Check the GitHub App's webhook URL, that it reaches this "
            "controller, and that its secret matches github.webhook_secrets (the App's "
            "Advanced page lists recent deliveries and their answers)."
        ),
    }


def _sentence(text: str) -> str:
    """A reason as a sentence of its own (issue 29 item 4: "...until GitHub said the quota
    returns Until then ..." ran two into one)."""
    text = (text or "Rate limited").strip()
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _standdowns(now: datetime) -> list[dict]:
    problems = []
    held = Installation.objects.filter(active=True, standdown_until__gt=now).order_by("pk")
    for inst in held:
        problems.append(
            {
                "key": "github.standdown",
                "severity": WARNING,
                "title": (
                    f"GitHub is rate-limiting {inst.account}: not asked again until "
                    f"{inst.standdown_until:%Y-%m-%d %H:%M:%S} UTC"
                ),
                "detail": (
                    f"Installation {inst.github_id}. {_sentence(inst.standdown_reason)} "
                    "Until then the poller and the registration reap leave this installation "
                    "alone; the other installations carry on."
                ),
            }
        )
    return problems


def github_problems(now: datetime) -> list[dict]:
    """Problems about GitHub, each a dict of key, severity, title and detail."""
    problems = []
    polling = _polling_only(now) if _registry("github.poll_fallback") else None
    if polling is not None:
        problems.append(polling)
    problems.extend(_standdowns(now))
    return problems


def unreadable_pools() -> list[dict]:
    """Pools the reconcile pass skips because it cannot read them (runners.pool_views)."""
    _views, skipped = read_pools(Pool.objects.order_by("name"))
    return [
        {
            "key": f"pool.unreadable:{bad.name}",
            "severity": "error",
            "title": f"Pool {bad.name} cannot be read, so it gets no runners",
            "detail": (
                f"{bad.reason}. The reconcile pass skips this pool and carries on with the "
                "others; its queued jobs wait until it is fixed. Open the pool in the admin "
                "and save it with valid values."
            ),
        }
        for bad in skipped
    ]


def docker_client_missing() -> list[dict]:
    """BACK-17: pools that provide Docker on a stock image whose Docker variant cannot be
    known, left on it rather than moved to a tag the registry may lack."""
    problems = []
    for pool in Pool.objects.filter(dind=True).order_by("name"):
        why = naming.docker_client_missing(pool.image, pool.platform, pool.backend, pool.dind)
        if why:
            problems.append(
                {
                    "key": f"pool.docker_client_missing:{pool.name}",
                    "severity": WARNING,
                    "title": f"Pool {pool.name} provides Docker on an image that may have no "
                    "Docker client",
                    "detail": (
                        f"{why}. Its runners are started on it unchanged, because a tag the "
                        "registry lacks would stop every job in the pool; a job that runs "
                        "docker fails, and the runner's log warns. Set the pool's image to a "
                        f"tag this build publishes ({', '.join(naming.STOCK_TAGS)}) or its "
                        f"Docker variant ({naming.STOCK_REPOSITORY}:<tag>"
                        f"{naming.DOCKER_SUFFIX}), or to an image with a Docker client."
                    ),
                }
            )
    return problems


# How many distinct reasons, and jobs per reason, the waiting-jobs problem names.
REASONS_NAMED, JOBS_NAMED = 5, 3


def waiting_jobs(now: datetime) -> list[dict]:
    """Queued jobs older than runners.job_wait_warning, grouped by why they wait (item 2)."""
    threshold = _registry("runners.job_wait_warning")
    waiting = Job.objects.filter(status=JobStatus.QUEUED, created_at__lte=now - threshold)
    total = waiting.count()
    if not total:
        return []
    groups: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    rows = waiting.order_by("created_at", "pk").values_list(
        "wait_reason", "repository", "github_id"
    )
    for reason, repository, github_id in rows.iterator():
        reason = reason or "not yet looked at by the reconcile pass"
        counts[reason] = counts.get(reason, 0) + 1
        named = groups.setdefault(reason, [])
        if len(named) < JOBS_NAMED:
            named.append(f"{repository} job {github_id}")
    ordered = sorted(counts, key=lambda r: -counts[r])
    parts = [
        f"{counts[r]} ({', '.join(groups[r])}{', ...' if counts[r] > len(groups[r]) else ''}): {r}"
        for r in ordered[:REASONS_NAMED]
    ]
    if len(ordered) > REASONS_NAMED:
        parts.append(f"and {len(ordered) - REASONS_NAMED} more reasons")
    minutes = int(threshold.total_seconds() // 60)
    return [
        {
            "key": "jobs.waiting_too_long",
            "severity": WARNING,
            "title": f"{total} job(s) have waited more than {minutes} min for a runner",
            "detail": (
                "Why, as the latest reconcile pass saw it: "
                + "; ".join(parts)
                + ". The Jobs API (/api/v1/jobs?status=queued) shows each job's reason "
                "(runners.job_wait_warning sets when a wait is named here)."
            ),
        }
    ]


def failing_mints(now: datetime) -> list[dict]:
    """Issue 21 item 5: an installation whose runner credentials keep failing to mint. Its
    pools get no runner and the log said it twice every five seconds while this list was
    empty; now it says it here, from the second failure or a minute in."""
    found = []
    for inst in Installation.objects.filter(mint_failures__gt=0).order_by("pk"):
        since = inst.mint_failing_since or now
        if inst.mint_failures < 2 and now - since < timedelta(minutes=1):
            continue
        pools = sorted(Pool.objects.filter(installation=inst).values_list("name", flat=True))
        found.append(
            {
                "key": "github.mint_failing",
                "severity": WARNING,
                "title": (
                    f"Runner credentials for installation {inst.account} ({inst.github_id}) "
                    f"failed to mint {inst.mint_failures} time(s) since {_when(since, now)}: "
                    f"{inst.mint_error}"
                ),
                "detail": (
                    "Check that the GitHub App is still installed on this account and that "
                    "the installation id is right"
                    + (f"; pools affected: {', '.join(pools)}" if pools else "")
                    + ". Minting is retried with a growing wait."
                ),
            }
        )
    return found


# How far back a pool's failed starts are counted (the latest hour's say what is wrong now).
FAILED_STARTS_WINDOW = timedelta(hours=1)


def failing_starts(now: datetime) -> list[dict]:
    """Issue 21 item 5, issue 29 items 1 and 4: a pool whose runners fail before GitHub ever
    shows them online (a provision timeout, a runner program that cannot start, a runner
    that exits 1), with no runner of it online since the first of those failures. The
    pool showed "active" and this list stayed empty; now its cause, count and since when
    are here from the first failure."""
    failed = Runner.objects.filter(
        failed_at__gte=now - FAILED_STARTS_WINDOW, online_at__isnull=True
    ).order_by("failed_at", "pk")
    by_pool: dict[int, list[Runner]] = {}
    for runner in failed.select_related("pool"):
        by_pool.setdefault(runner.pool_id, []).append(runner)
    found = []
    for runners in sorted(by_pool.values(), key=lambda rs: rs[0].pool.name):
        pool = runners[0].pool
        last_online = Runner.objects.filter(pool=pool).aggregate(at=Max("online_at"))["at"]
        if last_online is not None:
            runners = [r for r in runners if r.failed_at > last_online]
        if not runners:
            continue
        latest = runners[-1]
        cause = (latest.message or "no reason was recorded").splitlines()[0][:300]
        found.append(
            {
                "key": f"pool.failing_starts:{pool.name}",
                "severity": WARNING,
                "title": (
                    f"Pool {pool.name}: {len(runners)} runner(s) failed before GitHub showed "
                    f"them online, since {_when(runners[0].failed_at, now)}"
                ),
                "detail": (
                    f"The latest ({latest.name}): {_sentence(cause)} No runner of this pool "
                    "has come online since the first failure; the pool keeps trying, each "
                    "start after a growing wait (scheduler.start_backoff). A failed runner's "
                    "message and output are on the Runners page."
                ),
            }
        )
    return found


def removed_installations() -> list[dict]:
    """Issue 29 item 3: an installation removed (uninstalled or suspended at GitHub, or by
    an operator) whose pools are still configured: they get no runner until it is back."""
    found = []
    for inst in Installation.objects.filter(active=False).order_by("pk"):
        pools = sorted(Pool.objects.filter(installation=inst).values_list("name", flat=True))
        if not pools:
            continue
        found.append(
            {
                "key": "github.installation_removed",
                "severity": WARNING,
                "title": f"Installation {inst.account} ({inst.github_id}) is removed",
                "detail": (
                    f"Its pools are paused and nothing asks GitHub for it: {', '.join(pools)}. "
                    "Install the App on the account again (POST /api/v1/installations adds "
                    "it back), or delete the pools."
                ),
            }
        )
    return found


def pools_of_removed_repositories() -> list[dict]:
    """Issue 29 item 3: a pool paused because its repository was taken out of its
    installation at GitHub (`installation_repositories.removed`). An installation that
    lists no repositories has all of them, so none of its pools is named."""
    found = []
    for inst in Installation.objects.filter(active=True).exclude(repositories=[]).order_by("pk"):
        listed = {str(r).lower() for r in inst.repositories or ()}
        pools = Pool.objects.filter(installation=inst, paused=True).exclude(repository="")
        for pool in pools.order_by("name"):
            if pool.repository.lower() in listed:
                continue
            found.append(
                {
                    "key": f"pool.repository_removed:{pool.name}",
                    "severity": WARNING,
                    "title": (
                        f"Pool {pool.name} is paused: its repository {pool.repository} is no "
                        f"longer in installation {inst.account} ({inst.github_id})"
                    ),
                    "detail": (
                        "The repository was removed from the GitHub App's installation, so no "
                        "runner can be registered there. Add it back to the installation on "
                        "GitHub and resume the pool, or point the pool at another repository."
                    ),
                }
            )
    return found


def runners_problems(now: datetime) -> list[dict]:
    """Everything this app adds to the problems list."""
    return [
        *github_problems(now),
        *failing_mints(now),
        *failing_starts(now),
        *removed_installations(),
        *pools_of_removed_repositories(),
        *unreadable_pools(),
        *docker_client_missing(),
        *waiting_jobs(now),
        *runner_gone_problems(now),
    ]
