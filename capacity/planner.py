"""The capacity planner: from a snapshot, which events to publish and why (CAP-03).

Pure, like the scheduler it reads: no Django, no clock, no randomness, no network.
`tests/capacity/test_planner_purity.py` fails if one creeps in. The snapshot carries the
scheduler's own snapshot, so "queued work has nowhere to run" is judged by the very
functions that place runners (`runners.scheduler`), never by a second opinion.

Per pool, in name order:

1. Pools outside a non-empty `pools` filter are skipped (CAP-01).
2. Job-driven need = queued jobs counted for the pool, less runners that can still take
   one, within the pool's cap. A paused pool, a capped pool, a pool in its start backoff
   or with no runnable image waits for something no new machine would fix: no event.
3. No host in the fleet offers the pool (backend, platform, selector, size): a
   scale-from-zero `capacity_demand` naming what is missing (CAP-05, CAP-06).
4. Hosts offer it but the need is not placed this pass: a `capacity_demand` for what is
   left over (CAP-04). What the scheduler places now is not demand.
5. Otherwise free slots on the pool's eligible hosts are excess idle capacity; its clock
   starts when first seen, any break clears it, and `scale_down_opportunity` is emitted
   once it has stayed visible for the cooldown (CAP-07).

An event for a (pool, type) whose last attempt is inside the cooldown is held (CAP-13);
a scale-up toward a destination under a provision-failure deferral is held (ESC-22).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from runners.naming import default_image
from runners.scheduler import (
    HostView,
    PoolView,
    Snapshot,
    assign_jobs,
    decide,
    host_offers_pool,
    platforms_fit,
)
from runners.scheduler.matching import host_accepts_work, normalise_platform
from runners.scheduler.model import AVAILABLE_STATES, REMOVED, TERMINAL_STATES
from runners.scheduler.resources import Charge, HostBooks, build_books, fits_empty

CAPACITY_DEMAND = "capacity_demand"
SCALE_DOWN_OPPORTUNITY = "scale_down_opportunity"
# The peer's teardown event (ESC-15, ESC-16): it names one provision and why.
SCALE_DOWN = "scale_down"
EVENT_TYPES = (CAPACITY_DEMAND, SCALE_DOWN_OPPORTUNITY, SCALE_DOWN)


@dataclass(frozen=True)
class CapacitySettings:
    """The capacity_demand.* settings the planner reads."""

    cooldown: timedelta = timedelta(minutes=5)
    # Pool ids (as text) or names; empty publishes every pool (CAP-01).
    pools: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExcessClock:
    """Excess idle capacity seen for a pool without a break since `since`.

    `slots` is the least excess seen since then: only what stayed visible all along is
    offered for removal.
    """

    pool_id: int
    since: datetime
    slots: int


@dataclass(frozen=True)
class LastAttempt:
    """When Zoomies last started an attempt for (pool, type), whatever its outcome."""

    pool_id: int
    type: str
    at: datetime


@dataclass(frozen=True)
class CapacitySnapshot:
    """Everything a capacity decision depends on, `now` included."""

    now: datetime
    scheduling: Snapshot
    settings: CapacitySettings = CapacitySettings()
    excess_clocks: tuple[ExcessClock, ...] = ()
    last_attempts: tuple[LastAttempt, ...] = ()
    # Until when scale-ups are deferred after consecutive provision failures (ESC-22);
    # None: not deferred.
    scale_up_deferred_until: datetime | None = None
    scale_up_deferral_reason: str = ""


@dataclass(frozen=True)
class Reading:
    """What Zoomies counted for one pool: the event's numbers (CAP-09, CAP-10)."""

    pool_id: int
    pool_name: str
    host_selector: tuple[tuple[str, str], ...]
    backend: str
    platform: str | None
    required_runner_slots: int
    current_capacity: int
    queued_job_count: int
    oldest_queue_age_seconds: int
    # For scale-from-zero: the requirements no host in the fleet meets (CAP-06).
    missing: tuple[tuple[str, object], ...] = ()

    @property
    def scale_from_zero(self) -> bool:
        return bool(self.missing)


@dataclass(frozen=True)
class Emit:
    """Publish one event of `type` with this reading."""

    type: str
    reading: Reading
    reason: str


@dataclass(frozen=True)
class Held:
    """An event the planner would emit but holds back (cooldown or deferral)."""

    type: str
    reading: Reading
    until: datetime | None
    reason: str


@dataclass(frozen=True)
class SetExcessClock:
    """Start or narrow a pool's excess clock."""

    pool_id: int
    since: datetime
    slots: int
    reason: str


@dataclass(frozen=True)
class ClearExcessClock:
    """The excess was not visible this pass: the wait starts over (CAP-07)."""

    pool_id: int
    reason: str


@dataclass(frozen=True)
class PoolStatus:
    """What the pool is waiting for, in one sentence, for the page and the API."""

    pool_id: int
    pool_name: str
    waiting_for: str


@dataclass(frozen=True)
class CapacityPlan:
    """What to publish, each with a reason."""

    emits: tuple[Emit, ...] = ()
    held: tuple[Held, ...] = ()
    clocks: tuple[SetExcessClock | ClearExcessClock, ...] = ()
    statuses: tuple[PoolStatus, ...] = field(default=())

    def actions(self) -> tuple[Emit | SetExcessClock | ClearExcessClock, ...]:
        return (*self.emits, *self.clocks)


def pool_selected(pool: PoolView, pools: Sequence[str]) -> bool:
    """Whether the `pools` filter lets this pool be published (CAP-01)."""
    if not pools:
        return True
    wanted = {item.strip() for item in pools if item.strip()}
    return str(pool.id) in wanted or pool.name in wanted


def plan(snapshot: CapacitySnapshot) -> CapacityPlan:
    """The events this snapshot calls for, with reasons."""
    sched = snapshot.scheduling
    now = snapshot.now
    decision = decide(sched)
    failed_ids = frozenset(f.runner_id for f in decision.fails)
    drained_ids = frozenset(d.runner_id for d in decision.drains)
    creates_by_pool: dict[int, int] = {}
    for create in decision.creates:
        creates_by_pool[create.pool_id] = creates_by_pool.get(create.pool_id, 0) + 1
    waiting_pools = {w.pool_id: w for w in decision.waits}
    pools_by_id = {p.id: p for p in sched.pools}
    books = build_books(sched.hosts, sched.runners, pools_by_id, released=failed_ids)
    for create in decision.creates:
        host_books = books.get(create.host_id)
        if host_books is not None:
            host_books.charge(Charge(cpus=create.cpus, memory_mb=create.memory_mb))
    jobs_by_pool = assign_jobs(sched.queued_jobs, sched.pools)
    clocks = {c.pool_id: c for c in snapshot.excess_clocks}
    attempts: dict[tuple[int, str], datetime] = {}
    for attempt in snapshot.last_attempts:
        key = (attempt.pool_id, attempt.type)
        if key not in attempts or attempt.at > attempts[key]:
            attempts[key] = attempt.at

    emits: list[Emit] = []
    held: list[Held] = []
    clock_moves: list[SetExcessClock | ClearExcessClock] = []
    statuses: list[PoolStatus] = []
    cooldown = snapshot.settings.cooldown

    def publish(kind: str, reading: Reading, reason: str) -> str:
        last = attempts.get((reading.pool_id, kind))
        if last is not None and now - last < cooldown:
            until = last + cooldown
            why = (
                f"{reason}; held: the last {kind} attempt for {reading.pool_name} was at "
                f"{_clock(last)}, so the next may start at {_clock(until)} "
                "(capacity_demand.cooldown)"
            )
            held.append(Held(kind, reading, until, why))
            return why
        if kind == CAPACITY_DEMAND and snapshot.scale_up_deferred_until is not None:
            if now < snapshot.scale_up_deferred_until:
                until = snapshot.scale_up_deferred_until
                why = (
                    f"{reason}; deferred until {_clock(until)}: {snapshot.scale_up_deferral_reason}"
                )
                held.append(Held(kind, reading, until, why))
                return why
        emits.append(Emit(kind, reading, reason))
        return reason

    for pool in sorted(sched.pools, key=lambda p: (p.name, p.id)):
        if not pool_selected(pool, snapshot.settings.pools):
            continue
        pool_runners = [r for r in sched.runners if r.pool_id == pool.id]
        jobs = jobs_by_pool.get(pool.id, ())
        queued = len(jobs)
        oldest = 0
        if jobs:
            oldest = max(0, int((now - min(j.created_at for j in jobs)).total_seconds()))
        live = sum(
            1 for r in pool_runners if r.state not in TERMINAL_STATES and r.id not in failed_ids
        )
        available = sum(
            1
            for r in pool_runners
            if r.state in AVAILABLE_STATES and r.id not in failed_ids and r.id not in drained_ids
        )
        grace = sched.settings.unlinked_exit_grace
        # A clean exit with no job heard of stands for a job that still looks queued.
        unheard = sum(
            1
            for r in pool_runners
            if r.unlinked_exit
            and r.state == REMOVED
            and r.finished_at is not None
            and now - r.finished_at < grace
        )
        jobs_left = max(0, queued - unheard)
        job_need = max(0, jobs_left - available)
        eligible = [h for h in sched.hosts if host_offers_pool(h, pool) and fits_empty(pool, h)]
        accepting = [h for h in eligible if host_accepts_work(h)]
        current = sum(max(0, h.capacity) for h in accepting)

        base = Reading(
            pool_id=pool.id,
            pool_name=pool.name,
            host_selector=tuple(sorted(pool.host_selector)),
            backend=pool.backend,
            platform=normalise_platform(pool.platform),
            required_runner_slots=0,
            current_capacity=current,
            queued_job_count=queued,
            oldest_queue_age_seconds=oldest,
        )

        status = ""
        excess = 0
        if job_need > 0 and pool.paused:
            status = f"{pool.name} is paused: {queued} queued job(s) wait, no capacity asked for"
        elif job_need > 0 and max(0, pool.max_runners - live) == 0:
            status = (
                f"{pool.name} is at its cap of {pool.max_runners} runners: queued jobs wait "
                "for its own runners, not for more hosts"
            )
        elif job_need > 0:
            need = min(job_need, max(0, pool.max_runners - live))
            if not eligible:
                missing = _missing(pool, sched.hosts)
                reason = (
                    f"{need} runner slot(s) wanted in {pool.name} for {queued} queued job(s), "
                    f"but no host in the fleet could run it: {_missing_text(missing)} "
                    "(scale from zero)"
                )
                status = publish(
                    CAPACITY_DEMAND,
                    replace(base, required_runner_slots=need, missing=missing),
                    reason,
                )
            elif pool.id in waiting_pools:
                status = waiting_pools[pool.id].reason
            elif (bad_image := _image_error(pool)) is not None:
                status = f"{pool.name} cannot start runners: {bad_image}"
            else:
                placed = creates_by_pool.get(pool.id, 0)
                shortfall = max(0, need - placed)
                if shortfall:
                    reason = (
                        f"{shortfall} runner slot(s) wanted in {pool.name} for {queued} queued "
                        f"job(s) have nowhere to run: every host that could run it is full or "
                        f"not taking work ({current} eligible slot(s) counted)"
                    )
                    status = publish(
                        CAPACITY_DEMAND, replace(base, required_runner_slots=shortfall), reason
                    )
                else:
                    status = f"{pool.name}: {placed} runner(s) being placed on existing hosts"
        elif queued <= available + unheard:
            excess = _free_slots(accepting, books)
            # A warm count still unmet is spoken for, not excess.
            warm_short = max(0, pool.warm - available)
            excess = max(0, excess - warm_short)

        clock = clocks.get(pool.id)
        if excess > 0:
            since = clock.since if clock is not None else now
            slots = min(clock.slots, excess) if clock is not None else excess
            if clock is None or clock.slots != slots:
                clock_moves.append(
                    SetExcessClock(
                        pool.id,
                        since,
                        slots,
                        f"{slots} idle slot(s) eligible for {pool.name} seen since {_clock(since)}",
                    )
                )
            if now - since >= cooldown:
                reason = (
                    f"{slots} runner slot(s) eligible for {pool.name} idle without a break "
                    f"since {_clock(since)}, at least the cooldown of {_span(cooldown)}; advisory"
                )
                status = publish(
                    SCALE_DOWN_OPPORTUNITY, replace(base, required_runner_slots=-slots), reason
                )
            else:
                status = (
                    f"{pool.name}: {slots} idle slot(s) since {_clock(since)}; a scale-down "
                    f"opportunity once they stay idle until {_clock(since + cooldown)}"
                )
        elif clock is not None:
            clock_moves.append(
                ClearExcessClock(
                    pool.id, f"no excess idle capacity for {pool.name} now: the wait starts over"
                )
            )
        statuses.append(PoolStatus(pool.id, pool.name, status or f"{pool.name}: nothing"))

    return CapacityPlan(
        emits=tuple(emits),
        held=tuple(held),
        clocks=tuple(clock_moves),
        statuses=tuple(statuses),
    )


def _free_slots(hosts: Sequence[HostView], books: Mapping[int, HostBooks]) -> int:
    total = 0
    for host in hosts:
        host_books = books.get(host.id)
        if host_books is not None:
            total += max(0, host_books.free_slots)
    return total


def _missing(pool: PoolView, hosts: Sequence[HostView]) -> tuple[tuple[str, object], ...]:
    """What no host in the fleet offers, narrowing backend, then platform, then selector.

    Every requirement the pool makes is named where no candidate meets it, so an empty
    fleet names them all.
    """
    missing: list[tuple[str, object]] = []
    candidates = [h for h in hosts if pool.backend.lower() in {b.lower() for b in h.backends}]
    if not candidates:
        missing.append(("backend", pool.backend))
        # The other requirements are judged over the whole fleet, so a fleet that has them
        # on a host of another backend names only the backend.
        candidates = list(hosts)
    platform = normalise_platform(pool.platform)
    if platform:
        fitting = [h for h in candidates if platforms_fit(pool.platform, h.platform)]
        if not fitting:
            missing.append(("platform", platform))
        else:
            candidates = fitting
    if pool.host_selector:
        matching = [h for h in candidates if set(pool.host_selector) <= set(h.labels)]
        if not matching:
            missing.append(("host_selector", tuple(sorted(pool.host_selector))))
        else:
            candidates = matching
    if not missing:
        # Hosts of the right kind exist, but none could hold one runner even empty.
        size: list[tuple[str, object]] = []
        if pool.cpus is not None:
            size.append(("cpus", pool.cpus * (2 if pool.dind else 1)))
        if pool.memory_mb is not None:
            size.append(("memory_mb", pool.memory_mb * (2 if pool.dind else 1)))
        missing.append(("room", tuple(size) or (("slots", 1),)))
    return tuple(missing)


def _missing_text(missing: tuple[tuple[str, object], ...]) -> str:
    parts = []
    for key, value in missing:
        if key == "host_selector" or key == "room":
            pairs = ", ".join(f"{k}={v}" for k, v in value)  # type: ignore[attr-defined]
            parts.append(f"{key} {pairs}")
        else:
            parts.append(f"{key} {value}")
    return "missing " + "; ".join(parts)


def _image_error(pool: PoolView) -> str | None:
    if pool.image:
        return None
    try:
        default_image(pool.platform, pool.backend)
    except ValueError as exc:
        return str(exc)
    return None


def _clock(at: datetime) -> str:
    return at.strftime("%H:%M:%S")


def _span(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds // 60} min"
    return f"{seconds} s"
