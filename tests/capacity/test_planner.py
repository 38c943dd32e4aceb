"""The pure capacity planner: which events a snapshot calls for, and why (CAP-01, CAP-03..07,
CAP-10, CAP-13, ESC-22)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from capacity.planner import (
    CAPACITY_DEMAND,
    SCALE_DOWN_OPPORTUNITY,
    CapacitySettings,
    CapacitySnapshot,
    ClearExcessClock,
    ExcessClock,
    LastAttempt,
    SetExcessClock,
    plan,
)
from tests.runners.scheduler.builders import NOW, host, jobs, pool, runner, snapshot

COOLDOWN = timedelta(minutes=5)
GPU = (("gpu", "a100"),)


def cap(sched, **kw) -> CapacitySnapshot:
    kw.setdefault("settings", CapacitySettings(cooldown=COOLDOWN))
    return CapacitySnapshot(now=sched.now, scheduling=sched, **kw)


def demand(result):
    return [e for e in result.emits if e.type == CAPACITY_DEMAND]


def test_cap04_every_capable_host_full_asks_for_the_shortfall_however_many_other_hosts():
    """CAP-04: the one docker host is full; nine podman hosts with room change nothing."""
    others = tuple(host(id=10 + i, backends=("podman",), capacity=8) for i in range(9))
    sched = snapshot(
        pools=(pool(),),
        hosts=(host(id=1, capacity=2), *others),
        runners=(runner(state="busy"), runner(state="busy")),
        queued=jobs(3),
    )
    [event] = demand(plan(cap(sched)))
    r = event.reading
    assert (r.required_runner_slots, r.current_capacity, r.queued_job_count) == (3, 2, 3)
    assert r.oldest_queue_age_seconds == 5 and not r.scale_from_zero
    assert (
        "nowhere to run" in event.reason and "every host that could run it is full" in event.reason
    )


def test_cap04_what_the_scheduler_places_now_is_not_demand():
    """CAP-04: room for one more runner: one is placed, two are asked for."""
    sched = snapshot(
        pools=(pool(),),
        hosts=(host(id=1, capacity=3),),
        runners=(runner(state="busy"), runner(state="busy")),
        queued=jobs(3),
    )
    [event] = demand(plan(cap(sched)))
    assert event.reading.required_runner_slots == 2
    assert event.reading.current_capacity == 3


def test_cap04_room_for_everything_asks_for_nothing():
    sched = snapshot(pools=(pool(),), hosts=(host(capacity=4),), queued=jobs(3))
    assert demand(plan(cap(sched))) == []


def test_cap05_an_empty_fleet_with_a_queued_job_asks_to_scale_from_zero():
    """CAP-05/CAP-06: nothing in the fleet; the event names backend and platform."""
    sched = snapshot(pools=(pool(host_selector=GPU),), hosts=(), queued=jobs(2))
    [event] = demand(plan(cap(sched)))
    r = event.reading
    assert r.scale_from_zero and r.required_runner_slots == 2 and r.current_capacity == 0
    assert dict(r.missing) == {
        "backend": "docker",
        "platform": "linux/x64",
        "host_selector": GPU,
    }
    assert "scale from zero" in event.reason


def test_cap05_hosts_of_the_wrong_backend_platform_or_selector_are_scale_from_zero():
    """CAP-05/CAP-06: each mismatch is named, and only it."""
    cases = [
        (host(backends=("podman",), labels=GPU), {"backend": "docker"}),
        (host(platform="linux/arm64", labels=GPU), {"platform": "linux/x64"}),
        (host(backends=("podman",)), {"backend": "docker", "host_selector": GPU}),
        (host(labels=(("gpu", "t4"),)), {"host_selector": GPU}),
    ]
    for fleet_host, missing in cases:
        sched = snapshot(pools=(pool(host_selector=GPU),), hosts=(fleet_host,), queued=jobs(1))
        [event] = demand(plan(cap(sched)))
        assert dict(event.reading.missing) == missing, fleet_host
        assert event.reading.current_capacity == 0


def test_cap05_a_host_too_small_for_one_runner_names_the_room_missing():
    sched = snapshot(pools=(pool(cpus=4.0),), hosts=(host(cpus=2.0, capacity=2),), queued=jobs(1))
    [event] = demand(plan(cap(sched)))
    assert dict(event.reading.missing) == {"room": (("cpus", 4.0),)}


def test_cap06_a_matching_host_joining_clears_the_demand():
    """CAP-06: the same queue, one matching host added: the runner is placed, no event."""
    empty = snapshot(pools=(pool(host_selector=GPU),), hosts=(), queued=jobs(1))
    assert demand(plan(cap(empty)))
    joined = replace(empty, hosts=(host(labels=GPU),))
    result = plan(cap(joined))
    assert demand(result) == [] and result.held == ()
    [status] = result.statuses
    assert "being placed" in status.waiting_for


def test_cap04_a_paused_or_capped_pool_is_not_capacity_demand():
    paused = snapshot(pools=(pool(paused=True),), hosts=(), queued=jobs(2))
    result = plan(cap(paused))
    assert demand(result) == [] and "paused" in result.statuses[0].waiting_for
    capped = snapshot(
        pools=(pool(max_runners=1),),
        hosts=(host(capacity=1),),
        runners=(runner(state="busy"),),
        queued=jobs(2),
    )
    result = plan(cap(capped))
    assert demand(result) == [] and "cap" in result.statuses[0].waiting_for


def test_cap04_idle_runners_answer_queued_jobs_before_any_demand():
    sched = snapshot(
        pools=(pool(),),
        hosts=(host(capacity=2),),
        runners=(runner(state="idle"), runner(state="idle")),
        queued=jobs(2),
    )
    assert demand(plan(cap(sched))) == []


def test_cap01_a_pool_outside_a_non_empty_filter_is_never_published():
    """CAP-01: the filter matches ids (as text) or names."""
    a = pool(id=1, name="zoomies-a")
    b = pool(id=2, name="zoomies-b", labels=("b",))
    sched = snapshot(pools=(a, b), hosts=(), queued=(*jobs(1), *jobs(1, ("self-hosted", "b"))))
    every = {e.reading.pool_id for e in plan(cap(sched)).emits}
    assert every == {1, 2}
    by_name = plan(cap(sched, settings=CapacitySettings(pools=("zoomies-b",))))
    assert {e.reading.pool_id for e in by_name.emits} == {2}
    by_id = plan(cap(sched, settings=CapacitySettings(pools=("1",))))
    assert {e.reading.pool_id for e in by_id.emits} == {1}


def test_cap13_an_attempt_inside_the_cooldown_holds_the_next_whatever_its_outcome():
    """CAP-13: the planner sees only when the last attempt started, never how it ended."""
    sched = snapshot(pools=(pool(),), hosts=(), queued=jobs(1))
    last = LastAttempt(pool_id=1, type=CAPACITY_DEMAND, at=NOW - timedelta(minutes=4))
    result = plan(cap(sched, last_attempts=(last,)))
    assert result.emits == ()
    [held] = result.held
    assert held.until == NOW + timedelta(minutes=1) and "cooldown" in held.reason
    # Another event type for the same pool is not held by it.
    other = LastAttempt(pool_id=1, type=SCALE_DOWN_OPPORTUNITY, at=NOW)
    assert demand(plan(cap(sched, last_attempts=(other,))))
    later = replace(sched, now=NOW + timedelta(minutes=1))
    after = plan(
        CapacitySnapshot(
            now=later.now,
            scheduling=later,
            settings=CapacitySettings(cooldown=COOLDOWN),
            last_attempts=(last,),
        )
    )
    assert len(demand(after)) == 1


def test_cap16_the_reading_after_a_cooldown_is_the_same_shortfall_not_a_sum():
    """CAP-16: the planner knows nothing of what it asked before; the reading is the state."""
    sched = snapshot(
        pools=(pool(),),
        hosts=(host(capacity=2),),
        runners=(runner(state="busy"), runner(state="busy")),
        queued=jobs(3),
    )
    first = demand(plan(cap(sched)))[0].reading
    later = replace(sched, now=NOW + COOLDOWN)
    last = LastAttempt(pool_id=1, type=CAPACITY_DEMAND, at=NOW)
    second = demand(
        plan(
            CapacitySnapshot(
                now=later.now,
                scheduling=later,
                settings=CapacitySettings(cooldown=COOLDOWN),
                last_attempts=(last,),
            )
        )
    )[0].reading
    assert (second.required_runner_slots, second.current_capacity) == (
        first.required_runner_slots,
        first.current_capacity,
    )


def test_esc22_a_deferred_destination_holds_scale_ups_but_not_scale_downs():
    sched = snapshot(pools=(pool(),), hosts=(), queued=jobs(1))
    result = plan(
        cap(
            sched,
            scale_up_deferred_until=NOW + timedelta(seconds=30),
            scale_up_deferral_reason="1 consecutive provision failure",
        )
    )
    assert result.emits == () and "deferred" in result.held[0].reason


def idle_fleet(now=NOW):
    return snapshot(
        pools=(pool(),),
        hosts=(host(id=1, capacity=4), host(id=2, capacity=4)),
        runners=(runner(state="busy", host_id=1),),
        now=now,
    )


def test_cap07_excess_idle_capacity_starts_a_clock_and_is_not_yet_an_event():
    result = plan(cap(idle_fleet()))
    assert result.emits == ()
    [clock] = result.clocks
    assert isinstance(clock, SetExcessClock) and (clock.since, clock.slots) == (NOW, 7)


def test_cap07_scale_down_after_the_excess_stayed_visible_for_the_cooldown():
    """CAP-07/CAP-10: negative slots, the least excess seen, target = current + required."""
    clock = ExcessClock(pool_id=1, since=NOW - COOLDOWN, slots=6)
    result = plan(cap(idle_fleet(), excess_clocks=(clock,)))
    [event] = result.emits
    assert event.type == SCALE_DOWN_OPPORTUNITY
    r = event.reading
    assert (r.required_runner_slots, r.current_capacity) == (-6, 8)
    assert r.current_capacity + r.required_runner_slots == 2
    assert "advisory" in event.reason


def test_cap07_one_second_short_of_the_cooldown_is_no_event():
    clock = ExcessClock(pool_id=1, since=NOW - COOLDOWN + timedelta(seconds=1), slots=7)
    result = plan(cap(idle_fleet(), excess_clocks=(clock,)))
    assert result.emits == ()
    assert "scale-down opportunity once" in result.statuses[0].waiting_for


def test_cap07_a_break_in_the_excess_restarts_the_wait():
    """CAP-07: a pass with queued work and no idle slot clears the clock."""
    clock = ExcessClock(pool_id=1, since=NOW - COOLDOWN * 2, slots=7)
    busy = snapshot(
        pools=(pool(),),
        hosts=(host(id=1, capacity=1),),
        runners=(runner(state="busy", host_id=1),),
        queued=jobs(1),
    )
    result = plan(cap(busy, excess_clocks=(clock,)))
    assert not [e for e in result.emits if e.type == SCALE_DOWN_OPPORTUNITY]
    assert any(isinstance(c, ClearExcessClock) and c.pool_id == 1 for c in result.clocks)


def test_cap10_demand_is_positive_scale_down_negative():
    up = demand(plan(cap(snapshot(pools=(pool(),), hosts=(), queued=jobs(2)))))[0].reading
    clock = ExcessClock(pool_id=1, since=NOW - COOLDOWN, slots=7)
    down = plan(cap(idle_fleet(), excess_clocks=(clock,))).emits[0].reading
    assert up.required_runner_slots > 0 > down.required_runner_slots


def test_cap03_every_event_and_hold_carries_a_reason():
    sched = snapshot(pools=(pool(),), hosts=(), queued=jobs(1))
    result = plan(cap(sched))
    assert all(a.reason for a in result.actions())
    assert all(s.waiting_for for s in result.statuses)
