"""Host health, agent task states, and the machine state machine."""

from __future__ import annotations

from django.db import models


class HostHealth(models.TextChoices):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # no heartbeat for agent.heartbeat_timeout: nothing new placed
    LOST = "lost"  # no heartbeat for host.lost_after: its live runners failed


class TaskKind(models.TextChoices):
    CREATE_RUNNER = "create_runner"
    STOP_RUNNER = "stop_runner"
    REMOVE_RUNNER = "remove_runner"


class TaskState(models.TextChoices):
    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    DONE = "done"
    FAILED = "failed"
    ABANDONED = "abandoned"  # offered max_task_attempts times without a result
    CANCELLED = "cancelled"


OPEN_TASK_STATES = (TaskState.PENDING, TaskState.IN_FLIGHT)


class MachineState(models.TextChoices):
    PLANNED = "planned"
    CREATING = "creating"
    STARTING = "starting"
    BOOTSTRAPPING = "bootstrapping"
    ENROLLING = "enrolling"
    READY = "ready"
    DRAINING = "draining"
    DELETING = "deleting"
    DELETED = "deleted"
    FAILED = "failed"
    QUARANTINED = "quarantined"


M = MachineState
# MACH-02: exactly the drawn edges. No shortcut edges: a machine's resource may outlive
# any of its states but `deleted`, so nothing jumps there without an inspect.
MACHINE_TRANSITIONS = frozenset(
    {
        (M.PLANNED, M.CREATING),
        (M.CREATING, M.STARTING),
        (M.CREATING, M.BOOTSTRAPPING),
        (M.STARTING, M.BOOTSTRAPPING),
        (M.BOOTSTRAPPING, M.ENROLLING),
        (M.ENROLLING, M.READY),
        (M.READY, M.DRAINING),
        (M.DRAINING, M.READY),
        (M.READY, M.DELETING),
        (M.DRAINING, M.DELETING),
        (M.DELETING, M.DELETED),
        (M.PLANNED, M.FAILED),
        (M.CREATING, M.FAILED),
        (M.BOOTSTRAPPING, M.FAILED),
        (M.ENROLLING, M.FAILED),
        (M.FAILED, M.DELETING),
        (M.CREATING, M.QUARANTINED),
        (M.READY, M.QUARANTINED),
        (M.DELETING, M.QUARANTINED),
        (M.QUARANTINED, M.DELETED),
    }
)


def can_transition_machine(current: str, new: str) -> bool:
    return current == new or (current, new) in MACHINE_TRANSITIONS


def machine_sources_of(new: str) -> list[str]:
    return sorted(src for (src, dst) in MACHINE_TRANSITIONS if dst == new)
