"""Reads of hosts and tasks. Free capacity is always counted from runner rows."""

from __future__ import annotations

import hashlib

from django.db.models import Count, Q, QuerySet

from fleet.models import AgentTask, Host
from fleet.states import HostHealth, TaskState
from runners.states import LIVE_STATES

AGENT_TOKEN_PREFIX = "zat_"
JOIN_TOKEN_PREFIX = "zjt_"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def host_for_agent_token(token: str | None) -> Host | None:
    """The host whose current agent token this is; None for anything else (a 401)."""
    if not token or not token.startswith(AGENT_TOKEN_PREFIX):
        return None
    return Host.objects.filter(agent_token_hash=hash_secret(token)).first()


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
