"""Small builders for scheduler snapshots, and `apply_plan`, the reconcile pass in miniature."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import count

from runners.scheduler import (
    HostView,
    JobView,
    Plan,
    PoolView,
    RunnerView,
    SchedulerSettings,
    Snapshot,
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
_ids = count(1000)


def pool(
    id: int = 1,
    name: str = "zoomies-linux-x64",
    *,
    labels: tuple[str, ...] = (),
    backend: str = "docker",
    platform: str | None = "linux/x64",
    host_selector: tuple[tuple[str, str], ...] = (),
    image: str = "",
    cpus: float | None = None,
    memory_mb: int | None = None,
    **rest: object,
) -> PoolView:
    return PoolView(
        id=id,
        name=name,
        labels=labels,
        backend=backend,
        platform=platform,
        host_selector=host_selector,
        image=image,
        cpus=cpus,
        memory_mb=memory_mb,
        **rest,  # type: ignore[arg-type]
    )


def host(
    id: int = 1,
    name: str | None = None,
    *,
    healthy: bool = True,
    cordoned: bool = False,
    backends: tuple[str, ...] = ("docker",),
    platform: str | None = "linux/x64",
    labels: tuple[tuple[str, str], ...] = (),
    capacity: int = 4,
    cpus: float | None = None,
    memory_mb: int | None = None,
    pressure_hold: bool = False,
) -> HostView:
    return HostView(
        id=id,
        name=name or f"zoomies-host-{id}",
        healthy=healthy,
        cordoned=cordoned,
        backends=backends,
        platform=platform,
        labels=labels,
        capacity=capacity,
        cpus=cpus,
        memory_mb=memory_mb,
        pressure_hold=pressure_hold,
    )


def runner(
    id: int | None = None,
    *,
    pool_id: int = 1,
    host_id: int | None = 1,
    state: str = "idle",
    age: timedelta = timedelta(minutes=1),
    in_state: timedelta | None = None,
    finished_ago: timedelta | None = None,
    cpus: float | None = None,
    memory_mb: int | None = None,
    dind: bool = False,
    came_online: bool = False,
) -> RunnerView:
    """A runner created `age` ago, in `state` for `in_state` (default: since creation)."""
    return RunnerView(
        id=next(_ids) if id is None else id,
        pool_id=pool_id,
        host_id=host_id,
        state=state,
        created_at=NOW - age,
        state_changed_at=NOW - (in_state if in_state is not None else age),
        finished_at=None if finished_ago is None else NOW - finished_ago,
        cpus=cpus,
        memory_mb=memory_mb,
        dind=dind,
        came_online=came_online,
    )


def job(
    id: int | None = None,
    labels: tuple[str, ...] = ("self-hosted", "linux", "x64"),
    *,
    installation_id: int | None = None,
) -> JobView:
    return JobView(
        id=next(_ids) if id is None else id,
        labels=labels,
        repository="octo/app",
        installation_id=installation_id,
        created_at=NOW - timedelta(seconds=5),
    )


def jobs(n: int, labels: tuple[str, ...] = ("self-hosted", "linux", "x64")) -> tuple[JobView, ...]:
    return tuple(job(labels=labels) for _ in range(n))


def snapshot(
    pools: tuple[PoolView, ...] = (),
    hosts: tuple[HostView, ...] = (),
    runners: tuple[RunnerView, ...] = (),
    queued: tuple[JobView, ...] = (),
    settings: SchedulerSettings | None = None,
    now: datetime = NOW,
) -> Snapshot:
    return Snapshot(
        now=now,
        pools=pools,
        hosts=hosts,
        runners=runners,
        queued_jobs=queued,
        settings=settings or SchedulerSettings(),
    )


def apply_plan(snap: Snapshot, plan: Plan) -> Snapshot:
    """What the reconcile pass would leave behind: the rows after applying `plan`.

    A create becomes a provisioning row on its host, charged what the create said; a fail
    becomes failed (finished now); a drain becomes draining.
    """
    now = snap.now
    pools = {p.id: p for p in snap.pools}
    failed = {f.runner_id for f in plan.fails}
    drained = {d.runner_id for d in plan.drains}
    rows = []
    for r in snap.runners:
        if r.id in failed:
            r = replace(r, state="failed", state_changed_at=now, finished_at=now)
        elif r.id in drained:
            r = replace(r, state="draining", state_changed_at=now)
        rows.append(r)
    next_id = max((r.id for r in snap.runners), default=0) + 1
    for i, create in enumerate(plan.creates):
        rows.append(
            RunnerView(
                id=next_id + i,
                pool_id=create.pool_id,
                host_id=create.host_id,
                state="provisioning",
                created_at=now,
                state_changed_at=now,
                cpus=create.cpus,
                memory_mb=create.memory_mb,
                dind=pools[create.pool_id].dind,
            )
        )
    return replace(snap, runners=tuple(rows))
