"""What a runner is given: the pool's figures, or one slot's share of the host (BACK-04..07).

Pure arithmetic over numbers (no I/O, no clock, standard library only), so the scheduler's
books and the agent's cgroup limits can come from one rule: what Reserve charges is what
the container is given.

The host keeps a CPU reserve under every runner -- at least half a core, and at least a
twentieth of the machine -- so its daemon and its agent keep answering while every runner
is flat out. The allocatable machine is what is left; one slot's share is that divided by
the host's slots, the CPU floored to the hundredth of a core so shares never add up past
the machine, the memory floored to the MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_RESERVE_CPUS = 0.5
MIN_RESERVE_CPU_FRACTION = 0.05
# Float noise (2.9999999) must not cost a hundredth of a core.
_EPSILON = 1e-9
MB = 1024 * 1024
NANO = 1_000_000_000

FROM_POOL = "pool"
FROM_HOST = "host"


def floor_hundredth(value: float) -> float:
    """`value` floored to the hundredth, immune to binary noise (0.29 stays 0.29)."""
    return math.floor(value * 100 + _EPSILON) / 100


def cpu_reserve(machine_cpus: float, operator_reserve: float = 0.0) -> float:
    """The CPUs held back from runners: the operator's reserve, never under the floor."""
    floor = max(MIN_RESERVE_CPUS, machine_cpus * MIN_RESERVE_CPU_FRACTION)
    return max(float(operator_reserve or 0.0), floor)


@dataclass(frozen=True)
class Allocatable:
    """The part of a host the runners share: the machine less its reserve."""

    cpus: float
    memory_mb: int


def allocatable(
    machine_cpus: float,
    machine_memory_mb: int,
    *,
    reserve_cpus: float = 0.0,
    reserve_memory_mb: int = 0,
) -> Allocatable:
    """The machine less the CPU reserve (with its floor) and the operator's memory reserve."""
    cpus = max(0.0, floor_hundredth(machine_cpus - cpu_reserve(machine_cpus, reserve_cpus)))
    memory = max(0, int(machine_memory_mb) - max(0, int(reserve_memory_mb or 0)))
    return Allocatable(cpus=cpus, memory_mb=memory)


@dataclass(frozen=True)
class Share:
    """One slot's share of a host's allocatable machine."""

    cpus: float
    memory_mb: int


def slot_share(host: Allocatable, slots: int) -> Share | None:
    """One slot's share (BACK-06: CPU floored to the hundredth); None for a host with none."""
    if slots <= 0:
        return None
    return Share(cpus=floor_hundredth(host.cpus / slots), memory_mb=host.memory_mb // slots)


@dataclass(frozen=True)
class Allocation:
    """What one runner is given, and who gave each figure ("pool", "host" or None: nothing)."""

    cpus: float | None
    memory_mb: int | None
    cpus_from: str | None
    memory_from: str | None

    @property
    def nano_cpus(self) -> int | None:
        """The engine's NanoCpus for `cpus`, exact to the hundredth of a core."""
        if self.cpus is None:
            return None
        return round(self.cpus * 100) * (NANO // 100)

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory_mb is None else self.memory_mb * MB


def allocation(
    pool_cpus: float | None,
    pool_memory_mb: int | None,
    share: Share | None,
    *,
    can_limit_cpus: bool = True,
    can_limit_memory: bool = True,
) -> Allocation:
    """The pool's figure where it typed one; else the slot share, if there is one and the
    engine can apply that limit (BACK-04, BACK-05). A figure the pool typed is given as
    typed: refusing one the engine cannot apply is the caller's decision, not this rule's."""
    cpus: float | None = None
    cpus_from: str | None = None
    if pool_cpus is not None:
        cpus, cpus_from = float(pool_cpus), FROM_POOL
    elif share is not None and can_limit_cpus and share.cpus > 0:
        cpus, cpus_from = share.cpus, FROM_HOST
    memory: int | None = None
    memory_from: str | None = None
    if pool_memory_mb is not None:
        memory, memory_from = int(pool_memory_mb), FROM_POOL
    elif share is not None and can_limit_memory and share.memory_mb > 0:
        memory, memory_from = share.memory_mb, FROM_HOST
    return Allocation(cpus=cpus, memory_mb=memory, cpus_from=cpus_from, memory_from=memory_from)


def given(pool_figure: float | None, charged: float | None, can_limit: bool) -> float | None:
    """BACK-05: what a runner is given of one figure it was `charged`. A figure the pool
    typed is given as charged; a slot share only where the host's engine said it can apply
    that limit (else the limit would bind nothing and the row would say it did)."""
    if charged is None or (pool_figure is None and not can_limit):
        return None
    return charged
