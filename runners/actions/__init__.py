"""Runner, job and installation actions: the only code that writes them.

Each public function is a top-level action (one durable transaction with its audit rows,
except where its docstring says why it joins the caller's); loops, views and the agent API
call them alike. The steps they are built from are in `runners.actions.steps`.
"""

from runners.actions.installations import clear_standdown, stand_down_installation
from runners.actions.jobs import (
    JobUpdate,
    apply_job_update,
    mark_jobs_fleet_failure,
    normalise_status,
    record_job,
    record_new_queued_jobs,
)
from runners.actions.lifecycle import (
    NewRunner,
    create_runner,
    create_runners,
    defer_idle_drain,
    drain_runner,
    expire_failed_runners,
    fail_runner,
    fail_unconfirmed_stops,
    reap_removed_runners,
    reissue_owed_removes,
    remove_runner,
    settle_abandoned_tasks,
)
from runners.actions.reports import apply_agent_reports

__all__ = [
    "JobUpdate",
    "NewRunner",
    "apply_agent_reports",
    "apply_job_update",
    "clear_standdown",
    "create_runner",
    "create_runners",
    "defer_idle_drain",
    "drain_runner",
    "expire_failed_runners",
    "fail_runner",
    "fail_unconfirmed_stops",
    "mark_jobs_fleet_failure",
    "normalise_status",
    "reap_removed_runners",
    "record_job",
    "record_new_queued_jobs",
    "reissue_owed_removes",
    "remove_runner",
    "settle_abandoned_tasks",
    "stand_down_installation",
]
