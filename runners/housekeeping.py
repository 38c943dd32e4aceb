"""The housekeeping tick (30 s): host health, task leases, runner retention and reaping."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from fleet.health import check_host_health
from fleet.provider_setups import purge_expired_setups
from fleet.taskqueue import sweep_tasks
from fleet.throttling import throttle_step
from runners.actions import (
    expire_failed_runners,
    fail_unconfirmed_stops,
    reap_removed_runners,
    reissue_owed_removes,
    settle_abandoned_tasks,
)
from zoomies_site.core.events import prune_events

log = logging.getLogger("zoomies.housekeeping")


@dataclass
class HousekeepingReport:
    lines: list[str] = field(default_factory=list)


def sweep_task_leases(now: datetime) -> list[str]:
    """The task sweep (TASK-02/04), then what its abandoned tasks mean for their runners
    (TASK-05/06): the queue says what it gave up on, the runners side decides."""
    swept = sweep_tasks(now)
    return swept.lines + settle_abandoned_tasks(swept.abandoned, now=now)


def fleet_step(now: datetime) -> list[str]:
    """The fleet's share of a tick: the silence ladder, the task sweep and what its
    abandoned tasks mean for their runners, and the stops and removes still owed to hosts,
    rebuilt from rows (TASK-05, TASK-08)."""
    return (
        check_host_health(now)
        + throttle_step(now)
        + sweep_task_leases(now)
        + fail_unconfirmed_stops(now)
        + reissue_owed_removes(now)
    )


def housekeeping_step(now: datetime) -> HousekeepingReport:
    """One tick: the fleet's share, then the failed retention and the reap."""
    report = HousekeepingReport()
    report.lines.extend(fleet_step(now))
    report.lines.extend(expire_failed_runners(now))
    report.lines.extend(reap_removed_runners(now))
    report.lines.extend(purge_expired_setups(now))  # staged Proxmox tokens past their time
    pruned = prune_events(now)
    if pruned:
        report.lines.append(f"pruned {pruned} event(s) older than the outbox's retention")
    for line in report.lines:
        log.info("housekeeping: %s", line)
    return report
