"""The pressure hold and the throttle ladder (fleet/throttle.py): pure, one level at a time,
paced against the measurements it climbs on (HOST-13..18, HOST-21)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet import throttle
from fleet.throttle import (
    Sample,
    ThrottleState,
    cpu_factor,
    effective_capacity,
    next_throttle,
    pressure_hold,
)
from tests.purity import impurities
from zoomies_site.core.registry.entries import SETTINGS

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
BUSY = dict(cpus=4, cpu_percent=99.0, load1=9.0, memory_total_mb=16000, memory_used_mb=4000)
CALM = dict(cpus=4, cpu_percent=20.0, load1=1.0, memory_total_mb=16000, memory_used_mb=4000)


def test_pure_no_django_no_clock_no_io():
    allowed = {"__future__", "math", "dataclasses", "datetime"}
    assert impurities(Path(throttle.__file__), allowed) == []


def test_host21_the_pacing_is_held_as_relationships_not_constants():
    """HOST-21: recovery is longer than a sample's useful age, so one calm sample cannot
    step a host down; the step is at least the CPU hold window; the stale reset comes after
    host-lost, so a late host is not handed its slots back before it is given up on; and
    the CPU factor never goes below a half."""
    lost_after = SETTINGS["host.lost_after"].default
    lost_after = lost_after if isinstance(lost_after, timedelta) else timedelta(minutes=5)
    assert throttle.THROTTLE_RECOVERY > throttle.HOST_USAGE_MAX_AGE
    assert throttle.THROTTLE_STEP >= throttle.CPU_HOLD_WINDOW
    assert throttle.STALE_THROTTLE_RESET > lost_after
    assert throttle.MIN_CPU_FACTOR >= 0.5


def test_host13_a_fresh_short_sample_holds_and_the_next_calm_one_lifts_it():
    assert "CPU short" in pressure_hold(Sample(at=T0, **BUSY), T0)
    memory = Sample(at=T0, cpus=4, memory_total_mb=16000, memory_used_mb=15500, load1=0.5)
    assert "memory short: 500 MB available" in pressure_hold(memory, T0)
    assert pressure_hold(Sample(at=T0, **CALM), T0) == ""
    stale = Sample(at=T0 - throttle.HOST_USAGE_MAX_AGE - timedelta(seconds=1), **BUSY)
    assert pressure_hold(stale, T0) == ""  # an old sample says nothing about now


def test_host14_host18_each_level_takes_a_quarter_never_below_one_slot():
    assert [effective_capacity(8, level) for level in range(4)] == [8, 6, 4, 2]
    assert [effective_capacity(2, level) for level in range(4)] == [2, 1, 1, 1]
    assert [cpu_factor(level) for level in range(4)] == [1.0, 0.75, 0.5, 0.5]


UNTHROTTLED = ThrottleState()
EVERY = timedelta(seconds=30)


def run(samples, *, start=T0, every=EVERY, state=UNTHROTTLED):
    """Feed one sample per `every`, taken at that moment; the decisions."""
    out = []
    now = start
    for values in samples:
        decision = next_throttle(
            now=now, state=state, sample=Sample(at=now, **values), configured_capacity=8
        )
        state = ThrottleState(decision.level, decision.changed_at, decision.calm_since)
        out.append((now, decision))
        now += every
    return out, state


def test_host15_host16_it_climbs_a_level_per_2_min_and_comes_down_a_level_per_5_calm():
    climbing, state = run([BUSY] * 16)  # 8 minutes overwhelmed, a sample each 30 s
    levels = [d.level for _, d in climbing]
    assert levels[0] == 1 and levels[3] == 1 and levels[4] == 2 and levels[8] == 3
    assert max(levels) == 3 and climbing[-1][1].capacity == 2
    assert "up to level 1: load 9 on 4 cores" in climbing[0][1].reason
    calming, state = run([CALM] * 40, start=T0 + timedelta(minutes=8), state=state)
    levels = [d.level for _, d in calming]
    assert levels[9] == 3 and levels[10] == 2  # 5 min of calm: one level down
    assert levels[20] == 1 and levels[30] == 0


def test_host16_calm_broken_starts_the_recovery_clock_again():
    _, state = run([BUSY])
    between = dict(CALM, load1=6.0)  # 1.5 per core: neither calm nor overwhelmed
    out, _ = run([CALM] * 8 + [between] + [CALM] * 9, start=T0 + timedelta(minutes=1),
                 state=state)  # fmt: skip
    assert all(d.level == 1 for _, d in out)  # never five unbroken minutes


def test_host17_a_host_whose_samples_stop_is_reset_after_10_min():
    _, state = run([BUSY] * 9)
    assert state.level == 3
    last = T0 + timedelta(seconds=30 * 8)
    kept = next_throttle(now=last + timedelta(minutes=9), state=state,
                         sample=Sample(at=last, **BUSY), configured_capacity=8)  # fmt: skip
    assert kept.level == 3 and "too old" in kept.reason
    reset = next_throttle(now=last + timedelta(minutes=10), state=state,
                          sample=Sample(at=last, **BUSY), configured_capacity=8)  # fmt: skip
    assert (reset.level, reset.capacity) == (0, 8)


loads = st.fixed_dictionaries(
    {
        "cpus": st.sampled_from([1, 2, 4, 16]),
        "cpu_percent": st.floats(0, 100),
        "load1": st.floats(0, 64),
        "memory_total_mb": st.just(16000),
        "memory_used_mb": st.integers(0, 16000),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    samples=st.lists(loads, min_size=1, max_size=60),
    gaps=st.lists(st.integers(1, 400), min_size=60, max_size=60),
    configured=st.integers(1, 32),
)
def test_host14_to_18_property_one_level_at_a_time_paced_and_never_below_one(
    samples, gaps, configured
):
    state, now = ThrottleState(), T0
    for values, gap in zip(samples, gaps, strict=False):
        decision = next_throttle(now=now, state=state, sample=Sample(at=now, **values),
                                 configured_capacity=configured)  # fmt: skip
        assert 0 <= decision.level <= throttle.MAX_LEVEL
        assert abs(decision.level - state.level) <= 1
        assert 1 <= decision.capacity <= configured
        assert decision.cpu_factor >= throttle.MIN_CPU_FACTOR
        if decision.level > state.level:
            assert state.changed_at is None or now - state.changed_at >= throttle.THROTTLE_STEP
        if decision.level < state.level:
            assert state.calm_since is not None
            assert now - state.calm_since >= throttle.THROTTLE_RECOVERY
        state = ThrottleState(decision.level, decision.changed_at, decision.calm_since)
        now += timedelta(seconds=gap)
