"""Reads of hosts and tasks. Free capacity is always counted from runner rows."""

from __future__ import annotations

import hashlib
from datetime import datetime

from django.db.models import Count, Q, QuerySet

from fleet.models import AgentTask, Host
from fleet.runner_side import runner_side
from fleet.states import HostHealth, TaskState

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
        live_runners=Count("runners", filter=Q(runners__state__in=list(runner_side().LIVE_STATES)))
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


def host_cordoned(host_id: int) -> bool | None:
    """Whether the host is cordoned as of now; None when its row is gone."""
    found = Host.objects.filter(pk=host_id).values_list("cordoned", flat=True).first()
    return None if found is None else bool(found)


def offered_backends() -> list[str]:
    """The runner backends the healthy hosts offer, most offered first (ties by name)."""
    seen: dict[str, int] = {}
    for backends in hosts_for_scheduling().values_list("backends", flat=True):
        for name in backends or []:
            if isinstance(name, str):
                seen[name] = seen.get(name, 0) + 1
    return sorted(seen, key=lambda name: (-seen[name], name))
