"""The one place each fleet state machine is written: machines (MACH-03), agent tasks and
host health, with the runners' discipline (`runners.transitions`).

Every change is a compare-and-set UPDATE guarded by its allow-list in `fleet.states`: a count
of 0 means another writer won or the edge is illegal, and nothing is forced. Each move that
happens writes its audit row in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F

from accounts import audit
from fleet.models import AgentTask, Host, Machine
from fleet.states import (
    FINAL_TASK_STATES,
    HostHealth,
    MachineState,
    TaskState,
    can_transition_health,
    can_transition_machine,
    can_transition_task,
    health_sources_of,
    machine_sources_of,
    task_sources_of,
)
from zoomies_site.core.events import emit

log = logging.getLogger("zoomies.fleet")


def transition_machine(
    machine_id: int,
    new_state: str,
    *,
    now: datetime,
    actor: str,
    reason: str = "",
    message: str | None = None,
    fields: dict[str, Any] | None = None,
    expected_from: frozenset[str] | None = None,
) -> bool:
    """Compare-and-set a machine's state; True only when this call moved it. `fields` are
    other columns written by the same UPDATE (the identity before a create, MACH-04).
    `expected_from` narrows the move to the states its caller judged (an operator's release
    is of a quarantined machine, never of one deleting)."""
    new_state = MachineState(new_state)
    with transaction.atomic():
        current = Machine.objects.filter(pk=machine_id).values_list("state", flat=True).first()
        if current is None or current == new_state:
            return False
        if expected_from is not None and current not in expected_from:
            return False
        if not can_transition_machine(current, new_state):
            log.warning(
                "machine %s: dropped illegal transition %s -> %s (%s)",
                machine_id,
                current,
                new_state,
                reason or actor,
            )
            return False
        changes: dict[str, Any] = {**(fields or {}), "state": new_state, "state_changed_at": now}
        if message is not None:
            changes["message"] = message
        moved = Machine.objects.filter(
            pk=machine_id, state=current, state__in=machine_sources_of(new_state)
        ).update(**changes)
        if moved:
            audit.record(
                actor=actor,
                action=f"machine.{new_state}",
                target=Machine(pk=machine_id),
                detail={"from": current, "to": new_state, "reason": reason},
                at=now,
            )
        return bool(moved)


# -- agent tasks ----------------------------------------------------------------------------


def without_env(payload: Any) -> Any:
    """A task payload with its `env` (a runner credential, AUTH-07) dropped; the names stay,
    as `env_keys`. Once a task is final its credential is spent or never will be."""
    if not isinstance(payload, dict) or "env" not in payload:
        return payload
    payload = dict(payload)
    env = payload.pop("env")
    if isinstance(env, dict):
        payload["env_keys"] = sorted(env)
    return payload


def transition_task(
    task_id: int,
    new_state: str,
    *,
    now: datetime,
    actor: str,
    reason: str = "",
    attempt: int | None = None,
    guard: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
    record: bool = True,
    action: str | None = None,
) -> bool:
    """Move an agent task to `new_state` if `fleet.states.TASK_TRANSITIONS` allows it.

    `attempt` and `guard` narrow the move to the delivery (and lease) the caller judged, so
    an answer to an old delivery or a sweep racing a result changes nothing. Entering a final
    state stamps `finished_at`, ends the lease and drops the stored credential (`env`) in the
    same UPDATE. `record=False` only for taking a task: a delivery is recorded on the row
    (attempt, taken_at), and an audit row per long-poll would drown the trail. `action`
    names the audit row when the state alone would not say it (`task.requeued`).
    """
    new_state = TaskState(new_state)
    with transaction.atomic():
        row = (
            AgentTask.objects.filter(pk=task_id)
            .values("state", "attempt", "kind", "runner_id", "payload")
            .first()
        )
        if row is None:
            return False
        current = row["state"]
        if not can_transition_task(current, new_state):
            if current != new_state and current not in FINAL_TASK_STATES:
                log.warning(
                    "task %s: dropped illegal transition %s -> %s (%s)",
                    task_id,
                    current,
                    new_state,
                    reason or actor,
                )
            return False
        if attempt is not None and row["attempt"] != attempt:
            return False
        update: dict[str, Any] = {"state": new_state, **(fields or {})}
        if new_state in FINAL_TASK_STATES:
            update.setdefault("finished_at", now)
            update["lease_deadline"] = None
            if isinstance(row["payload"], dict) and "env" in row["payload"]:
                # The payload changes only here, and only on a move guarded by the state.
                update["payload"] = without_env(row["payload"])
        query = AgentTask.objects.filter(
            pk=task_id, state=current, state__in=task_sources_of(new_state), **(guard or {})
        )
        if attempt is not None:
            query = query.filter(attempt=attempt)
        if not query.update(**update):
            return False
        if record:
            audit.record(
                actor=actor,
                action=action or f"task.{new_state}",
                target=AgentTask(pk=task_id),
                detail={
                    "kind": row["kind"],
                    "runner": row["runner_id"],
                    "attempt": row["attempt"],
                    "from": current,
                    "reason": reason,
                },
                at=now,
            )
    return True


def take_pending_tasks(tasks: Sequence[AgentTask], *, now: datetime) -> list[int]:
    """Pending -> in flight for each of `tasks` (as the poll's take read them), stamped as
    a delivery: attempt + 1, `taken_at`, and a lease deadline from the task's own lease.
    What `transition_task(..., record=False)` does for a take, without a savepoint and a
    fresh read of each row (four statements a task, a tenth of a burst's write lock on
    SQLite, issue 28): each is still a compare-and-set on the state and attempt read, so
    two polls racing for one task never both take it. The ids this call moved, in order."""
    moved = []
    for task in tasks:
        if AgentTask.objects.filter(
            pk=task.pk, state=TaskState.PENDING, attempt=task.attempt
        ).update(
            state=TaskState.IN_FLIGHT,
            attempt=F("attempt") + 1,
            taken_at=now,
            lease_deadline=now + timedelta(seconds=task.lease_seconds),
        ):
            moved.append(task.pk)
    return moved


# -- host health ----------------------------------------------------------------------------


def transition_host_health(
    host_id: int,
    new_health: str,
    *,
    now: datetime,
    actor: str,
    reason: str = "",
    guard: dict[str, Any] | None = None,
) -> bool:
    """Compare-and-set a host's health (HOST-03/04); True only when this call moved it.

    `guard` narrows the move to the row the caller judged: the silence ladder passes the
    heartbeat and join marks it measured the silence from, so a heartbeat recorded since
    makes the count 0 instead of losing a live host.
    """
    new_health = HostHealth(new_health)
    with transaction.atomic():
        current = Host.objects.filter(pk=host_id).values_list("health", flat=True).first()
        if current is None or current == new_health:
            return False
        if not can_transition_health(current, new_health):
            log.warning(
                "host %s: dropped illegal health move %s -> %s (%s)",
                host_id,
                current,
                new_health,
                reason or actor,
            )
            return False
        moved = Host.objects.filter(
            pk=host_id,
            health=current,
            health__in=health_sources_of(new_health),
            **(guard or {}),
        ).update(health=new_health, health_changed_at=now)
        if moved:
            audit.record(
                actor=actor,
                action=f"host.{new_health}",
                target=Host(pk=host_id),
                detail={"from": current, "to": new_health, "reason": reason},
                at=now,
            )
            emit(f"host.{new_health}", Host(pk=host_id), at=now)
        return bool(moved)
