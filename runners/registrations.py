"""What the reconcile pass asks GitHub about its own runners' registrations, between reaps.

* Which new runners GitHub shows online (issue 29 item 1). A runner is idle only once
  GitHub says so: a runner program that cannot reach GitHub runs and retries for ever, so
  its process running proves nothing. Until then it is still starting, and the provision
  timeout fails it (`runners.reconcile`). Each installation with runners waiting for that
  word has its registrations listed at most every `ONLINE_CHECK_EVERY`.
* The registrations of runners that failed are deleted at once (issue 29 item 4), not left
  for the reap `github.reap_interval` later: an offline registration nobody will start
  only stands in GitHub's list, and a failed one that did connect could still be handed a
  job it will never run.

Both run outside any transaction (STORE-02), honour an installation's rate-limit
stand-down, and stand it down on a refusal, as the rest of the pass does.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import Q

from runners.actions.installations import note_online_check, online_checked_recently
from runners.actions.lifecycle import (
    note_registration_gone,
    note_registration_id,
    note_runner_online,
)
from runners.github.errors import GitHubError, RateLimited
from runners.models import Installation, Pool, Runner
from runners.poller import stand_down, under_standdown
from runners.states import LIVE_STATES, RunnerState
from zoomies_site.core import registry

log = logging.getLogger("zoomies.reconcile")

ACTOR = "system:reconcile"
# Waiting for GitHub's word: registering (its workload started) or idle by its process's
# report alone. A runner still provisioning has not been started by its host yet.
AWAITING_ONLINE = (RunnerState.REGISTERING, RunnerState.IDLE)
# A delete that failed (not "busy") is asked again this long after.
DEREGISTER_RETRY = timedelta(minutes=1)


def registration_target(pool: Pool, installation: Installation) -> dict[str, str]:
    """Where a pool's runners register at GitHub: its repository, or the organisation."""
    if pool.repository:
        return {"repo": pool.repository}
    if installation.kind == Installation.Kind.REPO:
        if not installation.repositories:
            raise RuntimeError(f"installation {installation.account} lists no repository")
        return {"repo": installation.repositories[0]}
    return {"org": installation.account}


def _target(runner: Runner, installation: Installation) -> dict[str, str] | None:
    try:
        return registration_target(runner.pool, installation)
    except RuntimeError:
        return None


def check_online(now: datetime, app) -> list[str]:
    """Stamp the runners GitHub now shows online (idle if still registering); one line each."""
    waiting = Runner.objects.filter(installation__active=True).filter(
        Q(online_at__isnull=True, state__in=AWAITING_ONLINE)
        & (Q(github_runner_id__isnull=False) | Q(ephemeral=False))
        # A config.sh runner's registration id is learnt here, by its name (SCHED-15),
        # whenever it is not known yet: it may take a job before any check sees it.
        | Q(ephemeral=False, github_runner_id__isnull=True, state__in=LIVE_STATES)
    )
    # The installations first, and the runners only of those whose check is due: a pass
    # runs every few milliseconds in a burst, and the check is due every 15 s (issue 28).
    lines: list[str] = []
    for installation in Installation.objects.filter(pk__in=waiting.values("installation_id")):
        if under_standdown(installation, now) or online_checked_recently(installation, now=now):
            continue
        if not note_online_check(installation, now=now):
            continue
        runners = waiting.filter(installation=installation).select_related("pool", "installation")
        by_target: dict[tuple, list[Runner]] = defaultdict(list)
        for runner in runners.order_by("pk"):
            target = _target(runner, installation)
            if target is not None:
                by_target[tuple(sorted(target.items()))].append(runner)
        client = app.for_installation(installation.github_id)
        try:
            for target_items, group in by_target.items():
                registrations = [
                    r for r in client.list_runners(**dict(target_items)) if isinstance(r, dict)
                ]
                listed = {reg.get("id"): reg for reg in registrations}
                named = {reg.get("name"): reg for reg in registrations}
                for runner in group:
                    reg = (
                        listed.get(runner.github_runner_id)
                        if runner.github_runner_id is not None
                        else named.get(runner.name)
                    )
                    if reg is None:
                        continue
                    if runner.github_runner_id is None and isinstance(reg.get("id"), int):
                        note_registration_id(runner, reg["id"])
                    online = reg.get("status") == "online" or reg.get("busy")
                    if (
                        online
                        and runner.online_at is None
                        and note_runner_online(runner, now=now, actor=ACTOR)
                    ):
                        lines.append(f"{runner.name}: GitHub shows it online")
        except RateLimited as exc:
            until = stand_down(installation, exc, now=now, by="reconcile")
            lines.append(f"{installation.account}: rate limited by GitHub until {until:%H:%M:%S}")
        except GitHubError as exc:
            # Asked again at the next check; until then the runners stay starting.
            lines.append(f"{installation.account}: could not list its runners: {exc}")
    return lines


def deregister_failed(now: datetime, app) -> list[str]:
    """Delete the registrations of runners that failed within the reap interval (older ones
    are the reap's); one line each. A runner GitHub calls busy keeps its registration (its
    job may still be running) and is not asked again before the next reap interval."""
    interval = registry.get("github.reap_interval")
    failed = (
        Runner.objects.filter(
            state__in=[RunnerState.FAILED, RunnerState.REMOVED],
            github_runner_id__isnull=False,
            deregistered_at__isnull=True,
            installation__active=True,
        )
        # A failed runner, or a non-ephemeral one taken away (SCHED-15: its registration
        # outlives its process, where an ephemeral one's goes with its one job).
        .filter(
            Q(failed_at__gte=now - interval)
            | Q(ephemeral=False, state=RunnerState.REMOVED, finished_at__gte=now - interval)
        )
        .filter(Q(drain_deferred_until__isnull=True) | Q(drain_deferred_until__lte=now))
        .select_related("pool", "installation")
        .order_by("pk")
    )
    lines: list[str] = []
    held: set[int] = set()
    for runner in failed:
        installation = runner.installation
        target = _target(runner, installation)
        if target is None or installation.pk in held or under_standdown(installation, now):
            continue
        try:
            answer = app.for_installation(installation.github_id).delete_runner(
                runner_id=runner.github_runner_id, **target
            )
        except RateLimited as exc:
            stand_down(installation, exc, now=now, by="reconcile")
            held.add(installation.pk)
            continue
        except GitHubError as exc:
            note_registration_gone(runner, now=now, actor=ACTOR, answer=str(exc),
                                   retry_at=now + DEREGISTER_RETRY)  # fmt: skip
            lines.append(f"{runner.name}: its registration was not deleted: {exc}")
            continue
        retry = now + interval if answer == "busy" else None
        note_registration_gone(runner, now=now, actor=ACTOR, answer=answer, retry_at=retry)
        ended = "failed" if runner.failed_at else "removed"
        if answer == "deleted":
            lines.append(f"{runner.name}: {ended}, so its registration was deleted at GitHub")
        elif answer == "busy":
            lines.append(f"{runner.name}: {ended}, but GitHub says it is running a job")
    return lines
