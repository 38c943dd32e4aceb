"""The housekeeping tick (30 s): host health, task leases, runner retention and reaping."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Exists, OuterRef

from fleet.models import AgentTask
from fleet.states import TaskState
from runners.models import Runner
from runners.states import RunnerState
from runners.transitions import transition_runner
from zoomies_site import registry

log = logging.getLogger("zoomies.housekeeping")
ACTOR = "system:housekeeping"


@dataclass
class HousekeepingReport:
    lines: list[str] = field(default_factory=list)


def expire_failed_runners(now: datetime) -> list[str]:
    """RUN-10: a failed runner stays listed for the failed retention, then is removed."""
    cutoff = now - registry.get("scheduler.failed_retention")
    lines = []
    for runner in Runner.objects.filter(state=RunnerState.FAILED, finished_at__lte=cutoff):
        if transition_runner(
            runner.pk, RunnerState.REMOVED, now=now, actor=ACTOR, reason="failed retention over"
        ).changed:
            lines.append(f"{runner.name}: failed retention over, removed")
    return lines


def reap_removed_runners(now: datetime) -> list[str]:
    """RUN-19: a removed runner's row is reaped once nothing still owes it work.

    Jobs keep the runner's name, so a finished job still says which runner ran it.
    """
    from fleet.taskqueue import removes_owed
    from runners.reconcile import unlinked_exits

    # An unexplained clean exit is kept while the scheduler still counts it (it stands for
    # a job whose news has not arrived yet).
    waiting = set(
        unlinked_exits(now, registry.get("scheduler.unlinked_exit_grace")).values_list(
            "pk", flat=True
        )
    )
    # TASK-08: a remove the host still owes (its last failed or was abandoned, none
    # succeeded) keeps the row, or the intent would be lost with it (its tasks go too).
    owed = set(removes_owed().filter(state=RunnerState.REMOVED).values_list("pk", flat=True))
    # A remove still on its way to the host keeps the row too (TASK-08).
    in_flight = AgentTask.objects.filter(
        runner_id=OuterRef("pk"), state__in=(TaskState.PENDING, TaskState.IN_FLIGHT)
    )
    reapable = (
        Runner.objects.filter(state=RunnerState.REMOVED)
        .exclude(pk__in=waiting | owed)
        .exclude(Exists(in_flight))
    )
    names = list(reapable.values_list("name", flat=True))
    # One DELETE, guarded by the same filter, so a row that moved meanwhile is kept.
    reapable.filter(name__in=names).delete()
    return [f"{name}: reaped" for name in names]


def housekeeping_step(now: datetime) -> HousekeepingReport:
    """One tick: the fleet's share (host health, the task sweep, and the stops and removes
    still owed, rebuilt from rows), then the failed retention and the reap."""
    from fleet.health import housekeeping_step as fleet_step

    report = HousekeepingReport()
    report.lines.extend(fleet_step(now) or [])
    report.lines.extend(expire_failed_runners(now))
    report.lines.extend(reap_removed_runners(now))
    for line in report.lines:
        log.info("housekeeping: %s", line)
    return report
