"""Example tests for `decide`, one or more per SCHED rule, named by its id."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from runners.naming import LINUX_RUNNER_IMAGE
from runners.scheduler import (
    Plan,
    SchedulerSettings,
    backoff_wait,
    decide,
)

from .builders import NOW, apply_plan, host, job, jobs, pool, runner, snapshot


def hosts_of(plan: Plan) -> list[int]:
    return [c.host_id for c in plan.creates]


# SCHED-02/03: reasons, and nothing but the snapshot.


def test_sched03_a_single_create_says_why_in_the_spec_words() -> None:
    plan = decide(snapshot((pool(),), (host(),), queued=jobs(1)))
    assert [c.reason for c in plan.creates] == ["create 1 in zoomies-linux-x64: 1 job queued"]


def test_sched03_several_creates_of_one_pool_share_one_sentence() -> None:
    plan = decide(snapshot((pool(warm=1),), (host(),), queued=jobs(2)))
    assert {c.reason for c in plan.creates} == {
        "create 3 in zoomies-linux-x64: 2 jobs queued, warm 1"
    }


def test_sched03_every_action_has_a_reason_and_a_placement() -> None:
    snap = snapshot(
        (
            pool(1, warm=1, idle_timeout=timedelta(minutes=5)),
            pool(2, "zoomies-arm", platform="linux/arm64"),
        ),
        (host(),),
        runners=(
            runner(state="provisioning", age=timedelta(minutes=30)),
            runner(state="idle", age=timedelta(hours=1)),
            runner(pool_id=1, state="failed", finished_ago=timedelta(minutes=20)),
        ),
        queued=(*jobs(2), job(labels=("self-hosted", "arm64"))),
    )
    plan = decide(snap)
    assert plan.fails and plan.drains and plan.demand and plan.waits
    for action in plan.actions():
        assert action.reason and action.reason[0].isalnum(), action
    assert plan.creates == ()  # The timed-out start holds the pool in backoff.


def test_sched02_decide_is_a_function_of_the_snapshot() -> None:
    snap = snapshot((pool(warm=1),), (host(1), host(2)), queued=jobs(3))
    assert decide(snap) == decide(snap)


# SCHED-05: where a runner may go.


@pytest.mark.parametrize(
    "bad_host",
    [
        host(2, healthy=False),
        host(2, cordoned=True),
        host(2, pressure_hold=True),
        host(2, backends=("podman",)),
        host(2, platform="linux/arm64"),
        host(2, labels=(("gpu", "t4"),)),
        host(2, capacity=0),
    ],
    ids=["unhealthy", "cordoned", "pressure", "backend", "platform", "selector", "no-slots"],
)
def test_sched05_a_runner_is_placed_only_on_an_eligible_host(bad_host) -> None:  # type: ignore[no-untyped-def]
    gpu_pool = pool(host_selector=(("gpu", "a100"),))
    good = host(1, labels=(("gpu", "a100"),), capacity=1)
    bad = bad_host if bad_host.labels else replace(bad_host, labels=(("gpu", "a100"),))
    plan = decide(snapshot((gpu_pool,), (bad, good), queued=jobs(3)))
    assert hosts_of(plan) == [1]
    assert plan.blocked and "wait for room" in plan.blocked[0].reason


def test_sched05_a_full_host_takes_nothing() -> None:
    rows = tuple(runner(state="busy") for _ in range(4))
    plan = decide(snapshot((pool(),), (host(capacity=4),), runners=rows, queued=jobs(1)))
    assert plan.creates == ()
    assert plan.demand == ()  # Waiting for room is not scale-from-zero.
    assert "zoomies-host-1 full (4/4 slots)" in plan.blocked[0].reason


# SCHED-06: no platform constrains nothing.


def test_sched06_a_pool_without_a_platform_runs_on_any_platform() -> None:
    anywhere = pool(platform=None, labels=("build",))
    plan = decide(
        snapshot((anywhere,), (host(platform="linux/arm64"),), queued=jobs(1, ("build",)))
    )
    assert hosts_of(plan) == [1]


def test_sched06_a_host_without_a_platform_takes_any_pool() -> None:
    plan = decide(
        snapshot(
            (pool(platform="linux/arm64"),), (host(platform=None),), queued=jobs(1, ("arm64",))
        )
    )
    assert hosts_of(plan) == [1]


# SCHED-07: the most headroom after placement.


def test_sched07_the_host_with_most_headroom_after_placement_wins() -> None:
    sized = pool(cpus=1.0, memory_mb=1024)
    big_but_busy = host(1, capacity=8, cpus=8.0, memory_mb=8192)
    small_and_empty = host(2, capacity=8, cpus=4.0, memory_mb=4096)
    busy = tuple(runner(host_id=1, state="busy", cpus=2.0, memory_mb=2048) for _ in range(3))
    # Host 1 after: 2/8 + 2048/8192 = 0.5; host 2 after: 3/4 + 3072/4096 = 1.5.
    plan = decide(snapshot((sized,), (big_but_busy, small_and_empty), runners=busy, queued=jobs(1)))
    assert hosts_of(plan) == [2]
    assert "zoomies-host-2" in plan.creates[0].placement


def test_sched07_a_burst_spreads_over_equal_hosts_and_ties_go_to_the_lowest_id() -> None:
    plan = decide(snapshot((pool(),), (host(3), host(2)), queued=jobs(3)))
    assert hosts_of(plan) == [2, 3, 2]


def test_sched07_unmeasured_hosts_are_ranked_by_free_slots() -> None:
    rows = (runner(host_id=1, state="busy"),)
    plan = decide(
        snapshot(
            (pool(),), (host(1, capacity=4), host(2, capacity=4)), runners=rows, queued=jobs(1)
        )
    )
    assert hosts_of(plan) == [2]


# SCHED-08: one budget across pools.


def test_sched08_two_pools_never_over_fill_one_host_together() -> None:
    a = pool(1, "zoomies-a", labels=("a",), cpus=2.0)
    b = pool(2, "zoomies-b", labels=("b",), cpus=2.0)
    shared = host(capacity=10, cpus=5.0)
    plan = decide(snapshot((a, b), (shared,), queued=(*jobs(2, ("a",)), *jobs(2, ("b",)))))
    assert sum(c.cpus or 0 for c in plan.creates) <= 5.0
    assert [c.pool_id for c in plan.creates] == [1, 1]  # Pools go in name order.
    assert plan.blocked[-1].pool_id == 2


def test_sched08_pending_runners_hold_their_reservation() -> None:
    pending = (runner(state="provisioning", pool_id=9, cpus=3.0),)
    plan = decide(
        snapshot((pool(cpus=2.0),), (host(capacity=10, cpus=4.0),), runners=pending, queued=jobs(1))
    )
    assert plan.creates == ()


# SCHED-09: capacity from rows.


def test_sched09_every_live_row_holds_a_slot_and_failed_or_removed_rows_do_not() -> None:
    rows = (
        runner(pool_id=9, state="busy"),
        runner(pool_id=9, state="draining"),
        runner(pool_id=9, state="failed", finished_ago=timedelta(hours=1)),
        runner(pool_id=9, state="removed"),
        runner(pool_id=9, host_id=None, state="provisioning"),  # Not placed anywhere.
        runner(pool_id=9, host_id=77, state="busy"),  # On a host not in the snapshot.
    )
    plan = decide(snapshot((pool(),), (host(capacity=4),), runners=rows, queued=jobs(5)))
    assert len(plan.creates) == 2


def test_sched09_a_silent_hosts_rows_count_until_they_are_failed() -> None:
    # Rows left on a host that went quiet and came back still hold their slots.
    rows = tuple(runner(pool_id=9, state="busy", age=timedelta(hours=3)) for _ in range(3))
    plan = decide(snapshot((pool(),), (host(capacity=4),), runners=rows, queued=jobs(3)))
    assert len(plan.creates) == 1


# SCHED-10/11/12: what a runner is charged.


def test_sched10_pools_without_limits_admit_exactly_the_slot_count() -> None:
    plan = decide(
        snapshot((pool(),), (host(capacity=4, cpus=8.0, memory_mb=16000),), queued=jobs(6))
    )
    assert len(plan.creates) == 4
    assert {(c.cpus, c.memory_mb) for c in plan.creates} == {(2.0, 4000)}


def test_sched10_the_cpu_share_is_floored_so_shares_never_exceed_the_machine() -> None:
    plan = decide(
        snapshot((pool(),), (host(capacity=3, cpus=1.0, memory_mb=1000),), queued=jobs(3))
    )
    assert len(plan.creates) == 3
    assert {(c.cpus, c.memory_mb) for c in plan.creates} == {(0.33, 333)}


def test_sched10_a_typed_figure_is_charged_as_typed() -> None:
    plan = decide(snapshot((pool(cpus=3.0),), (host(capacity=10, cpus=8.0),), queued=jobs(5)))
    assert [c.cpus for c in plan.creates] == [3.0, 3.0]


def test_sched10_a_typed_memory_figure_limits_placement() -> None:
    plan = decide(
        snapshot((pool(memory_mb=3000),), (host(capacity=10, memory_mb=8000),), queued=jobs(5))
    )
    assert [c.memory_mb for c in plan.creates] == [3000, 3000]


def test_sched10_a_host_that_reported_no_size_is_limited_by_slots_only() -> None:
    plan = decide(snapshot((pool(cpus=64.0),), (host(capacity=2),), queued=jobs(5)))
    assert [c.cpus for c in plan.creates] == [64.0, 64.0]


def test_sched11_dind_with_a_typed_figure_is_charged_twice() -> None:
    plan = decide(
        snapshot((pool(cpus=2.0, dind=True),), (host(capacity=10, cpus=8.0),), queued=jobs(5))
    )
    assert [c.cpus for c in plan.creates] == [4.0, 4.0]


def test_sched11_dind_on_a_slot_share_is_charged_one_share() -> None:
    plan = decide(
        snapshot((pool(dind=True),), (host(capacity=4, cpus=8.0, memory_mb=8000),), queued=jobs(5))
    )
    assert [(c.cpus, c.memory_mb) for c in plan.creates] == [(2.0, 2000)] * 4


def test_sched12_live_runners_are_charged_what_their_row_says() -> None:
    rows = (runner(state="busy", cpus=6.0, memory_mb=100),)
    plan = decide(
        snapshot((pool(cpus=3.0),), (host(capacity=10, cpus=8.0),), runners=rows, queued=jobs(1))
    )
    assert plan.creates == ()
    assert "short of CPU" in plan.blocked[0].reason


def test_sched12_a_row_without_a_charge_is_charged_by_its_pools_rule() -> None:
    rows = (runner(state="busy", dind=True),)  # pool 1 types 2 CPUs: the pair costs 4.
    plan = decide(
        snapshot((pool(cpus=2.0),), (host(capacity=10, cpus=8.0),), runners=rows, queued=jobs(5))
    )
    assert len(plan.creates) == 2


# SCHED-13: the image.


def test_sched13_the_pools_own_image_wins() -> None:
    plan = decide(snapshot((pool(image="registry.local/runner:7"),), (host(),), queued=jobs(1)))
    assert plan.creates[0].image == "registry.local/runner:7"


def test_sched13_otherwise_the_catalogue_image_for_the_platform() -> None:
    plan = decide(snapshot((pool(),), (host(),), queued=jobs(1)))
    assert plan.creates[0].image == LINUX_RUNNER_IMAGE
    process = pool(backend="process", platform="macos/arm64")
    mac = host(backends=("process",), platform="macos/arm64")
    plan = decide(snapshot((process,), (mac,), queued=jobs(1, ("macos",))))
    assert plan.creates[0].image == "actions-runner"


@pytest.mark.parametrize(
    "image,runs",
    [
        ("", "ghcr.io/zoomies/runner:latest-docker"),
        ("ghcr.io/zoomies/runner:0.1.0", "ghcr.io/zoomies/runner:0.1.0-docker"),
        ("ghcr.io/zoomies/runner:0.0.9", "ghcr.io/zoomies/runner:0.0.9"),
        ("registry.local/runner:7", "registry.local/runner:7"),
    ],
)
def test_back16_back17_a_docker_pools_runner_runs_the_docker_variant_where_it_is_known(
    image: str, runs: str
) -> None:
    """BACK-16: a pool that provides Docker on a stock tag of this build (the catalogue's
    included) runs that tag's Docker variant; BACK-17: another build's pin or another
    image is left as it is. A pool without Docker keeps the stock tag."""
    plan = decide(snapshot((pool(image=image, dind=True),), (host(),), queued=jobs(1)))
    assert plan.creates[0].image == runs
    plan = decide(snapshot((pool(image=image),), (host(),), queued=jobs(1)))
    assert plan.creates[0].image == (image or LINUX_RUNNER_IMAGE)


def test_sched13_a_pool_the_catalogue_cannot_serve_is_reported_not_created() -> None:
    mac = pool(backend="docker", platform="macos/arm64")
    plan = decide(snapshot((mac,), (host(platform="macos/arm64"),), queued=jobs(1, ("macos",))))
    assert plan.creates == ()
    assert "set the pool's image" in plan.blocked[0].reason


# SCHED-17: the provision timeout.


@pytest.mark.parametrize(
    "state,age,fails",
    [
        ("provisioning", timedelta(minutes=20), True),
        ("registering", timedelta(minutes=21), True),
        ("provisioning", timedelta(minutes=19, seconds=59), False),
        ("idle", timedelta(hours=5), False),
        ("busy", timedelta(hours=5), False),
        ("draining", timedelta(hours=5), False),
    ],
)
def test_sched17_a_runner_not_online_in_time_is_failed(
    state: str, age: timedelta, fails: bool
) -> None:
    row = runner(7, state=state, age=age, in_state=timedelta(seconds=1))
    plan = decide(snapshot((pool(),), (host(),), runners=(row,)))
    assert [f.runner_id for f in plan.fails] == ([7] if fails else [])
    if fails:
        assert plan.fails[0].reason == (
            "runner 7 in zoomies-linux-x64 not online 20m after it was created "
            f"(scheduler.provision_timeout); it was still {state}"
        )


def test_sched17_the_timeout_is_a_setting() -> None:
    row = runner(7, state="registering", age=timedelta(minutes=6))
    settings = SchedulerSettings(provision_timeout=timedelta(minutes=5))
    plan = decide(snapshot((pool(),), (host(),), runners=(row,), settings=settings))
    assert [f.runner_id for f in plan.fails] == [7]


def test_sched17_a_timed_out_start_frees_its_slot_and_starts_the_backoff() -> None:
    stuck = runner(7, state="provisioning", age=timedelta(minutes=25))
    plan = decide(snapshot((pool(),), (host(capacity=1),), runners=(stuck,), queued=jobs(1)))
    assert [f.runner_id for f in plan.fails] == [7]
    assert plan.creates == ()
    assert [w.until for w in plan.waits] == [NOW + timedelta(seconds=10)]


# SCHED-19/20/21: idle runners retire, busy ones are left alone.


def test_sched19_max_lifetime_retires_an_idle_runner() -> None:
    old = runner(5, state="idle", age=timedelta(hours=7), in_state=timedelta(minutes=1))
    settings = SchedulerSettings(max_runner_lifetime=timedelta(hours=6))
    plan = decide(snapshot((pool(),), (host(),), runners=(old,), settings=settings))
    assert [d.runner_id for d in plan.drains] == [5]
    assert "scheduler.max_runner_lifetime" in plan.drains[0].reason


def test_sched19_max_lifetime_waits_for_a_runner_that_is_starting() -> None:
    rows = (runner(5, state="registering", age=timedelta(minutes=10)),)
    settings = SchedulerSettings(max_runner_lifetime=timedelta(minutes=5))
    assert decide(snapshot((pool(),), (host(),), runners=rows, settings=settings)).drains == ()


def test_sched20_nothing_touches_a_busy_runner() -> None:
    rows = tuple(runner(i, state="busy", age=timedelta(days=3)) for i in (1, 2))
    settings = SchedulerSettings(
        max_runner_lifetime=timedelta(minutes=1), default_idle_timeout=timedelta(seconds=1)
    )
    plan = decide(
        snapshot(
            (pool(idle_timeout=timedelta(seconds=1)),), (host(),), runners=rows, settings=settings
        )
    )
    assert plan.fails == () and plan.drains == ()


def test_sched21_the_idle_timeout_counts_from_entering_idle() -> None:
    rows = (
        runner(1, state="idle", age=timedelta(hours=2), in_state=timedelta(minutes=11)),
        runner(2, state="idle", age=timedelta(hours=2), in_state=timedelta(minutes=9)),
    )
    plan = decide(snapshot((pool(idle_timeout=timedelta(minutes=10)),), (host(),), runners=rows))
    assert [d.runner_id for d in plan.drains] == [1]
    assert "idle for 11m, past the idle timeout of 10m" in plan.drains[0].reason


def test_sched21_the_default_idle_timeout_applies_to_pools_without_one() -> None:
    rows = (runner(1, state="idle", in_state=timedelta(minutes=31)),)
    settings = SchedulerSettings(default_idle_timeout=timedelta(minutes=30))
    assert [
        d.runner_id
        for d in decide(snapshot((pool(),), (host(),), runners=rows, settings=settings)).drains
    ] == [1]
    # No default idle timeout: the idle timeout drains nothing (the surplus rule, issue 21
    # item 18, is off here to judge the idle timeout alone).
    alone = SchedulerSettings(surplus_idle_timeout=None)
    assert decide(snapshot((pool(),), (host(),), runners=rows, settings=alone)).drains == ()


def test_sched21_a_drained_warm_runner_is_replaced() -> None:
    rows = (runner(1, state="idle", in_state=timedelta(minutes=11)),)
    plan = decide(
        snapshot((pool(warm=1, idle_timeout=timedelta(minutes=10)),), (host(),), runners=rows)
    )
    assert [d.runner_id for d in plan.drains] == [1]
    assert len(plan.creates) == 1


# SCHED-22: the start backoff.


def test_sched22_backoff_doubles_and_caps() -> None:
    s = SchedulerSettings()
    assert [backoff_wait(n, s).total_seconds() for n in range(1, 8)] == [
        10,
        20,
        40,
        80,
        160,
        300,
        300,
    ]
    short = SchedulerSettings(failed_retention=timedelta(minutes=2))
    assert backoff_wait(10, short) == timedelta(minutes=2)
    assert backoff_wait(10**6, s) == timedelta(minutes=5)  # No overflow.


@pytest.mark.parametrize(
    "finished_agos,waits_until",
    [
        ([timedelta(seconds=5)], NOW + timedelta(seconds=5)),
        ([timedelta(seconds=11)], None),
        ([timedelta(seconds=15), timedelta(seconds=30)], NOW + timedelta(seconds=5)),
        ([timedelta(seconds=25), timedelta(seconds=30)], None),
        ([timedelta(minutes=1)] * 4, NOW + timedelta(seconds=20)),
        ([timedelta(minutes=11)] * 5, None),  # Outside the retention: forgotten.
    ],
)
def test_sched22_the_wait_counts_from_the_latest_failure(finished_agos, waits_until) -> None:  # type: ignore[no-untyped-def]
    rows = tuple(runner(state="failed", finished_ago=ago) for ago in finished_agos)
    plan = decide(snapshot((pool(),), (host(),), runners=rows, queued=jobs(1)))
    if waits_until is None:
        assert plan.waits == () and len(plan.creates) == 1
    else:
        assert plan.creates == ()
        assert [(w.pool_id, w.until) for w in plan.waits] == [(1, waits_until)]
        assert "scheduler.start_backoff" in plan.waits[0].reason


def test_sched22_the_backoff_is_per_pool() -> None:
    a, b = pool(1, "zoomies-a", labels=("a",)), pool(2, "zoomies-b", labels=("b",))
    rows = (runner(pool_id=1, state="failed", finished_ago=timedelta(seconds=1)),)
    plan = decide(
        snapshot((a, b), (host(),), runners=rows, queued=(*jobs(1, ("a",)), *jobs(1, ("b",))))
    )
    assert [c.pool_id for c in plan.creates] == [2]
    assert [w.pool_id for w in plan.waits] == [1]


def test_sched22_a_runner_that_came_online_and_then_failed_is_no_failed_start() -> None:
    """Four busy runners failed when their host joined again (the kill drill): counted as
    failed starts, they held the pool's every start for 80 s on a fleet that was fine."""
    gone = tuple(
        runner(state="failed", finished_ago=timedelta(seconds=1), came_online=True)
        for _ in range(4)
    )
    plan = decide(snapshot((pool(),), (host(),), runners=gone, queued=jobs(2)))
    assert plan.waits == () and len(plan.creates) == 2
    # One that never came online among them is a failed start, and alone it waits 10 s.
    never = runner(state="failed", finished_ago=timedelta(seconds=1))
    plan = decide(snapshot((pool(),), (host(),), runners=(*gone, never), queued=jobs(2)))
    assert plan.creates == () and [w.until for w in plan.waits] == [NOW + timedelta(seconds=9)]
    assert "1 failed start " in plan.waits[0].reason


# SCHED-23/24/25: pause, cap, warm.


def test_sched23_a_paused_pool_gets_no_runners() -> None:
    plan = decide(snapshot((pool(paused=True, warm=2),), (host(),), queued=jobs(3)))
    assert plan.creates == () and plan.demand == ()
    assert "paused" in plan.blocked[0].reason


def test_sched24_a_pool_never_exceeds_its_cap() -> None:
    rows = (
        runner(state="busy"),
        runner(state="draining"),
        runner(state="failed", finished_ago=timedelta(hours=1)),
    )
    plan = decide(
        snapshot((pool(max_runners=3),), (host(capacity=10),), runners=rows, queued=jobs(5))
    )
    assert len(plan.creates) == 1
    assert "capped at 3 runners" in plan.creates[0].reason
    assert "cap of 3" in plan.blocked[0].reason


def test_sched24_demand_is_jobs_less_runners_that_can_still_take_one() -> None:
    rows = (
        runner(state="provisioning"),
        runner(state="registering"),
        runner(state="busy"),
        runner(state="draining"),
    )
    plan = decide(snapshot((pool(),), (host(capacity=10),), runners=rows, queued=jobs(3)))
    assert len(plan.creates) == 1
    assert plan.creates[0].reason == (
        "create 1 in zoomies-linux-x64: 3 jobs queued, 2 already idle or starting"
    )


@pytest.mark.parametrize(
    "warm,idle,max_runners,creates",
    [(2, 0, 10, 2), (2, 1, 10, 1), (2, 2, 10, 0), (2, 3, 10, 0), (5, 0, 3, 3)],
)
def test_sched25_a_pool_keeps_its_warm_count_within_its_cap(
    warm: int, idle: int, max_runners: int, creates: int
) -> None:
    rows = tuple(runner(state="idle") for _ in range(idle))
    plan = decide(
        snapshot((pool(warm=warm, max_runners=max_runners),), (host(capacity=10),), runners=rows)
    )
    assert len(plan.creates) == creates


# SCHED-26: scale from zero.


def test_sched26_demand_no_host_could_run_is_reported_with_what_is_missing() -> None:
    gpu = pool(1, "zoomies-gpu", platform="linux/arm64", host_selector=(("gpu", "a100"),))
    plan = decide(snapshot((gpu,), (host(),), queued=jobs(2, ("arm64",))))
    assert plan.creates == ()
    (scale,) = plan.demand
    assert (scale.pool_id, scale.count) == (1, 2)
    assert scale.missing == "no host offers backend docker on linux/arm64 with labels gpu=a100"
    assert scale.reason == (
        "2 runners wanted in zoomies-gpu (2 jobs queued), but no host offers backend docker "
        "on linux/arm64 with labels gpu=a100"
    )


def test_sched26_an_empty_fleet_is_scale_from_zero() -> None:
    plan = decide(snapshot((pool(),), (), queued=jobs(1)))
    assert [(d.count, d.missing) for d in plan.demand] == [
        (1, "no host offers backend docker on linux/x64")
    ]


def test_sched26_a_host_too_small_for_one_runner_is_no_host() -> None:
    plan = decide(snapshot((pool(cpus=16.0),), (host(cpus=8.0),), queued=jobs(1)))
    assert plan.demand[0].missing == (
        "no host offering backend docker on linux/x64 has room for one runner (16 CPUs)"
    )


@pytest.mark.parametrize(
    "the_host",
    [host(capacity=1), host(healthy=False), host(cordoned=True), host(pressure_hold=True)],
    ids=["full", "unhealthy", "cordoned", "pressure"],
)
def test_sched26_demand_blocked_only_by_room_or_health_is_not_scale_from_zero(the_host) -> None:  # type: ignore[no-untyped-def]
    rows = (runner(pool_id=9, host_id=1, state="busy"),)
    plan = decide(snapshot((pool(),), (the_host,), runners=rows, queued=jobs(1)))
    assert plan.creates == () and plan.demand == ()
    assert plan.blocked


def test_sched26_a_warm_count_alone_rents_no_machine() -> None:
    plan = decide(snapshot((pool(warm=2),), ()))
    assert plan.demand == ()
    assert "2 warm runners wanted" in plan.blocked[0].reason


def test_sched26_a_paused_pool_asks_for_no_machine() -> None:
    assert decide(snapshot((pool(paused=True),), (), queued=jobs(1))).demand == ()


# SCHED-28: deciding again after applying plans no further creates.


def test_sched28_deciding_again_after_applying_plans_no_creates() -> None:
    snap = snapshot(
        (pool(1, "zoomies-a", warm=1, cpus=1.0), pool(2, "zoomies-b", labels=("b",))),
        (host(1, capacity=3, cpus=4.0), host(2, capacity=2)),
        runners=(runner(state="provisioning", age=timedelta(hours=1)),),
        queued=(*jobs(4), *jobs(3, ("b",))),
    )
    first = decide(snap)
    assert first.creates
    second = decide(apply_plan(snap, first))
    assert second.creates == ()
    assert second.fails == () and second.drains == ()


def test_issue21_item18_a_surplus_idle_runner_is_drained_by_default_and_warm_ones_stay():
    """Runners created for jobs GitHub had already finished stayed idle for good with the
    default idle timeout (never): beyond the pool's warm count and its queued jobs, an idle
    runner is drained after scheduler.surplus_idle_timeout, the longest idle first."""
    p = pool(warm=1)
    idle = [
        runner(1, in_state=timedelta(minutes=30)),
        runner(2, in_state=timedelta(minutes=20)),
        runner(3, in_state=timedelta(minutes=5)),
    ]
    plan = decide(snapshot(pools=[p], hosts=[host()], runners=idle))
    # Three idle, one warm wanted: the two longest idle are surplus, both past 10 min.
    assert [d.runner_id for d in plan.drains] == [1, 2]
    assert "scheduler.surplus_idle_timeout" in plan.drains[0].reason
    # A queued job stands for one more idle runner: one fewer is surplus.
    plan = decide(snapshot(pools=[p], hosts=[host()], runners=idle, queued=jobs(1)))
    assert [d.runner_id for d in plan.drains] == [1]
    # Off when set to None; and a busy runner is never touched (SCHED-20).
    off = SchedulerSettings(surplus_idle_timeout=None)
    assert decide(snapshot(pools=[p], hosts=[host()], runners=idle, settings=off)).drains == ()
    busy = [runner(4, state="busy", in_state=timedelta(hours=2))]
    assert decide(snapshot(pools=[pool()], hosts=[host()], runners=busy)).drains == ()
