"""Reads of hosts and tasks. Free capacity is always counted from runner rows."""

from __future__ import annotations

import hashlib
from datetime import datetime

from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from fleet import protocol
from fleet.models import AgentTask, Host
from fleet.states import OPEN_TASK_STATES, HostHealth, TaskKind, TaskState
from runners.models import Runner
from runners.states import LIVE_STATES

AGENT_TOKEN_PREFIX = "zat_"  # noqa: S105  # a name or prefix, not a secret
JOIN_TOKEN_PREFIX = "zjt_"  # noqa: S105  # a name or prefix, not a secret


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def host_for_agent_token(token: str | None, *, now: datetime) -> Host | None:
    """The host whose agent token this is; None for anything else (a 401).

    ESC-06: a credential minted from a claim code is valid until its expiry, the one a
    renewal replaced until its own; an ordinary agent token (no expiry) until the host joins
    again.
    """
    if not token or not token.startswith(AGENT_TOKEN_PREFIX):
        return None
    hashed = hash_secret(token)
    current = Q(agent_token_hash=hashed) & (
        Q(agent_token_expires_at__isnull=True) | Q(agent_token_expires_at__gt=now)
    )
    previous = Q(previous_agent_token_hash=hashed, previous_agent_token_expires_at__gt=now)
    return Host.objects.filter(current | previous).first()


def hosts_with_live_runner_counts() -> QuerySet[Host]:
    """Every host with `live_runners`: runners on it in a state other than removed or failed."""
    return Host.objects.annotate(
        live_runners=Count("runners", filter=Q(runners__state__in=list(LIVE_STATES)))
    ).order_by("name")


def hosts_for_scheduling() -> QuerySet[Host]:
    """Hosts the scheduler may place new runners on: healthy and not cordoned (HOST-03)."""
    return hosts_with_live_runner_counts().filter(health=HostHealth.HEALTHY, cordoned=False)


def task_for_host(host: Host, task_id: int) -> AgentTask | None:
    """A task only if it is this host's (TASK-14): another host's task does not exist here."""
    return AgentTask.objects.filter(pk=task_id, host=host).select_related("runner").first()


def open_tasks_for_host(host: Host) -> QuerySet[AgentTask]:
    return AgentTask.objects.filter(
        host=host, state__in=[TaskState.PENDING, TaskState.IN_FLIGHT]
    ).order_by("created_at", "pk")


def expected_runners(host: Host, now: datetime) -> list[protocol.ExpectedRunner]:
    """The inventory's answer: every live runner recorded on `host` that no open create will
    start, so its workload should be there. Each one's age counts from the latest moment its
    workload can have been made: its create's answer, else its last delivery, else the row's
    birth."""
    open_create = AgentTask.objects.filter(
        runner_id=OuterRef("pk"), kind=TaskKind.CREATE_RUNNER, state__in=OPEN_TASK_STATES
    )
    runners = list(
        Runner.objects.filter(host=host, state__in=list(LIVE_STATES))
        .exclude(Exists(open_create))
        .values("pk", "state", "created_at", "pool__backend")
        .order_by("pk")
    )
    made = {r["pk"]: r["created_at"] for r in runners}
    creates = AgentTask.objects.filter(
        runner_id__in=list(made), kind=TaskKind.CREATE_RUNNER
    ).values_list("runner_id", "state", "taken_at", "finished_at")
    for runner_id, state, taken_at, finished_at in creates:
        # Only a done create's end is an answer; any other ended when the controller said.
        answered = finished_at if state == TaskState.DONE else None
        moments = [m for m in (taken_at, answered) if m is not None]
        made[runner_id] = max([made[runner_id], *moments])
    return [
        protocol.ExpectedRunner(
            runner_id=r["pk"],
            backend=r["pool__backend"],
            state=r["state"],
            age=max((now - made[r["pk"]]).total_seconds(), 0.0),
        )
        for r in runners
    ]
