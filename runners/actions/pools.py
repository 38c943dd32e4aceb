"""Pool and installation actions: create, change, pause, resume, delete (issue 10 item 6).

Validation is the model's (`Pool.clean`, so the admin, the API and zoomies.yaml agree); each
action is one durable transaction with its audit row and its outbox event.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from accounts import audit
from fleet.models import AgentTask, Host
from fleet.states import OPEN_TASK_STATES, HostHealth, TaskKind
from fleet.taskqueue import enqueue_task
from runners import naming
from runners.actions import steps
from runners.models import Pool, Runner
from runners.pool_views import PoolUnreadable, pool_view
from runners.scheduler import HostView
from runners.scheduler.matching import host_offers_pool
from runners.states import LIVE_STATES, RunnerState
from runners.wake import wake_reconcile
from zoomies_site.core.events import emit


class PoolInUse(Exception):
    """The pool still has runners; deleting it would orphan them."""


class CannotPrewarm(Exception):
    """The pool has nothing a host could prepare ahead of time (its reason says why)."""


# RUN-13: what a paused or deleted pool stops from starting.
STARTING_STATES = (RunnerState.PROVISIONING, RunnerState.REGISTERING)


def _wake() -> None:
    # A new, resumed or changed pool may owe runners now: the pass decides, after commit.
    transaction.on_commit(wake_reconcile)


def create_pool(values: dict[str, Any], *, actor: str, now: datetime) -> Pool:
    pool = Pool(**values)
    pool.full_clean()
    with transaction.atomic(durable=True):
        pool.save()
        audit.record(actor=actor, action="pool.create", target=pool, at=now)
        emit("pool.created", pool, at=now)
        _wake()
    return pool


def update_pool(pool: Pool, changes: dict[str, Any], *, actor: str, now: datetime) -> Pool:
    if pool.auto_key:
        # An automatic pool's shape is the controller's (SCHED-31): a form sent back with
        # the shape it showed must not put back one a pass has changed since.
        changes = {k: v for k, v in changes.items() if k not in AUTO_OWNED}
    before = {field: getattr(pool, field) for field in changes}
    for field, value in changes.items():
        setattr(pool, field, value)
    pool.full_clean()
    with transaction.atomic(durable=True):
        pool.save(update_fields=list(changes) or None)
        audit.record(
            actor=actor,
            action="pool.update",
            target=pool,
            detail={"before": _plain(before), "after": _plain(changes)},
            at=now,
        )
        emit("pool.updated", pool, at=now)
        _wake()
    return pool


def set_pool_paused(pool: Pool, *, paused: bool, actor: str, now: datetime) -> bool:
    """Pause (no new runners; the live ones finish their jobs) or resume. True if it moved.
    Inside the caller's transaction when there is one (an installation's removal)."""
    with transaction.atomic():
        moved = Pool.objects.filter(pk=pool.pk, paused=not paused).update(paused=paused)
        if moved:
            audit.record(
                actor=actor, action="pool.pause" if paused else "pool.resume", target=pool, at=now
            )
            emit("pool.paused" if paused else "pool.resumed", pool, at=now)
            if paused:
                drain_starting_runners(pool, now=now, actor=actor, why="its pool was paused")
            _wake()
    pool.paused = paused
    return bool(moved)


def drain_starting_runners(pool: Pool, *, now: datetime, actor: str, why: str) -> list[str]:
    """RUN-13: a paused or deleted pool's runners still provisioning or registering go to
    draining (they would only start to take a job the operator just stopped); the live
    ones finish theirs. Returns the names moved."""
    moved = []
    starting = Runner.objects.filter(pool=pool, state__in=STARTING_STATES).order_by("pk")
    for runner in starting:
        result = steps.drain(
            runner, now=now, actor=actor, reason=why, expected_from=STARTING_STATES
        )
        if result.changed:
            moved.append(runner.name)
    return moved


def delete_pool(pool: Pool, *, actor: str, now: datetime) -> None:
    """Delete a pool with no live runners; its finished runners go with it. Asked while
    runners are live, its starting ones are drained first (RUN-13) and the delete refused
    until every live one has ended."""
    with transaction.atomic(durable=True):
        drained = drain_starting_runners(pool, now=now, actor=actor, why="its pool is deleted")
    with transaction.atomic(durable=True):
        live = Runner.objects.filter(pool=pool, state__in=list(LIVE_STATES)).count()
        if live:
            started = f" ({len(drained)} still starting were drained now)" if drained else ""
            raise PoolInUse(
                f"pool {pool.name} has {live} live runner(s){started}: pause it, drain them, "
                "and delete it once they have ended"
            )
        pk, name = pool.pk, pool.name
        Runner.objects.filter(pool=pool).delete()
        pool.delete()
        audit.record(
            actor=actor,
            action="pool.delete",
            target=Pool(pk=pk),
            detail={"name": name},
            at=now,
        )
        emit("pool.deleted", Pool(pk=pk), at=now)


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.pk if hasattr(v, "pk") else str(v) if hasattr(v, "seconds") else v)
            for k, v in values.items()}  # fmt: skip


def _host_view(host: Host) -> HostView:
    # Only what `host_offers_pool` reads: backends, platform, labels.
    return HostView(
        id=host.pk, name=host.name, healthy=True, cordoned=False,
        backends=tuple(host.backends or ()), platform=host.platform or None,
        labels=tuple(sorted((str(k), str(v)) for k, v in (host.labels or {}).items())),
        capacity=host.capacity, cpus=None, memory_mb=None,
    )  # fmt: skip


def prewarm_pool(pool: Pool, *, actor: str, now: datetime) -> tuple[str, list[str]]:
    """AGENT-14: an image_prewarm task for every healthy, uncordoned host that could run the
    pool, naming the image its runners would run (BACK-16's variant included); a host that
    already has one open for that image is not asked twice. Answers (image, host names).

    Each agent queues it behind its creates in its one start slot (AGENT-02), and reuses a
    preparation across pools for a minute (AGENT-15)."""
    if pool.backend not in naming.CONTAINER_BACKENDS:
        raise CannotPrewarm(f"pool {pool.name} runs on the {pool.backend} backend: no image")
    try:
        image = naming.runner_image(pool.image, pool.platform, pool.backend, dind=pool.dind)
    except ValueError as exc:
        raise CannotPrewarm(f"pool {pool.name}: {exc}") from exc
    try:
        view = pool_view(pool)
    except PoolUnreadable as exc:
        raise CannotPrewarm(f"pool {pool.name} cannot be read: {exc}") from exc
    hosts = [
        h
        for h in Host.objects.filter(health=HostHealth.HEALTHY, cordoned=False).order_by("pk")
        if host_offers_pool(_host_view(h), view)
    ]
    open_already = set(
        AgentTask.objects.filter(
            host__in=hosts,
            kind=TaskKind.IMAGE_PREWARM,
            state__in=OPEN_TASK_STATES,
            payload__image=image,
        ).values_list("host_id", flat=True)
    )
    payload = {"backend": pool.backend, "image": image, "pool": pool.name, "dind": pool.dind}
    asked = [h for h in hosts if h.pk not in open_already]
    with transaction.atomic(durable=True):
        for host in asked:
            enqueue_task(
                host_id=host.pk, runner_id=None, kind=TaskKind.IMAGE_PREWARM, payload=payload,
                now=now,
            )  # fmt: skip
        audit.record(
            actor=actor,
            action="pool.prewarm",
            target=pool,
            detail={"image": image, "hosts": [h.name for h in asked]},
            at=now,
        )
    return image, [h.name for h in asked]


# -- automatic pools (SCHED-31) ------------------------------------------------------------

# What the controller owns of a pool with an auto_key; every other column is the operator's.
AUTO_OWNED = (
    "labels", "platform", "backend", "cpus", "memory_mb", "size_class", "size_class_since",
    "auto_active",
)  # fmt: skip
# What the operator decides that a pass works from: an edit of these saved while a pass was
# working makes that pass's write a no-op, so it is never put back.
AUTO_OPERATOR_READ = ("warm", "max_runners", "paused")


def make_auto_pool(
    *, auto_key: str, name: str, owned: dict[str, Any], actor: str, now: datetime
) -> Pool | None:
    """A new automatic pool, the operator's columns at their defaults (warm 0: it serves the
    jobs that ask for it, and keeps nothing idle until the operator says so). None when
    another pass made it first or an operator's pool holds the name."""
    if Pool.objects.filter(name=name).exists() or Pool.objects.filter(auto_key=auto_key).exists():
        return None
    pool = Pool(name=name, auto_key=auto_key, **owned)
    pool.full_clean(validate_unique=False)
    with transaction.atomic(durable=True):
        pool.save()
        _recorded(pool, "created", {"auto_key": auto_key, **owned}, actor=actor, now=now)
    return pool


def apply_auto_shape(
    pool_id: int,
    *,
    auto_key: str,
    owned: dict[str, Any],
    operator_read: dict[str, Any],
    reason: str,
    actor: str,
    now: datetime,
) -> bool:
    """SCHED-31: one narrow UPDATE of the controller's columns, on the pool with this id and
    auto_key only, and only while the operator's warm count, cap and pause are what the pass
    read. False when it touched nothing (an operator's edit won, or the pool is gone)."""
    foreign = set(owned) - set(AUTO_OWNED)
    if foreign:
        raise ValueError(f"not the controller's to write on a pool: {', '.join(sorted(foreign))}")
    with transaction.atomic(durable=True):
        changed = Pool.objects.filter(pk=pool_id, auto_key=auto_key, **operator_read).update(
            **owned
        )
        if not changed:
            return False
        pool = Pool.objects.get(pk=pool_id)
        _recorded(pool, "updated", {"reason": reason, **owned}, actor=actor, now=now)
    return True


def _recorded(pool: Pool, what: str, detail: dict[str, Any], *, actor: str, now: datetime) -> None:
    """An automatic pool's write, inside its transaction: the audit row (pool.auto_create or
    pool.auto_update), the event the dashboard follows, and a pass after commit."""
    plain = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in detail.items()}
    action = "pool.auto_create" if what == "created" else "pool.auto_update"
    audit.record(actor=actor, action=action, target=pool, detail=plain, at=now)
    emit(f"pool.{what}", pool, at=now)
    _wake()
