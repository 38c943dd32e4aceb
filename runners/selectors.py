"""Reads of runner rows that more than one loop makes (the reconcile pass, housekeeping)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, QuerySet

from fleet.models import AgentTask
from fleet.states import OPEN_TASK_STATES, HostHealth, TaskKind, TaskState
from runners.models import Job, Runner
from runners.states import RunnerState

# The phases only an agent's end report leaves on a runner row (RUN-15): once the agent has
# said how a runner ended it deletes the workload itself (AGENT-18), so no remove is owed.
AGENT_ENDED_PHASES = ("exited", "missing")


def unlinked_exits(now: datetime, grace: timedelta) -> QuerySet:
    """Ephemeral runners that ended cleanly within `grace` with no job linked to them.

    An ephemeral runner exits 0 after its one job, so such a runner ran a job we have not
    heard of yet; the scheduler lets it stand for that job for the grace. A runner whose
    registration GitHub deleted while it was idle (an idle drain) took no job after it, so
    its clean exit stands for none (issue 8 item 7).
    """
    linked = Job.objects.filter(runner_id=OuterRef("pk"))
    named = Job.objects.filter(runner_name=OuterRef("name"))
    return (
        Runner.objects.filter(
            state=RunnerState.REMOVED,
            ephemeral=True,
            exit_code=0,
            finished_at__gt=now - grace,
            deregistered_at__isnull=True,
        )
        .exclude(Exists(linked))
        .exclude(Exists(named))
    )


def removes_owed() -> QuerySet:
    """Runners whose host still owes a removal nobody is asking for: a remove was issued,
    the last one failed or was abandoned, none succeeded and none is open, the agent has not
    reported the runner's end itself, and its host is still there and not lost.

    A lost or deleted host is given up on: nothing would take the task, and a host that
    comes back reaps what it has no record of (AGENT-16).
    """
    removes = AgentTask.objects.filter(runner=OuterRef("pk"), kind=TaskKind.REMOVE_RUNNER)
    return (
        Runner.objects.filter(host__isnull=False)
        .exclude(host__health=HostHealth.LOST)
        .exclude(phase__in=AGENT_ENDED_PHASES)
        .filter(Exists(removes.filter(state__in=[TaskState.FAILED, TaskState.ABANDONED])))
        .exclude(Exists(removes.filter(state__in=[*OPEN_TASK_STATES, TaskState.DONE])))
    )


def unconfirmed_stops(cutoff: datetime) -> QuerySet:
    """Draining runners whose every stop ended (answered or abandoned) before `cutoff`, with
    none still open and no end report since: nothing else would ever end them (TASK-05)."""
    stops = AgentTask.objects.filter(runner=OuterRef("pk"), kind=TaskKind.STOP_RUNNER)
    ended = [TaskState.DONE, TaskState.ABANDONED]
    return (
        Runner.objects.filter(state=RunnerState.DRAINING, host__isnull=False)
        .filter(Exists(stops.filter(state__in=ended)))
        .exclude(Exists(stops.filter(state__in=OPEN_TASK_STATES)))
        .exclude(Exists(stops.filter(state__in=ended, finished_at__gt=cutoff)))
        .order_by("pk")
    )
