"""The controller's half of the memory valve (HOST-24, HOST-25): from a host's rows and its
last measurement, how much memory its agent may lend and each runner's bounds.

Pure: a snapshot in, rules and a reason out; no clock, no ORM, no I/O (a test holds it to
that). The housekeeping of loans (recording them on the runner's row, charging them in the
placement ledger) is the caller's.

Every runner is charged its guarantee (what it was given at create), except that idle
runners, which use little until a job arrives, are charged together only the largest of
theirs; one compatible queued start is held back as if it had started. What that and the
floor (the host's reserve, at least a twentieth of the machine) leave of the machine, less
what is already lent, may be lent, and never more than the host measured free beyond its
floor, so a loan is never made of memory that is not there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.protocol import DEFAULT_CEILING_FACTOR, MemoryRules, RunnerMemoryRule

# scheduler.MemoryPoolSafetyShare: the floor is at least this share of the machine.
MEMORY_POOL_SAFETY_SHARE = 0.05


@dataclass(frozen=True)
class RunnerMemory:
    """A live runner on the host: its state, what it was given, and what it was lent."""

    runner_id: int
    state: str
    guarantee_mb: int | None  # None: no memory limit (a process runner), nothing to lend
    lent_mb: int = 0


@dataclass(frozen=True)
class HostMemory:
    machine_mb: int
    reserve_mb: int = 0
    free_mb: int | None = None  # the last sample's available memory; None: not measured
    runners: Sequence[RunnerMemory] = ()
    held_back_mb: int = 0  # one compatible queued start's guarantee, 0 when none waits
    ceiling_factor: float = DEFAULT_CEILING_FACTOR


@dataclass(frozen=True)
class MemoryPlan:
    rules: MemoryRules
    reason: str


def memory_floor(machine_mb: int, reserve_mb: int = 0) -> int:
    """The host's reserve, and at least a twentieth of the machine (MemoryPoolFloor)."""
    return max(int(reserve_mb or 0), int(machine_mb * MEMORY_POOL_SAFETY_SHARE))


def memory_ceiling(guarantee_mb: int, factor: float = DEFAULT_CEILING_FACTOR) -> int:
    """The most a runner's limit may be raised to: `factor` times its guarantee, never
    under the guarantee itself."""
    return max(guarantee_mb, int(guarantee_mb * max(factor, 1.0)))


def plan_memory_pool(host: HostMemory) -> MemoryPlan:
    floor = memory_floor(host.machine_mb, host.reserve_mb)
    limited = [r for r in host.runners if r.guarantee_mb is not None and r.guarantee_mb > 0]
    idle = [r.guarantee_mb or 0 for r in limited if r.state == "idle"]
    working = sum(r.guarantee_mb or 0 for r in limited if r.state != "idle")
    charged = working + max(idle, default=0) + max(0, host.held_back_mb)
    lent = sum(max(0, r.lent_mb) for r in host.runners)
    by_rows = host.machine_mb - floor - charged - lent
    capacity = by_rows
    why = (
        f"{host.machine_mb} MB less the floor {floor}, guarantees {charged} "
        f"({len(limited)} runner(s), {len(idle)} idle charged as one"
        f"{', a queued start held back' if host.held_back_mb else ''}) and {lent} lent"
    )
    if host.free_mb is not None and host.free_mb - floor < capacity:
        capacity = host.free_mb - floor
        why += f"; capped by the {host.free_mb} MB measured free less the floor"
    capacity = max(0, capacity)
    rules = MemoryRules(
        capacity_mb=capacity,
        floor_mb=floor,
        runners=tuple(
            RunnerMemoryRule(
                runner_id=r.runner_id,
                guarantee_mb=int(r.guarantee_mb or 0),
                ceiling_mb=memory_ceiling(int(r.guarantee_mb or 0), host.ceiling_factor),
            )
            for r in sorted(limited, key=lambda r: r.runner_id)
        ),
    )
    return MemoryPlan(rules=rules, reason=f"{capacity} MB may be lent: {why}")
