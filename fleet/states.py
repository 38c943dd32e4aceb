"""Host health, agent task states and the machine state machine, each with its allow-list.

`fleet.transitions` holds the one compare-and-set function per machine that enforces them.
"""

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
    STREAM_LOGS = "stream_logs"  # LOG-01: relay a runner's output to its viewers
    CANCEL_LOGS = "cancel_logs"  # LOG-04: the last viewer left
    IMAGE_PREWARM = "image_prewarm"  # AGENT-14: prepare a pool's images; no runner
    CHECK_HOST = "check_host"  # TASK-09..11: an operator's look at the host's readiness


class TaskState(models.TextChoices):
    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    DONE = "done"
    FAILED = "failed"
    ABANDONED = "abandoned"  # offered max_task_attempts times without a result
    CANCELLED = "cancelled"


OPEN_TASK_STATES = (TaskState.PENDING, TaskState.IN_FLIGHT)
FINAL_TASK_STATES = (TaskState.DONE, TaskState.FAILED, TaskState.ABANDONED, TaskState.CANCELLED)

_T = TaskState
# TASK-02..06: taken, answered, offered again after its lease, abandoned, or cancelled while
# open. A final state is final: a late answer to a cancelled task changes nothing.
TASK_TRANSITIONS = frozenset(
    {
        (_T.PENDING, _T.IN_FLIGHT),
        (_T.PENDING, _T.CANCELLED),
        (_T.IN_FLIGHT, _T.PENDING),
        (_T.IN_FLIGHT, _T.DONE),
        (_T.IN_FLIGHT, _T.FAILED),
        (_T.IN_FLIGHT, _T.ABANDONED),
        (_T.IN_FLIGHT, _T.CANCELLED),
    }
)


def can_transition_task(current: str, new: str) -> bool:
    return (current, new) in TASK_TRANSITIONS


def task_sources_of(new: str) -> list[str]:
    return sorted(src for (src, dst) in TASK_TRANSITIONS if dst == new)


_H = HostHealth
# HOST-03/04: silence makes a host unhealthy, then lost (straight to lost when no tick saw it
# unhealthy in between); a heartbeat or a join makes it healthy again.
HOST_HEALTH_TRANSITIONS = frozenset(
    {
        (_H.HEALTHY, _H.UNHEALTHY),
        (_H.HEALTHY, _H.LOST),
        (_H.UNHEALTHY, _H.LOST),
        (_H.UNHEALTHY, _H.HEALTHY),
        (_H.LOST, _H.HEALTHY),
    }
)


def can_transition_health(current: str, new: str) -> bool:
    return (current, new) in HOST_HEALTH_TRANSITIONS


def health_sources_of(new: str) -> list[str]:
    return sorted(src for (src, dst) in HOST_HEALTH_TRANSITIONS if dst == new)


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
