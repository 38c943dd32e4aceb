"""Resource reservation: what a runner is charged, and what a host has left (SCHED-09..12).

There is no reservations table and no counter. A host's books are rebuilt on every
decision from its runner rows (every state but failed and removed, a silent host's
included) plus the runners planned in this same decision, which share one budget across
all pools (SCHED-08).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from runners.scheduler.model import TERMINAL_STATES, HostView, PoolView, RunnerView

# Float sums of typed figures (0.1 + 0.2) must not refuse a runner that exactly fits.
_EPSILON = 1e-9


@dataclass(frozen=True)
class Charge:
    """What one runner costs a host: always one slot, plus CPU and memory where known."""

    cpus: float | None
    memory_mb: int | None


def cpu_share(host: HostView) -> float | None:
    """One slot's share of the host's CPUs, floored to the hundredth.

    Floored rather than rounded so a full host's shares never sum past the machine.
    """
    if host.cpus is None or host.capacity <= 0:
        return None
    return math.floor(host.cpus / host.capacity * 100 + _EPSILON) / 100


def memory_share(host: HostView) -> int | None:
    """One slot's share of the host's memory in MB, floored."""
    if host.memory_mb is None or host.capacity <= 0:
        return None
    return host.memory_mb // host.capacity


def pool_charge(
    pool_cpus: float | None, pool_memory_mb: int | None, dind: bool, host: HostView
) -> Charge:
    """The charge of one runner with these figures on `host` (SCHED-10, SCHED-11).

    Each figure the pool typed is charged as typed, twice for a dind pair because the
    daemon beside the runner is given that figure too; each figure it left unset is
    charged one slot's share of the host, once for a dind pair, because a slot is one
    runner whatever it brought with it.
    """
    containers = 2 if dind else 1
    cpus = pool_cpus * containers if pool_cpus is not None else cpu_share(host)
    memory = pool_memory_mb * containers if pool_memory_mb is not None else memory_share(host)
    return Charge(cpus=cpus, memory_mb=memory)


def runner_charge(runner: RunnerView, pool: PoolView | None, host: HostView) -> Charge:
    """What a runner already on the host is charged (SCHED-12).

    What its row says it was charged at create; per field it left empty, the pool's rule
    (a runner whose pool is gone is charged a slot share). A dind flag on either the row or
    the pool charges the pair: over-charging can only leave room unused, never over-fill.
    """
    dind = runner.dind or (pool.dind if pool is not None else False)
    rule = pool_charge(
        pool.cpus if pool is not None else None,
        pool.memory_mb if pool is not None else None,
        dind,
        host,
    )
    memory = runner.memory_mb if runner.memory_mb is not None else rule.memory_mb
    if memory is not None and runner.lent_mb > 0:
        memory += runner.lent_mb  # HOST-29: a loan is charged until the runner ends
    return Charge(cpus=runner.cpus if runner.cpus is not None else rule.cpus, memory_mb=memory)


class HostBooks:
    """One host's slots, CPU and memory in use, rebuilt from rows for one decision.

    Mutable on purpose: `decide` charges it as it plans, so pools placed later in the same
    decision see what earlier ones took. It never outlives the call that built it.
    """

    def __init__(self, host: HostView) -> None:
        self.host = host
        self.slots_used = 0
        self.cpus_used = 0.0
        self.memory_used = 0

    def charge(self, charge: Charge) -> None:
        """Book one runner against the host."""
        self.slots_used += 1
        self.cpus_used += charge.cpus or 0.0
        self.memory_used += charge.memory_mb or 0

    @property
    def free_slots(self) -> int:
        return self.host.capacity - self.slots_used

    def shortfall(self, charge: Charge) -> str | None:
        """Why one more runner with this charge does not fit, or None when it does."""
        host = self.host
        if self.slots_used + 1 > host.capacity:
            return f"full ({self.slots_used}/{host.capacity} slots)"
        if host.cpus is not None and charge.cpus:
            if self.cpus_used + charge.cpus > host.cpus + _EPSILON:
                left = max(0.0, host.cpus - self.cpus_used)
                return f"short of CPU ({left:g} of {host.cpus:g} free, {charge.cpus:g} needed)"
        if host.memory_mb is not None and charge.memory_mb:
            if self.memory_used + charge.memory_mb > host.memory_mb:
                left_mb = max(0, host.memory_mb - self.memory_used)
                return (
                    f"short of memory ({left_mb} of {host.memory_mb} MB free, "
                    f"{charge.memory_mb} MB needed)"
                )
        return None

    def headroom_after(self, charge: Charge) -> tuple[float, int]:
        """(CPU fraction + memory fraction left, free slots) after placing this charge.

        A dimension the host has not reported is measured by its slots instead, since a
        host nobody can measure is placed by its configured capacity.
        """
        host = self.host
        slots_after = host.capacity - self.slots_used - 1
        slot_fraction = slots_after / host.capacity if host.capacity > 0 else 0.0
        if host.cpus:
            cpu_fraction = (host.cpus - self.cpus_used - (charge.cpus or 0.0)) / host.cpus
        else:
            cpu_fraction = slot_fraction
        if host.memory_mb:
            memory_fraction = (
                host.memory_mb - self.memory_used - (charge.memory_mb or 0)
            ) / host.memory_mb
        else:
            memory_fraction = slot_fraction
        return cpu_fraction + memory_fraction, slots_after

    def rank(self, charge: Charge) -> tuple[float, int] | None:
        """(-headroom after, -free slots after) for one more runner with this charge, or None
        when it does not fit: `shortfall` and `headroom_after` in one step, as placement
        asks it of many hosts (tests/runners/scheduler/reference.py ranks with those two).
        """
        host = self.host
        capacity = host.capacity
        slots_after = capacity - self.slots_used - 1
        if slots_after < 0:
            return None
        host_cpus, host_memory = host.cpus, host.memory_mb
        charge_cpus, charge_memory = charge.cpus, charge.memory_mb
        if host_cpus is not None and charge_cpus:
            if self.cpus_used + charge_cpus > host_cpus + _EPSILON:
                return None
        if host_memory is not None and charge_memory:
            if self.memory_used + charge_memory > host_memory:
                return None
        slot_fraction = slots_after / capacity if capacity > 0 else 0.0
        if host_cpus:
            cpu_fraction = (host_cpus - self.cpus_used - (charge_cpus or 0.0)) / host_cpus
        else:
            cpu_fraction = slot_fraction
        if host_memory:
            memory_fraction = (host_memory - self.memory_used - (charge_memory or 0)) / host_memory
        else:
            memory_fraction = slot_fraction
        # Rounded so float noise never decides between equally loaded hosts.
        return -round(cpu_fraction + memory_fraction, 9), -slots_after


def fits_empty(pool: PoolView, host: HostView) -> bool:
    """Whether one runner of the pool fits the host with nothing else on it."""
    return (
        HostBooks(host).shortfall(pool_charge(pool.cpus, pool.memory_mb, pool.dind, host)) is None
    )


def build_books(
    hosts: Iterable[HostView],
    runners: Iterable[RunnerView],
    pools: Mapping[int, PoolView],
    released: frozenset[int] = frozenset(),
) -> dict[int, HostBooks]:
    """Books for every host, charged for its live runner rows (SCHED-09, SCHED-12).

    `released` holds ids of runners this decision fails: they hold no slot from now on.
    """
    books = {host.id: HostBooks(host) for host in hosts}
    # In id order, so float sums (and the ranking built on them) ignore input order.
    for runner in sorted(runners, key=lambda r: r.id):
        if runner.state in TERMINAL_STATES or runner.id in released:
            continue
        host_books = books.get(runner.host_id) if runner.host_id is not None else None
        if host_books is None:
            continue
        host_books.charge(runner_charge(runner, pools.get(runner.pool_id), host_books.host))
    return books
