"""The controller's ticker: enqueues the periodic django-q2 tasks on time.

django-q2's own schedules look only about every 30 s, so they are the slow safety net, not
the clock. `step(now)` does one round and returns what it enqueued; the loop
that calls it owns the clock, so tests move time instead of sleeping.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from runners.scheduler.auto_pools import AUTO_POOL_INTERVAL
from zoomies_site.core import registry
from zoomies_site.core.faultlog import FaultLog

log = logging.getLogger("zoomies.controller")


@dataclass
class Periodic:
    """One periodic job: a name, how often (read each round, so settings apply live), what."""

    name: str
    every: Callable[[], timedelta]
    run: Callable[[datetime], None]
    last: datetime | None = None
    faults: FaultLog = field(init=False)

    def __post_init__(self) -> None:
        self.faults = FaultLog(log, f"periodic {self.name}")


@dataclass
class Ticker:
    jobs: list[Periodic] = field(default_factory=list)

    def step(self, now: datetime) -> list[str]:
        fired = []
        for job in self.jobs:
            if job.last is None or now - job.last >= job.every():
                job.last = now
                try:
                    job.run(now)
                except Exception as exc:  # one failing job must not stop the others' clock
                    job.faults.failed(exc)
                else:
                    job.faults.worked()
                fired.append(job.name)
        return fired


def enqueue(func: str, *args) -> str:
    from django_q.tasks import async_task  # noqa: PLC0415  # django-q2's models need the apps loaded

    return async_task(func, *args, group=func.rsplit(".", 1)[-1], q_options={"timeout": 300})


def default_ticker(started_at: datetime) -> Ticker:
    def every(key: str) -> Callable[[], timedelta]:
        return lambda: registry.get(key)

    return Ticker(
        jobs=[
            Periodic(
                "reconcile",
                every("scheduler.reconcile_interval"),
                lambda now: enqueue("runners.tasks.reconcile_task"),
            ),
            Periodic(
                "housekeeping",
                every("housekeeping.tick"),
                lambda now: enqueue("runners.tasks.housekeeping_task"),
            ),
            Periodic(
                "poll",
                every("github.poll_interval"),
                lambda now: enqueue("runners.tasks.poll_task", started_at.isoformat()),
            ),
            # Capacity events to an external autoscaler, and the spawn backstop (CAP-18).
            Periodic(
                "capacity",
                every("capacity_demand.interval"),
                lambda now: enqueue("capacity.tasks.capacity_step_task"),
            ),
            # The automatic pools, in their own pass (SCHED-30); off unless enabled.
            Periodic(
                "auto_pools",
                lambda: AUTO_POOL_INTERVAL,
                lambda now: (
                    registry.get("scheduler.auto_pools")
                    and enqueue("runners.tasks.auto_pools_task", started_at.isoformat())
                ),
            ),
            # Rented machines, apart from the reconcile pass (MACH-19).
            Periodic(
                "machines",
                every("machines.interval"),
                lambda now: machines_wanted() and enqueue("capacity.tasks.machine_loop_task"),
            ),
            # Scheduled backups: the task decides from the newest copy's age whether one is
            # due, so a restart neither skips nor repeats one (BAK-06).
            Periodic(
                "backup",
                lambda: timedelta(minutes=1),
                lambda now: (
                    registry.get("backup.interval")
                    and enqueue("zoomies_site.backup.tasks.backup_task")
                ),
            ),
            # Failed webhook deliveries asked for again from GitHub's side: a first pass at
            # start (what failed while the controller was down), then every interval.
            Periodic(
                "redelivery",
                lambda: registry.get("github.redelivery_interval") or timedelta(minutes=1),
                lambda now: (
                    registry.get("github.redelivery_interval")
                    and enqueue("runners.tasks.redelivery_task")
                ),
            ),
            # The reap decides per installation whether it is due (POLL-10).
            Periodic(
                "reap",
                lambda: timedelta(seconds=30),
                lambda now: enqueue("runners.tasks.reap_task", started_at.isoformat()),
            ),
        ]
    )


def machines_wanted() -> bool:
    """A provider is configured or a machine is left: else no machine round is enqueued."""
    from fleet.models import Machine, MachineProvider  # noqa: PLC0415  # models need the apps loaded

    return (
        MachineProvider.objects.exists()
        or Machine.objects.exclude(state__in=["deleted", "quarantined"]).exists()
    )
