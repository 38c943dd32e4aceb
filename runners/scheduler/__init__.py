"""The pure scheduler: `decide(snapshot) -> Plan` (spec: internal/scheduler).

No Django, no clock, no database, no network: the reconcile pass builds the snapshot and
applies the plan, and `tests/runners/scheduler/test_purity.py` fails if an import or a
clock read creeps in here (SCHED-01).
"""

from runners.scheduler.decide import backoff_wait, decide
from runners.scheduler.matching import (
    assign_jobs,
    host_offers_pool,
    job_matches_pool,
    platforms_fit,
    pool_for_job,
    pool_label_set,
)
from runners.scheduler.model import (
    CreateRunner,
    DrainRunner,
    FailRunner,
    HostView,
    JobView,
    Plan,
    PoolBlocked,
    PoolView,
    PoolWait,
    RunnerView,
    ScaleFromZero,
    SchedulerSettings,
    Snapshot,
)
from runners.scheduler.resources import Charge, pool_charge, runner_charge

__all__ = [
    "Charge",
    "CreateRunner",
    "DrainRunner",
    "FailRunner",
    "HostView",
    "JobView",
    "Plan",
    "PoolBlocked",
    "PoolView",
    "PoolWait",
    "RunnerView",
    "ScaleFromZero",
    "SchedulerSettings",
    "Snapshot",
    "assign_jobs",
    "backoff_wait",
    "decide",
    "host_offers_pool",
    "job_matches_pool",
    "platforms_fit",
    "pool_charge",
    "pool_for_job",
    "pool_label_set",
    "runner_charge",
]
