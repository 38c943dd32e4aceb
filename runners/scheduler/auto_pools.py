"""The automatic pools (SCHED-29, SCHED-32, SCHED-33): from the hosts as they are, what each
pool the controller keeps should be. Pure: a snapshot in, a plan out, a reason per action;
no clock, no database. Planning again over the plan's own result changes nothing, so a missed
event costs at most a pass and an event is only a hint to look sooner.

One automatic pool per platform the fleet's hosts report ("linux/x64"), keyed `auto:<os>/<arch>`,
labelled as GitHub labels such runners (self-hosted, the OS, the architecture). The controller
owns its shape: labels, platform, backend, size class and the size that class gives each
runner, and whether it is active. The operator owns the rest (warm count, cap, pause, image,
installation, ...), which nothing here reads or writes.

A host counts while it is heard from: its silence runs from the later of its last heartbeat
and the controller's start, and only silence beyond the grace (above the fleet's own 5-minute
host-lost time) takes it out, so neither a network blip nor a restart reshuffles a pool. A
platform with no host left is retired (kept, with the operator's settings, but given no
runner) until one comes back. The size class is the largest every counted host of the
platform has one slot's worth of; once changed it is held for `size_class_hold`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

# (name, CPUs, memory in MB) per runner, smallest first.
SIZE_CLASSES: tuple[tuple[str, float, int], ...] = (
    ("small", 1.0, 2048),
    ("medium", 2.0, 4096),
    ("large", 4.0, 8192),
    ("xlarge", 8.0, 16384),
)
# Hosts that have not said how big they are: the pool names no size, and each runner gets
# its host's slot share (the scheduler's default).
UNSIZED = "unsized"
# Preferred first when the hosts of a platform offer several.
BACKEND_ORDER = ("docker", "podman", "process")
KEY_PREFIX = "auto:"
# How often the reconciler plans (autoPoolInterval); a wake only makes a pass come sooner.
AUTO_POOL_INTERVAL = timedelta(minutes=1)


@dataclass(frozen=True)
class AutoHost:
    """A host as the planner sees it. `heard_at` is its last heartbeat (or its join)."""

    name: str
    platform: str  # "linux/x64"; "" when the agent has not said
    backends: tuple[str, ...]
    capacity: int
    cpus: float | None
    memory_mb: int | None
    heard_at: datetime | None


@dataclass(frozen=True)
class AutoShape:
    """What the controller owns of an automatic pool."""

    labels: tuple[str, ...]
    platform: str
    backend: str
    size_class: str
    cpus: float | None
    memory_mb: int | None
    active: bool


@dataclass(frozen=True)
class AutoPool:
    """An automatic pool as it is: its key, its shape, and since when its class holds."""

    id: int | None  # None: not made yet
    auto_key: str
    shape: AutoShape
    size_class_since: datetime | None


@dataclass(frozen=True)
class AutoPoolSnapshot:
    now: datetime
    controller_started_at: datetime
    host_grace: timedelta  # scheduler.auto_pools_host_grace
    size_class_hold: timedelta  # scheduler.size_class_hold
    hosts: tuple[AutoHost, ...]
    pools: tuple[AutoPool, ...]  # the pools with an auto_key


@dataclass(frozen=True)
class AutoPoolAction:
    """Make the pool with `auto_key` (id None) or change it (its id) to `shape`."""

    auto_key: str
    pool_id: int | None
    name: str
    shape: AutoShape
    size_class_since: datetime | None
    reason: str


@dataclass(frozen=True)
class AutoPoolPlan:
    actions: tuple[AutoPoolAction, ...]


def auto_key(platform: str) -> str:
    return f"{KEY_PREFIX}{platform}"


def pool_name(platform: str) -> str:
    """zoomies-auto-linux-x64: a pool name (a DNS label, with the pools' prefix) from the
    platform."""
    return "zoomies-auto-" + "-".join(part for part in platform.lower().split("/") if part)


def labels_for(platform: str) -> tuple[str, ...]:
    """What GitHub labels a self-hosted runner on that platform with (lower case: GitHub
    matches labels without regard to case)."""
    return ("self-hosted", *(part for part in platform.lower().split("/") if part))


def counted(host: AutoHost, snapshot: AutoPoolSnapshot) -> bool:
    """SCHED-32: heard from within the grace, silence counted from the later of its last
    heartbeat and the controller's start."""
    heard = host.heard_at or snapshot.controller_started_at
    since = max(heard, snapshot.controller_started_at)
    return snapshot.now - since <= snapshot.host_grace


def size_class_of(hosts: tuple[AutoHost, ...]) -> tuple[str, float | None, int | None]:
    """The largest class each sized host has one slot's worth of; the smallest class when
    even that does not fit (a slot smaller than a small runner still runs one)."""
    sized = [h for h in hosts if h.cpus and h.memory_mb and h.capacity > 0]
    if not sized:
        return UNSIZED, None, None
    slot_cpus = min(h.cpus / h.capacity for h in sized if h.cpus)
    slot_memory = min(h.memory_mb // h.capacity for h in sized if h.memory_mb)
    chosen = SIZE_CLASSES[0]
    for size in SIZE_CLASSES:
        if size[1] <= slot_cpus and size[2] <= slot_memory:
            chosen = size
    return chosen


def backend_of(hosts: tuple[AutoHost, ...]) -> str:
    """The backend most of the hosts offer, the preferred one on a tie."""
    offered = Counter(b for h in hosts for b in set(h.backends) if b in BACKEND_ORDER)
    if not offered:
        return BACKEND_ORDER[-1]
    return min(offered, key=lambda b: (-offered[b], BACKEND_ORDER.index(b)))


def plan_auto_pools(snapshot: AutoPoolSnapshot) -> AutoPoolPlan:
    """SCHED-29: what each automatic pool should be, as actions on the ones that differ."""
    by_platform: dict[str, list[AutoHost]] = {}
    for host in snapshot.hosts:
        if host.platform and counted(host, snapshot):
            by_platform.setdefault(host.platform, []).append(host)
    existing = {p.auto_key: p for p in snapshot.pools}
    platforms = sorted(set(by_platform) | {p.shape.platform for p in snapshot.pools})
    actions = []
    for platform in platforms:
        key = auto_key(platform)
        hosts = tuple(sorted(by_platform.get(platform, ()), key=lambda h: h.name))
        action = _action_for(key, platform, hosts, existing.get(key), snapshot)
        if action is not None:
            actions.append(action)
    return AutoPoolPlan(tuple(actions))


def _action_for(
    key: str,
    platform: str,
    hosts: tuple[AutoHost, ...],
    pool: AutoPool | None,
    snapshot: AutoPoolSnapshot,
) -> AutoPoolAction | None:
    name = pool_name(platform)
    if not hosts:
        if pool is None or not pool.shape.active:
            return None
        why = f"no host of {platform} heard from within {_minutes(snapshot.host_grace)}"
        return AutoPoolAction(key, pool.id, name, replace(pool.shape, active=False),
                              pool.size_class_since, f"retired: {why}")  # fmt: skip
    size_class, cpus, memory_mb = size_class_of(hosts)
    wanted = AutoShape(
        labels=labels_for(platform), platform=platform, backend=backend_of(hosts),
        size_class=size_class, cpus=cpus, memory_mb=memory_mb, active=True,
    )  # fmt: skip
    count = f"{len(hosts)} host(s) of {platform}"
    if pool is None:
        return AutoPoolAction(key, None, name, wanted, snapshot.now,
                              f"made: {count}, size {size_class}")  # fmt: skip
    since = pool.size_class_since
    held = ""
    if wanted.size_class != pool.shape.size_class:
        if since is not None and snapshot.now - since < snapshot.size_class_hold:
            # SCHED-33: the class stays; the rest of the shape may still change.
            until = since + snapshot.size_class_hold
            held = f"; size {pool.shape.size_class} held until {until:%H:%M:%S} (not {size_class})"
            wanted = replace(wanted, size_class=pool.shape.size_class, cpus=pool.shape.cpus,
                             memory_mb=pool.shape.memory_mb)  # fmt: skip
        else:
            since = snapshot.now
    if wanted == pool.shape:
        return None
    changed = sorted(f for f in AutoShape.__dataclass_fields__
                     if getattr(wanted, f) != getattr(pool.shape, f))  # fmt: skip
    verb = "revived" if wanted.active and not pool.shape.active else "reshaped"
    return AutoPoolAction(key, pool.id, name, wanted, since,
                          f"{verb}: {count}; {', '.join(changed)} changed{held}")  # fmt: skip


def applied(snapshot: AutoPoolSnapshot, plan: AutoPoolPlan) -> tuple[AutoPool, ...]:
    """The automatic pools as they are once `plan` is applied (ids stand in for new rows):
    what a second pass would read, for the idempotence the spec asks of the planner."""
    pools = {p.auto_key: p for p in snapshot.pools}
    next_id = max((p.id or 0 for p in snapshot.pools), default=0)
    for action in plan.actions:
        pool_id = action.pool_id
        if pool_id is None:
            next_id += 1
            pool_id = next_id
        pools[action.auto_key] = AutoPool(pool_id, action.auto_key, action.shape,
                                          action.size_class_since)  # fmt: skip
    return tuple(pools[k] for k in sorted(pools))


def _minutes(span: timedelta) -> str:
    return f"{int(span.total_seconds() // 60)} min"
