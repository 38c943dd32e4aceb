"""The agent task queue: rows with leases (DESIGN.md), delivered at least once.

`enqueue_task` is called inside the caller's transaction, so a runner row and its create
task commit together (SCHED-16).
"""

from __future__ import annotations

from datetime import datetime

from fleet.models import AgentTask
from fleet.states import TaskKind, TaskState

# TASK-03: which registry entry holds each kind's lease.
LEASE_SETTING = {
    TaskKind.CREATE_RUNNER: "tasks.create_lease",
    TaskKind.STOP_RUNNER: "tasks.stop_lease",
    TaskKind.REMOVE_RUNNER: "tasks.remove_lease",
}


def lease_for(kind: str):
    from zoomies_site import registry

    return registry.get(LEASE_SETTING[TaskKind(kind)])


def enqueue_task(
    *, host_id: int, runner_id: int | None, kind: str, payload: dict, now: datetime
) -> AgentTask:
    from zoomies_site import registry

    return AgentTask.objects.create(
        host_id=host_id,
        runner_id=runner_id,
        kind=kind,
        payload=payload,
        state=TaskState.PENDING,
        attempt=0,
        max_attempts=registry.get("tasks.max_attempts"),
        lease_seconds=int(lease_for(kind).total_seconds()),
        created_at=now,
    )
