"""Installation actions, the one writer of `Installation` rows (issue 22 item 4): adding
one (the API, the command, GitHub's `installation.created`, the sandbox), its repositories
as GitHub reports them, removing one, and the rate-limit stand-down (POLL-05..09), each
with its audit row.

The poller, the reconcile pass and the registration reap decide when an installation is
rate limited and until when (`runners.poller.standdown_until`); these write it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q

from accounts import audit
from runners.actions.pools import set_pool_paused
from runners.models import Installation, Pool
from zoomies_site.core import metrics


def add_installation(
    *,
    github_id: int,
    account: str,
    kind: str,
    repositories: list[str],
    actor: str,
    now: datetime,
    only_new: bool = False,
) -> tuple[Installation, bool]:
    """Record (or re-activate) a GitHub App installation Zoomies serves; True when made.

    `only_new` for GitHub's own `installation.created`: a delivery redelivered after an
    `installation.deleted` must not bring the installation back, so a row that exists is
    left as it is. Raises ValidationError for values no row may hold.
    """
    installation = Installation(
        github_id=github_id, account=account, kind=kind, repositories=repositories
    )
    installation.full_clean(validate_unique=False)
    values = {"account": account, "kind": kind, "repositories": repositories}
    with transaction.atomic():
        if only_new:
            installation, created = Installation.objects.get_or_create(
                github_id=github_id, defaults=values
            )
            if not created:
                return installation, False
        else:
            installation, created = Installation.objects.update_or_create(
                github_id=github_id, defaults={**values, "active": True}
            )
        audit.record(
            actor=actor,
            action="installation.create" if created else "installation.update",
            target=installation,
            detail={"account": account, "kind": kind},
            at=now,
        )
    return installation, created


def change_repositories(
    installation: Installation, *, added: list[str], removed: list[str], actor: str,
    now: datetime,
) -> list[str]:  # fmt: skip
    """GitHub's `installation_repositories`: the repositories it lists, as GitHub says (case
    kept, compared without it); returns the list kept. Inside the caller's transaction."""
    gone = {r.lower() for r in removed}
    with transaction.atomic():
        row = Installation.objects.select_for_update().get(pk=installation.pk)
        repos = [r for r in (row.repositories or []) if str(r).lower() not in gone]
        repos += [r for r in added if r.lower() not in {str(x).lower() for x in repos}]
        if repos != row.repositories:
            Installation.objects.filter(pk=row.pk).update(repositories=repos)
            audit.record(
                actor=actor,
                action="installation.repositories",
                target=row,
                detail={"added": added, "removed": sorted(gone)},
                at=now,
            )
    installation.repositories = repos
    return repos


def remove_installation(
    installation: Installation, *, actor: str, now: datetime, why: str = ""
) -> bool:
    """Stop serving an installation: kept as a state (inactive), so its history stays; its
    pools are paused, so nothing asks GitHub for it (issue 29 item 3). Inside the caller's
    transaction when there is one (a webhook burst)."""
    with transaction.atomic():
        moved = Installation.objects.filter(pk=installation.pk, active=True).update(active=False)
        if moved:
            audit.record(actor=actor, action="installation.remove", target=installation, at=now,
                         detail={"why": why} if why else None)  # fmt: skip
            for pool in Pool.objects.filter(installation=installation, paused=False):
                set_pool_paused(pool, paused=True, actor=actor, now=now)
    return bool(moved)


def forget_installations(
    installations: list[Installation], *, actor: str, now: datetime, why: str
) -> int:
    """Delete installation rows outright (the sandbox's of earlier runs, whose fake GitHub
    is gone with them), each with its audit row; returns how many went."""
    gone = 0
    with transaction.atomic():
        for row in installations:
            deleted, _ = Installation.objects.filter(pk=row.pk).delete()
            if deleted:
                gone += 1
                audit.record(actor=actor, action="installation.delete", target=row, at=now,
                             detail={"account": row.account, "why": why})  # fmt: skip
    return gone


def stand_down_installation(
    installation: Installation, *, until: datetime, reason: str, now: datetime, actor: str
) -> datetime:
    """Hold every GitHub call for `installation` until `until`; returns `until`.

    The caller's copy is updated too, so the rest of its sweep sees the hold.
    """
    reason = reason[:300]
    with transaction.atomic(durable=True):
        Installation.objects.filter(pk=installation.pk).update(
            standdown_until=until, standdown_reason=reason
        )
        audit.record(
            actor=actor,
            action="installation.stand_down",
            target=installation,
            detail={"until": until.isoformat(), "reason": reason},
            at=now,
        )
    installation.standdown_until = until
    installation.standdown_reason = reason
    metrics.standdown(actor)
    return until


def clear_standdown(installation: Installation, *, now: datetime, actor: str) -> bool:
    """Forget a stand-down that has run out; True if this call cleared it.

    A compare-and-set on the stored time, so a newer stand-down set meanwhile stays.
    """
    until = installation.standdown_until
    if until is None or until > now:
        return False
    with transaction.atomic(durable=True):
        cleared = Installation.objects.filter(pk=installation.pk, standdown_until=until).update(
            standdown_until=None, standdown_reason=""
        )
        if cleared:
            audit.record(
                actor=actor,
                action="installation.stand_down_over",
                target=installation,
                detail={"was_until": until.isoformat()},
                at=now,
            )
    if cleared:
        installation.standdown_until = None
        installation.standdown_reason = ""
    else:  # a newer stand-down was set meanwhile: the caller's copy should see it
        installation.refresh_from_db(fields=["standdown_until", "standdown_reason"])
    return bool(cleared)


def note_registered_repository(installation_id: int, repository: str) -> None:
    """Remember a repository a runner of this installation registers at (issue 21 item 7).
    Inside the caller's transaction (the runner's row is written in it)."""
    row = Installation.objects.select_for_update().filter(pk=installation_id).first()
    if row is None or repository.lower() in {r.lower() for r in row.registered_repositories}:
        return
    Installation.objects.filter(pk=installation_id).update(
        registered_repositories=[*row.registered_repositories, repository]
    )


def forget_registered_repository(installation_id: int, repository: str) -> None:
    """A reap found nothing of ours at `repository` and no pool names it: stop listing it."""
    with transaction.atomic():
        row = Installation.objects.select_for_update().filter(pk=installation_id).first()
        if row is None:
            return
        kept = [r for r in row.registered_repositories if r.lower() != repository.lower()]
        if kept != row.registered_repositories:
            Installation.objects.filter(pk=installation_id).update(registered_repositories=kept)


# The wait after a failed credential mint, doubled per further failure up to the ceiling.
MINT_BACKOFF = timedelta(seconds=10)
MINT_BACKOFF_MAX = timedelta(minutes=5)


def note_mint_failure(installation: Installation, *, error: str, now: datetime) -> bool:
    """One more failed mint for `installation`: counted, and the next try put off (doubling
    from MINT_BACKOFF to MINT_BACKOFF_MAX). True when this is news (the first failure, or a
    different error), which the caller logs; repeats are not logged again."""
    error = error.splitlines()[0][:300] if error else "unknown error"
    with transaction.atomic():
        row = Installation.objects.select_for_update().get(pk=installation.pk)
        failures = row.mint_failures + 1
        wait = min(MINT_BACKOFF * (2 ** min(failures - 1, 10)), MINT_BACKOFF_MAX)
        Installation.objects.filter(pk=row.pk).update(
            mint_failures=failures,
            mint_failing_since=row.mint_failing_since or now,
            mint_error=error,
            mint_retry_at=now + wait,
        )
    installation.mint_retry_at = now + wait
    return failures == 1 or error != row.mint_error


def note_mint_success(installation: Installation) -> bool:
    """A mint went through: the failures are over. True when there were any."""
    if not installation.mint_failures and installation.mint_retry_at is None:
        return False
    cleared = (
        Installation.objects.filter(pk=installation.pk)
        .exclude(mint_failures=0)
        .update(mint_failures=0, mint_failing_since=None, mint_error="", mint_retry_at=None)
    )
    installation.mint_failures, installation.mint_retry_at = 0, None
    return bool(cleared)


# Issue 29 item 1: how often an installation's registrations are listed while new runners
# of it wait for GitHub to show them online (a conditional list: a 304 costs no quota).
ONLINE_CHECK_EVERY = timedelta(seconds=15)


def online_checked_recently(installation: Installation, *, now: datetime) -> bool:
    """The row as read says an online check ran within ONLINE_CHECK_EVERY: no claim is
    tried (each claim is a write, and a burst runs a pass every few milliseconds)."""
    checked = installation.online_checked_at
    return checked is not None and now - ONLINE_CHECK_EVERY < checked <= now


def note_online_check(installation: Installation, *, now: datetime) -> bool:
    """Claim this installation's online check unless one ran within ONLINE_CHECK_EVERY;
    True when the caller should list its registrations now."""
    recent = Q(online_checked_at__gt=now - ONLINE_CHECK_EVERY, online_checked_at__lte=now)
    claimed = (
        Installation.objects.filter(pk=installation.pk)
        .exclude(recent)  # one stamped in the future (a clock moved back) does not hold it
        .update(online_checked_at=now)
    )
    return bool(claimed)


def repositories_removed(
    installation: Installation, repositories: list[str], *, actor: str, now: datetime
) -> list[str]:
    """Repositories taken out of the installation at GitHub (issue 29 item 3): every pool
    registering its runners at one of them is paused (a mint there would be a 404, and the
    installation's mint backoff would hold its other pools back), and the reap stops
    listing them. Inside the caller's transaction (a webhook burst); the pools paused."""
    from runners.actions.pools import set_pool_paused  # noqa: PLC0415  # pools imports models only

    wanted = {r.lower() for r in repositories}
    paused = []
    pools = Pool.objects.filter(Q(installation=installation) | Q(installation=None))
    for pool in pools.exclude(repository="").order_by("name"):
        if pool.repository.lower() in wanted and not pool.paused:
            set_pool_paused(pool, paused=True, actor=actor, now=now)
            paused.append(pool.name)
    for repo in repositories:
        forget_registered_repository(installation.pk, repo)
    if paused:
        audit.record(actor=actor, action="installation.repositories_removed", target=installation,
                     detail={"repositories": sorted(wanted), "pools_paused": paused},
                     at=now)  # fmt: skip
    return paused
