"""The machine planner (fleet/machine_planner.py): pure, inside every limit, never drains a
machine with a live runner, and takes a drain back before it rents anew (MACH-13, 14, 15)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet import machine_planner
from fleet.machine_planner import (
    COUNTED,
    MachineSnapshot,
    MachineView,
    PoolDemand,
    ProviderView,
    plan_machines,
)
from tests.purity import impurities

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
IDLE = timedelta(minutes=10)
STATES = sorted(COUNTED | {"failed", "deleted"})


def provider(name="pve", pools=("linux",), max_machines=4, max_per_pool=3, slots=2, **kw):
    return ProviderView(name, frozenset(pools), max_machines, max_per_pool, slots, **kw)


def snapshot(providers=(), machines=(), demand=(), max_total=10):
    return MachineSnapshot(NOW, tuple(providers), tuple(machines), tuple(demand), IDLE, max_total)


def test_pure_no_django_no_clock_no_io():
    """The planner takes a snapshot and returns a plan: imports of plain Python only, and no
    clock read (the property tests below would not be repeatable otherwise)."""
    allowed = {"__future__", "collections", "dataclasses", "datetime"}
    assert impurities(Path(machine_planner.__file__), allowed) == []


def test_mach15_demand_rents_machines_up_to_the_per_pool_limit_and_says_what_is_left():
    plan = plan_machines(
        snapshot([provider(max_per_pool=2)], demand=[PoolDemand(1, "linux", 7, "7 jobs wait")])
    )
    assert [(p.provider, p.pool_id) for p in plan.plans] == [("pve", 1), ("pve", 1)]
    assert "a machine from pve for linux: 7 jobs wait" == plan.plans[0].reason
    (unmet,) = plan.unmet
    assert unmet.runners == 3 and "has its 2 machines for linux" in unmet.reason


def test_machines_on_their_way_cover_demand_first():
    on_the_way = [MachineView(1, "pve", 1, "creating"), MachineView(2, "pve", 1, "enrolling")]
    plan = plan_machines(
        snapshot([provider()], on_the_way, [PoolDemand(1, "linux", 4, "4 jobs wait")])
    )
    assert plan.plans == () and plan.unmet == ()


def test_mach13_returning_demand_cancels_a_drain_instead_of_renting():
    draining = MachineView(7, "pve", 1, "draining")
    plan = plan_machines(
        snapshot([provider()], [draining], [PoolDemand(1, "linux", 2, "2 jobs wait")])
    )
    assert [c.machine_id for c in plan.cancels] == [7]
    assert plan.plans == ()
    assert "demand returned to linux" in plan.cancels[0].reason


def test_mach14_an_idle_machine_drains_after_the_idle_timeout_and_not_before():
    machines = [
        MachineView(1, "pve", 1, "ready", live_runners=0, idle_since=NOW - IDLE),
        MachineView(2, "pve", 1, "ready", live_runners=0, idle_since=NOW - IDLE / 2),
        MachineView(3, "pve", 1, "ready", live_runners=1, idle_since=None),
    ]
    plan = plan_machines(snapshot([provider()], machines))
    assert [d.machine_id for d in plan.drains] == [1]
    assert "machines.idle_timeout 10 min" in plan.drains[0].reason


def test_a_provider_that_is_down_or_serves_other_pools_rents_nothing():
    plan = plan_machines(
        snapshot(
            [provider("a", down=True), provider("b", pools=("windows",))],
            demand=[PoolDemand(1, "linux", 1, "1 job waits")],
        )
    )
    assert plan.plans == () and "a is down" in plan.unmet[0].reason


views = st.builds(
    MachineView,
    id=st.integers(1, 40),
    provider=st.sampled_from(["a", "b"]),
    pool_id=st.sampled_from([1, 2, None]),
    state=st.sampled_from(STATES),
    live_runners=st.integers(0, 3),
    idle_since=st.one_of(st.none(), st.integers(0, 60).map(lambda m: NOW - timedelta(minutes=m))),
)
providers = st.lists(
    st.builds(
        ProviderView,
        name=st.sampled_from(["a", "b"]),
        pools=st.sets(st.sampled_from(["p1", "p2"])).map(frozenset),
        max_machines=st.integers(0, 5),
        max_per_pool=st.integers(0, 4),
        slots_per_machine=st.integers(1, 4),
        enabled=st.booleans(),
        down=st.booleans(),
    ),
    max_size=2,
    unique_by=lambda p: p.name,
)
demands = st.lists(
    st.builds(
        PoolDemand,
        pool_id=st.sampled_from([1, 2]),
        pool_name=st.sampled_from(["p1", "p2"]),
        runners=st.integers(0, 12),
        why=st.just("jobs wait"),
    ),
    max_size=2,
    unique_by=lambda d: d.pool_id,
)


@settings(max_examples=300, deadline=None)
@given(
    provs=providers,
    machines=st.lists(views, max_size=12, unique_by=lambda m: m.id),
    demand=demands,
    max_total=st.integers(0, 8),
)
def test_mach15_property_never_above_a_limit_never_drains_a_busy_machine(
    provs, machines, demand, max_total
):
    snap = snapshot(provs, machines, demand, max_total)
    plan = plan_machines(snap)
    counted = [m for m in machines if m.state in COUNTED]
    by_name = {p.name: p for p in provs}
    # Never above a limit: every new machine fit the total, its provider's and its pool's.
    if plan.plans:
        assert len(counted) + len(plan.plans) <= max_total
    per_provider = Counter(m.provider for m in counted)
    per_pool = Counter((m.provider, m.pool_id) for m in counted)
    for new in plan.plans:
        chosen = by_name[new.provider]
        assert chosen.enabled and not chosen.down
        per_provider[new.provider] += 1
        per_pool[(new.provider, new.pool_id)] += 1
        assert per_provider[new.provider] <= chosen.max_machines
        assert per_pool[(new.provider, new.pool_id)] <= chosen.max_per_pool
    # Never drains a machine with a live runner, nor one not ready.
    states = {m.id: m for m in machines}
    for drain in plan.drains:
        assert states[drain.machine_id].live_runners == 0
        assert states[drain.machine_id].state == "ready"
    # A drain is taken back before anything new is rented for the same pool's demand.
    for cancel in plan.cancels:
        assert states[cancel.machine_id].state == "draining"
    if plan.plans:
        served = {p.provider for p in plan.plans}
        assert not [
            m
            for m in machines
            if m.state == "draining"
            and m.provider in served
            and m.id not in {c.machine_id for c in plan.cancels}
        ]
    # Running it again on the same snapshot gives the same plan.
    assert plan_machines(snap) == plan
