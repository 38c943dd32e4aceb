"""The pressure hold and the throttle ladder, decided from what a host measured (HOST-13..21).

Pure: a host's last sample and its throttle state in (with `now`), a decision with its
reason out. No Django, no clock, no I/O; the controller applies the decision (it alone sets
the throttle fields, HOST-19: a heartbeat carries measurements, never a decision).

- A pressure hold refuses new starts while a fresh sample shows CPU or memory acutely
  short, and lifts on the first sample that does not (HOST-13).
- The ladder has levels 0..3; each takes a quarter of the host's configured slots and a
  quarter of each runner's CPU quota, the factor stopping at 0.5 (HOST-14), capacity never
  below 1 (HOST-18). It climbs one level at a time, no sooner than THROTTLE_STEP after the
  last change, while the host is overwhelmed (HOST-15); comes down one level after
  THROTTLE_RECOVERY of unbroken calm (HOST-16); and is cleared when samples have stopped for
  STALE_THROTTLE_RESET (HOST-17).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

MAX_LEVEL = 3
MIN_CPU_FACTOR = 0.5
# A sample older than this says nothing about now: no hold, no step (store.HostUsageMaxAge).
HOST_USAGE_MAX_AGE = timedelta(seconds=90)
# How long CPU must stay short before a hold counts as sustained (store.CPUHoldWindow).
CPU_HOLD_WINDOW = timedelta(seconds=30)
# The pacing, each chosen against another constant (HOST-21, tests/fleet/test_throttle.py):
THROTTLE_STEP = timedelta(minutes=2)  # >= CPU_HOLD_WINDOW
THROTTLE_RECOVERY = timedelta(minutes=5)  # > HOST_USAGE_MAX_AGE
STALE_THROTTLE_RESET = timedelta(minutes=10)  # > host.lost_after (5 min by default)
LOAD_PER_CPU_OVERWHELMED = 2.0
LOAD_PER_CPU_CALM = 1.0
# Acutely short: CPU this busy with the run queue past the cores, or memory at the floor.
CPU_SHORT_PERCENT = 95.0


@dataclass(frozen=True)
class Sample:
    """One measurement of a host: when, and what (None where the host did not say)."""

    at: datetime
    cpus: float | None = None
    cpu_percent: float | None = None
    load1: float | None = None
    memory_total_mb: int | None = None
    memory_used_mb: int | None = None
    reserve_mb: int = 0  # what the operator holds back, with the floor below
    # A runner no CPU quota binds is using what the hold saw short (the agent says so).
    unbound_runner: bool = False

    def memory_floor_mb(self) -> int:
        """The host's reserve, and at least a twentieth of the machine."""
        total = self.memory_total_mb or 0
        return max(self.reserve_mb, total // 20)


@dataclass(frozen=True)
class ThrottleState:
    level: int = 0
    changed_at: datetime | None = None
    calm_since: datetime | None = None


@dataclass(frozen=True)
class ThrottleDecision:
    level: int
    changed_at: datetime | None
    calm_since: datetime | None
    capacity: int
    cpu_factor: float
    hold: str  # why new starts are held now, or ""
    reason: str  # why the level is what it is


def fresh(sample: Sample | None, now: datetime) -> bool:
    return sample is not None and timedelta(0) <= now - sample.at <= HOST_USAGE_MAX_AGE


def pressure_hold(sample: Sample | None, now: datetime) -> str:
    """HOST-13: why a fresh sample holds new starts, or "" (none, or not fresh)."""
    if sample is None or not fresh(sample, now):
        return ""
    if sample.memory_total_mb and sample.memory_used_mb is not None:
        available = sample.memory_total_mb - sample.memory_used_mb
        if available <= sample.memory_floor_mb():
            return (
                f"memory short: {available} MB available, at its floor of "
                f"{sample.memory_floor_mb()} MB"
            )
    if (
        sample.cpu_percent is not None
        and sample.cpu_percent >= CPU_SHORT_PERCENT
        and sample.cpus
        and sample.load1 is not None
        and sample.load1 > sample.cpus
    ):
        return (
            f"CPU short: {sample.cpu_percent:g} % busy with load {sample.load1:g} on "
            f"{sample.cpus:g} cores"
        )
    return ""


def overwhelmed(sample: Sample, now: datetime) -> str:
    """HOST-15: why the host is overwhelmed, or "": a CPU hold with a runner no quota binds,
    a load average of at least 2.0 per core, or memory at the reserve."""
    hold = pressure_hold(sample, now)
    if hold.startswith("memory"):
        return hold
    if hold and sample.unbound_runner:
        return f"{hold}, and a runner no CPU quota binds"
    if sample.cpus and sample.load1 is not None:
        if sample.load1 >= LOAD_PER_CPU_OVERWHELMED * sample.cpus:
            return f"load {sample.load1:g} on {sample.cpus:g} cores (>= 2.0 per core)"
    return ""


def calm(sample: Sample) -> bool:
    """HOST-16: load at most 1.0 per core (and nothing overwhelming)."""
    return (
        bool(sample.cpus)
        and sample.load1 is not None
        and (sample.load1 <= LOAD_PER_CPU_CALM * (sample.cpus or 0))
    )


def effective_capacity(configured: int, level: int) -> int:
    """A quarter of the configured slots per level, never below 1 (HOST-14, HOST-18)."""
    if configured <= 0:
        return configured  # a host offering nothing is the operator's choice, not ours
    return max(1, math.floor(configured * (MAX_LEVEL + 1 - level) / (MAX_LEVEL + 1)))


def cpu_factor(level: int) -> float:
    """A quarter of each runner's CPU quota per level, stopping at MIN_CPU_FACTOR."""
    return max(MIN_CPU_FACTOR, 1.0 - 0.25 * level)


def next_throttle(
    *,
    now: datetime,
    state: ThrottleState,
    sample: Sample | None,
    configured_capacity: int,
    enabled: bool = True,
) -> ThrottleDecision:
    """The host's throttle after this look; one level of change at most."""
    level, changed_at, calm_since = state.level, state.changed_at, state.calm_since
    hold = pressure_hold(sample, now) if enabled else ""
    if not enabled:
        level, reason = 0, "throttling is off (scheduler.host_throttling)"
        changed_at = now if state.level else changed_at
        calm_since = None
    elif sample is None or now - sample.at >= STALE_THROTTLE_RESET:
        if level:
            changed_at = now
        level, calm_since = 0, None
        reason = "no sample for 10 min: placed by its configured capacity"
    elif not fresh(sample, now):
        reason = f"level {level}: the last sample is too old to act on"
    elif why := overwhelmed(sample, now):
        calm_since = None
        since = changed_at is None or now - changed_at >= THROTTLE_STEP
        if level < MAX_LEVEL and since:
            level, changed_at = level + 1, now
            reason = f"up to level {level}: {why}"
        else:
            reason = f"level {level}, overwhelmed: {why}"
    elif calm(sample):
        calm_since = calm_since or sample.at
        if level and now - calm_since >= THROTTLE_RECOVERY:
            level, changed_at, calm_since = level - 1, now, now
            reason = f"down to level {level}: calm for {_span(THROTTLE_RECOVERY)}"
        else:
            reason = f"level {level}, calm since {calm_since:%H:%M:%S}"
    else:
        calm_since = None
        reason = f"level {level}: busy, neither calm nor overwhelmed"
    return ThrottleDecision(
        level=level,
        changed_at=changed_at,
        calm_since=calm_since,
        capacity=effective_capacity(configured_capacity, level),
        cpu_factor=cpu_factor(level),
        hold=hold,
        reason=reason,
    )


def _span(span: timedelta) -> str:
    return f"{int(span.total_seconds() // 60)} min"
