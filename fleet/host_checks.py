"""Host checks (TASK-09..11): an operator asks a host's agent to look at itself (engines
reachable, disk, clock) and the answer is kept on the host's row for its page.

The task itself rides the queue like any other (fleet.taskqueue: its own 90 s lease,
offered once, dropped when no agent takes it within 20 s); this module writes the host's
`last_check`, the one record of where the latest check stands; fleet.actions.request_host_check asks
for one, within a 15 s cooldown after the last one ended.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fleet.models import AgentTask, Host

# TASK-11 (HostCheckCooldown): after a check ended, expired or was dropped.
HOST_CHECK_COOLDOWN = timedelta(seconds=15)


class HostCheckRefused(Exception):
    """A check asked for too soon: one is under way, or the last ended under 15 s ago."""


def note_host_check(host_id: int, task: AgentTask, *, state: str, now: datetime,
                    report: dict[str, Any] | None = None, error: str = "") -> None:  # fmt: skip
    """Write where the host's latest check stands; an older check's news is ignored."""
    current = Host.objects.filter(pk=host_id).values_list("last_check", flat=True).first()
    if isinstance(current, dict) and (current.get("task") or 0) > task.pk:
        return
    Host.objects.filter(pk=host_id).update(
        last_check={
            "task": task.pk,
            "state": state,
            "requested_at": task.created_at.isoformat(),
            "at": now.isoformat(),
            "report": report or {},
            "error": error,
        }
    )
