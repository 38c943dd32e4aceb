"""The automatic pool reconciler (SCHED-30, SCHED-31): the hosts and the automatic pools read,
the pure plan (`runners.scheduler.auto_pools`), each action written by the pool actions.

It runs as its own django-q2 task (`runners.tasks.auto_pools_task`) under its own lease row,
every `AUTO_POOL_INTERVAL` from the controller's ticker plus a one-slot wake a host joining
hints at; it never takes the reconcile lease, because what it writes is narrow UPDATEs of
columns the scheduling pass only reads. Off unless `scheduler.auto_pools` says on.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce

from fleet.models import Host
from runners.actions import pools as pool_actions
from runners.models import Pool
from runners.scheduler.auto_pools import (
    AutoHost,
    AutoPool,
    AutoPoolAction,
    AutoPoolSnapshot,
    AutoShape,
    plan_auto_pools,
)
from zoomies_site.core import registry
from zoomies_site.core.controller_lock import controller_started_at
from zoomies_site.core.faultlog import FaultLog
from zoomies_site.core.leases import claim_flag, clear_flag

log = logging.getLogger("zoomies.runners")
_wake_faults = FaultLog(log, "an automatic-pool wake")

ACTOR = "auto-pools"
LEASE_NAME = "auto_pools"
LEASE_TTL = timedelta(minutes=2)
WAKE_FLAG = "auto_pools.wake"


def enabled() -> bool:
    return bool(registry.get("scheduler.auto_pools"))


def build_snapshot(
    now: datetime, *, started_at: datetime | None
) -> tuple[AutoPoolSnapshot, dict[int, dict[str, Any]]]:
    """The planner's snapshot, and per automatic pool the operator's columns as read (what
    each write is conditioned on)."""
    started = started_at or controller_started_at() or datetime.min.replace(tzinfo=now.tzinfo)
    hosts = tuple(
        AutoHost(
            name=h.name,
            platform=h.platform,
            backends=tuple(h.backends or ()),
            capacity=h.capacity,
            cpus=h.cpus,
            memory_mb=h.memory_mb,
            heard_at=h.heard_at,
        )  # fmt: skip
        for h in Host.objects.annotate(heard_at=Coalesce(F("last_heartbeat_at"), F("joined_at")))
    )
    pools, read = [], {}
    for pool in Pool.objects.filter(auto_key__isnull=False).order_by("pk"):
        shape = AutoShape(
            labels=tuple(pool.labels), platform=pool.platform, backend=pool.backend,
            size_class=pool.size_class, cpus=pool.cpus, memory_mb=pool.memory_mb,
            active=pool.auto_active,
        )  # fmt: skip
        pools.append(AutoPool(pool.pk, pool.auto_key, shape, pool.size_class_since))
        read[pool.pk] = {f: getattr(pool, f) for f in pool_actions.AUTO_OPERATOR_READ}
    snapshot = AutoPoolSnapshot(
        now=now, controller_started_at=started,
        host_grace=registry.get("scheduler.auto_pools_host_grace"),
        size_class_hold=registry.get("scheduler.size_class_hold"),
        hosts=hosts, pools=tuple(pools),
    )  # fmt: skip
    return snapshot, read


def _owned(action: AutoPoolAction) -> dict[str, Any]:
    shape = action.shape
    return {
        "labels": list(shape.labels), "platform": shape.platform, "backend": shape.backend,
        "cpus": shape.cpus, "memory_mb": shape.memory_mb, "size_class": shape.size_class,
        "size_class_since": action.size_class_since, "auto_active": shape.active,
    }  # fmt: skip


def apply(action: AutoPoolAction, read: dict[int, dict[str, Any]], now: datetime) -> str:
    """One action written; the line says what happened, or why nothing did."""
    if action.pool_id is None:
        made = pool_actions.make_auto_pool(
            auto_key=action.auto_key, name=action.name, owned=_owned(action), actor=ACTOR,
            now=now,
        )  # fmt: skip
        if made is None:
            return f"{action.name}: not made (the name or the key is taken): {action.reason}"
        return f"{action.name}: {action.reason}"
    written = pool_actions.apply_auto_shape(
        action.pool_id, auto_key=action.auto_key, owned=_owned(action),
        operator_read=read.get(action.pool_id, {}), reason=action.reason, actor=ACTOR, now=now,
    )  # fmt: skip
    if not written:
        return f"{action.name}: left for the next pass (changed meanwhile): {action.reason}"
    return f"{action.name}: {action.reason}"


def step(now: datetime, *, started_at: datetime | None = None) -> list[str]:
    """One pass: read, plan, write each action. One bad action never stops the others."""
    snapshot, read = build_snapshot(now, started_at=started_at)
    lines = []
    for action in plan_auto_pools(snapshot).actions:
        try:
            lines.append(apply(action, read, now))
        except Exception as exc:  # one pool's failure must not stop the rest of the pass
            log.exception("automatic pool %s: the write failed", action.name)
            lines.append(f"{action.name}: failed: {exc}")
    for line in lines:
        log.info("automatic pools: %s", line)
    return lines


def wake_auto_pools() -> None:
    """A hint to plan soon (a host joined). One slot: a wake while one is queued and not
    started adds nothing. Never raises: a lost wake costs at most one AUTO_POOL_INTERVAL."""
    if not enabled():
        return
    try:
        with transaction.atomic():
            if not claim_flag(WAKE_FLAG):
                return
            from django_q.tasks import async_task  # noqa: PLC0415  # django-q2's models need the apps loaded

            transaction.on_commit(
                lambda: async_task(
                    "runners.tasks.auto_pools_task",
                    group="auto_pools_task",
                    q_options={"timeout": 300},
                )  # fmt: skip
            )
    except Exception as exc:  # a wake must never fail the join that asked for it
        _wake_faults.failed(exc)
    else:
        _wake_faults.worked()


def clear_wake() -> None:
    clear_flag(WAKE_FLAG)
