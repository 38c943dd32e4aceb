"""The registration reap (spec "Reconciliation invariants", reapInterval; POLL-08..11).

GitHub's list of self-hosted runners is compared with our rows `github.reap_first_after`
(1 min) after the process started and every `github.reap_interval` (10 min) after that,
per installation. A registration is an orphan, and is deleted, only when all of these hold
(POLL-11):

* its name has the `zoomies-` prefix (no other registration is ever touched);
* GitHub does not report it busy (and a delete GitHub answers "busy", 422, is left alone:
  the runner took a job after the list said idle);
* no live runner row (any state but failed or removed) explains it, by name or by GitHub
  runner id.

Nothing is deleted for a target whose list call did not succeed (a missing answer is no proof
that a runner is gone). The reap
honours an installation's rate-limit stand-down, and the first refusal it meets stops that
installation's work at once and sets the stand-down exactly as the poller does (POLL-08,
POLL-09); the other installations carry on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Q

from accounts import audit
from runners.actions.installations import forget_registered_repository
from runners.github.config import get_app
from runners.github.errors import GitHubError, RateLimited
from runners.github.scopes import registration_scopes
from runners.models import Installation, Pool, Runner
from runners.naming import PREFIX
from runners.poller import stand_down, under_standdown
from runners.states import LIVE_STATES
from zoomies_site.core import registry

log = logging.getLogger("zoomies.reap")

ACTOR = "system:reap"
Clock = Callable[[], float]


def _registry(key: str):
    return registry.get(key)


def reap_due(installation: Installation, now: datetime, started_at: datetime) -> bool:
    """POLL-10: first at `started_at + reap_first_after`, then every `reap_interval`.

    A `last_reaped_at` from before this process started does not delay the first reap a
    minute in. Nor does a restart delay an overdue one: a reap `reap_interval` after the
    last (or after the installation was added, if never) is due at once, so restarts less
    than a minute apart no longer postpone it for ever (issue 21 item 21).
    """
    interval = _registry("github.reap_interval")
    last = installation.last_reaped_at
    since = last or installation.created_at
    if since is not None and now >= since + interval:
        return True
    if now < started_at + _registry("github.reap_first_after"):
        return False
    if last is None or last < started_at:
        return True
    return now >= last + interval


@dataclass
class ReapReport:
    """What one reap step did. Installations by GitHub installation id."""

    configured: bool = True
    checked: list[int] = field(default_factory=list)
    not_due: list[int] = field(default_factory=list)
    skipped_standdown: list[int] = field(default_factory=list)
    stood_down: dict[int, datetime] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    kept_busy: list[str] = field(default_factory=list)
    kept_explained: list[str] = field(default_factory=list)
    kept_foreign: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    errors: dict[int, list[str]] = field(default_factory=dict)


def _targets(installation: Installation, client) -> list[dict[str, str]]:
    """Where this installation's registrations live: the organisation and every repository a
    pool registers at, or each repository (`runners.github.scopes`)."""
    pool_repos = Pool.objects.filter(Q(installation=installation) | Q(installation=None))
    pool_repos = [*pool_repos.exclude(repository="").values_list("repository", flat=True)]
    # Where runners were registered, whatever the pools say now (issue 21 item 7).
    pool_repos += [r for r in installation.registered_repositories if isinstance(r, str)]
    repos = []
    if installation.kind == Installation.Kind.REPO:
        repos = [r for r in (installation.repositories or []) if isinstance(r, str) and "/" in r]
        repos = repos or client.repositories()
    return registration_scopes(installation.kind, installation.account, repos, pool_repos)


def _explained(name: str, runner_id: object) -> bool:
    """A live runner row that accounts for this registration."""
    match = Q(name=name)
    if isinstance(runner_id, int):
        match |= Q(github_runner_id=runner_id)
    return Runner.objects.filter(match, state__in=LIVE_STATES).exists()


def _forget_if_done(installation: Installation, target: dict[str, str], ours_left: int) -> None:
    """A remembered repository with nothing of ours left and no pool naming it is dropped
    from the installation's list: the reap stops listing it."""
    repo = target.get("repo")
    if (
        repo is None
        or ours_left
        or repo.lower() not in {r.lower() for r in installation.registered_repositories}
    ):
        return
    if Pool.objects.filter(repository__iexact=repo).exists():
        return
    forget_registered_repository(installation.pk, repo)


def _reap_target(client, target: dict[str, str], report: ReapReport, gid: int) -> int:
    """List one target's registrations and delete its orphans; how many registrations of
    ours are left there (kept busy or explained). RateLimited propagates."""
    where = next(iter(target.values()))
    registrations = client.list_runners(**target)
    ours_left = 0
    # Rows are read after the list, so a runner written while the list was in flight counts.
    for reg in registrations:
        if not isinstance(reg, dict):
            continue
        name, runner_id = reg.get("name"), reg.get("id")
        label = f"{where}:{name}"
        if not isinstance(name, str) or not name.startswith(PREFIX):
            report.kept_foreign.append(label)
            continue
        if reg.get("busy") is not False:
            report.kept_busy.append(label)
            ours_left += 1
            continue
        if _explained(name, runner_id) or not isinstance(runner_id, int):
            report.kept_explained.append(label)
            ours_left += 1
            continue
        try:
            answer = client.delete_runner(**target, runner_id=runner_id)
        except RateLimited:
            raise
        except GitHubError as exc:
            report.errors.setdefault(gid, []).append(str(exc))
            ours_left += 1  # not known to be gone
            continue
        if answer == "busy":
            report.kept_busy.append(label)
            ours_left += 1
        elif answer == "gone":
            report.gone.append(label)
        else:
            report.deleted.append(label)
            audit.record(
                actor=ACTOR,
                action="github.registration_deleted",
                detail={
                    "installation": gid,
                    "target": where,
                    "name": name,
                    "github_runner_id": runner_id,
                    "why": "zoomies- registration, not busy, no live runner row explains it",
                },
            )
            log.info("reap: deleted orphan registration %s (id %s) at %s", name, runner_id, where)
    return ours_left


def reap_step(
    now: datetime,
    *,
    started_at: datetime,
    app=None,
    clock: Clock | None = None,
) -> ReapReport:
    """One reap over every active installation that is due (POLL-08..11).

    `started_at` is when this process started (the first reap waits reap_first_after from
    it); `clock` is the GitHub client's clock, for the stand-down arithmetic, as in the
    poller. `last_reaped_at` is stamped on every attempt, answered or not, so a GitHub that
    is down is asked again one interval later rather than on every tick.
    """
    report = ReapReport()
    if app is None:
        app = get_app()
    if app is None:
        report.configured = False
        return report
    for installation in Installation.objects.filter(active=True).order_by("pk"):
        gid = installation.github_id
        if not reap_due(installation, now, started_at):
            report.not_due.append(gid)
            continue
        if under_standdown(installation, now):
            report.skipped_standdown.append(gid)  # POLL-08: the hold is the installation's
            continue
        Installation.objects.filter(pk=installation.pk).update(last_reaped_at=now)
        report.checked.append(gid)
        client = app.for_installation(gid)
        try:
            for target in _targets(installation, client):
                try:
                    ours_left = _reap_target(client, target, report, gid)
                    _forget_if_done(installation, target, ours_left)
                except RateLimited:
                    raise
                except GitHubError as exc:
                    # This target's list or a delete failed; the other targets are unaffected.
                    report.errors.setdefault(gid, []).append(str(exc))
        except RateLimited as exc:
            # POLL-09: every remaining call would be refused the same way; stop here.
            report.stood_down[gid] = stand_down(installation, exc, now=now, by="reap", clock=clock)
        except GitHubError as exc:  # client.repositories() for a repo installation
            report.errors.setdefault(gid, []).append(str(exc))
    return report
