"""The machine planner: which machines to rent, which to drain, which drains to cancel.

Pure, like the scheduler: a frozen snapshot in (with `now` inside it), a plan out whose every
action carries a reason. No Django, no clock, no provider call (a test fails if one appears).

- Demand is the runners the scheduler could place nowhere (a pool no host offers, or a full
  fleet). Machines already on their way for the pool cover it first, then draining machines
  of a provider serving the pool are taken back (draining -> ready, MACH-13), and only then
  are new machines planned.
- New machines stay within every limit an operator set (MACH-15): the total
  (`max_total`), each provider's `max_machines`, and its `max_per_pool` for each pool, and
  only on an enabled provider that serves the pool and is not down.
- A ready machine drains once its host has had no live runner for `idle_timeout` and no
  demand for its pool is left uncovered (MACH-14); one with a live runner is never drained.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

# States that hold (or may hold) a resource and count against the limits. `failed` does
# not: its create is known to have come to nothing, and a sweep that finds otherwise moves
# it to deleting, which counts again.
COUNTED = frozenset(
    {"planned", "creating", "starting", "bootstrapping", "enrolling", "ready", "draining",
     "deleting", "quarantined"}
)  # fmt: skip
# On their way to being a host: they cover demand already.
ON_THE_WAY = frozenset({"planned", "creating", "starting", "bootstrapping", "enrolling"})


@dataclass(frozen=True)
class ProviderView:
    name: str
    pools: frozenset[str]
    max_machines: int
    max_per_pool: int
    slots_per_machine: int
    enabled: bool = True
    down: bool = False


@dataclass(frozen=True)
class MachineView:
    id: int
    provider: str
    pool_id: int | None
    state: str
    live_runners: int = 0
    # Since when its host has had no live runner (None: it has one, or no host yet).
    idle_since: datetime | None = None


@dataclass(frozen=True)
class PoolDemand:
    pool_id: int
    pool_name: str
    runners: int  # runners wanted that no host can take now
    why: str  # the scheduler's sentence for it


@dataclass(frozen=True)
class MachineSnapshot:
    now: datetime
    providers: tuple[ProviderView, ...]
    machines: tuple[MachineView, ...]
    demand: tuple[PoolDemand, ...]
    idle_timeout: timedelta
    max_total: int


@dataclass(frozen=True)
class PlanMachine:
    provider: str
    pool_id: int
    reason: str


@dataclass(frozen=True)
class CancelDrain:
    machine_id: int
    reason: str


@dataclass(frozen=True)
class DrainMachine:
    machine_id: int
    reason: str


@dataclass(frozen=True)
class Unmet:
    """Demand left over: no provider may take it (the reason says which limit)."""

    pool_id: int
    runners: int
    reason: str


@dataclass(frozen=True)
class MachinePlan:
    plans: tuple[PlanMachine, ...] = ()
    cancels: tuple[CancelDrain, ...] = ()
    drains: tuple[DrainMachine, ...] = ()
    unmet: tuple[Unmet, ...] = field(default=())


def plan_machines(snapshot: MachineSnapshot) -> MachinePlan:
    providers = {p.name: p for p in snapshot.providers}
    counted = [m for m in snapshot.machines if m.state in COUNTED]
    total = len(counted)
    per_provider = Counter(m.provider for m in counted)
    per_pool = Counter((m.provider, m.pool_id) for m in counted)
    plans: list[PlanMachine] = []
    cancels: list[CancelDrain] = []
    unmet: list[Unmet] = []
    cancelled: set[int] = set()
    uncovered_pools: set[int] = set()

    for demand in sorted(snapshot.demand, key=lambda d: d.pool_id):
        if demand.runners <= 0:
            continue
        serving = [
            p
            for p in sorted(providers.values(), key=lambda p: p.name)
            if demand.pool_name in p.pools and p.enabled
        ]
        left = demand.runners
        for machine in snapshot.machines:
            if machine.pool_id == demand.pool_id and machine.state in ON_THE_WAY:
                left -= _slots(providers, machine.provider)
        for machine in sorted(snapshot.machines, key=lambda m: m.id):
            if left <= 0:
                break
            if (
                machine.state == "draining"
                and machine.id not in cancelled
                and any(p.name == machine.provider for p in serving)
            ):
                cancelled.add(machine.id)
                left -= _slots(providers, machine.provider)
                cancels.append(
                    CancelDrain(
                        machine.id,
                        f"demand returned to {demand.pool_name} before the delete began: "
                        f"{demand.why}",
                    )
                )
        while left > 0:
            chosen, refusal = _room(serving, demand, total, per_provider, per_pool, snapshot)
            if chosen is None:
                unmet.append(Unmet(demand.pool_id, left, refusal))
                uncovered_pools.add(demand.pool_id)
                break
            total += 1
            per_provider[chosen.name] += 1
            per_pool[(chosen.name, demand.pool_id)] += 1
            left -= chosen.slots_per_machine
            plans.append(
                PlanMachine(
                    chosen.name,
                    demand.pool_id,
                    f"a machine from {chosen.name} for {demand.pool_name}: {demand.why}",
                )
            )
        if left > 0 and demand.pool_id not in uncovered_pools:
            uncovered_pools.add(demand.pool_id)

    wanted_pools = {d.pool_id for d in snapshot.demand if d.runners > 0}
    drains = [
        DrainMachine(
            m.id,
            f"no runner on it for {_span(snapshot.now - m.idle_since)} "
            f"(machines.idle_timeout {_span(snapshot.idle_timeout)})",
        )
        for m in sorted(snapshot.machines, key=lambda m: m.id)
        if m.state == "ready"
        and m.live_runners == 0
        and m.idle_since is not None
        and snapshot.now - m.idle_since >= snapshot.idle_timeout
        and m.pool_id not in wanted_pools
    ]
    return MachinePlan(tuple(plans), tuple(cancels), tuple(drains), tuple(unmet))


def _slots(providers: dict[str, ProviderView], name: str) -> int:
    provider = providers.get(name)
    return max(1, provider.slots_per_machine) if provider else 1


def _room(
    serving: list[ProviderView],
    demand: PoolDemand,
    total: int,
    per_provider: Counter[str],
    per_pool: Counter[tuple[str, int | None]],
    snapshot: MachineSnapshot,
) -> tuple[ProviderView | None, str]:
    """The first provider with room for one more machine for the pool, or why none has."""
    if not serving:
        return None, f"no enabled provider serves {demand.pool_name}"
    if total >= snapshot.max_total:
        return None, f"{total} machines, the limit of machines.max_total ({snapshot.max_total})"
    reasons = []
    for provider in serving:
        if provider.down:
            reasons.append(f"{provider.name} is down")
        elif per_provider[provider.name] >= provider.max_machines:
            reasons.append(f"{provider.name} has its {provider.max_machines} machines")
        elif per_pool[(provider.name, demand.pool_id)] >= provider.max_per_pool:
            reasons.append(
                f"{provider.name} has its {provider.max_per_pool} machines for {demand.pool_name}"
            )
        else:
            return provider, ""
    return None, "; ".join(reasons)


def _span(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    return f"{seconds // 60} min" if seconds >= 120 else f"{seconds} s"
