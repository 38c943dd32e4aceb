"""The controller's memory planner (HOST-24, HOST-25): what a host may lend and each
runner's bounds, from its rows and its last sample. Pure, so examples and properties."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fleet.memory_planner import (
    HostMemory,
    RunnerMemory,
    memory_ceiling,
    memory_floor,
    plan_memory_pool,
)
from fleet.protocol import DEFAULT_CEILING_FACTOR
from tests.purity import impurities

GB = 1024


def test_host25_guarantees_idle_charged_as_the_largest_one_start_held_back_and_the_floor():
    """16 GB machine, floor 819 MB (a twentieth); a busy 4 GB runner, two idle ones (2 GB
    and 3 GB: charged 3 GB together), a 1 GB queued start held back, 512 MB already lent."""
    host = HostMemory(
        machine_mb=16 * GB,
        runners=(
            RunnerMemory(1, "busy", 4 * GB, lent_mb=512),
            RunnerMemory(2, "idle", 2 * GB),
            RunnerMemory(3, "idle", 3 * GB),
            RunnerMemory(4, "busy", None),  # a process runner: no limit, no rule
        ),
        held_back_mb=1 * GB,
    )
    plan = plan_memory_pool(host)
    floor = 16 * GB // 20
    assert plan.rules.floor_mb == floor
    assert plan.rules.capacity_mb == 16 * GB - floor - (4 + 3 + 1) * GB - 512
    assert [r.runner_id for r in plan.rules.runners] == [1, 2, 3]
    assert plan.rules.rule_for(1).ceiling_mb == 6 * GB  # 1.5 x the guarantee
    assert "idle charged as one" in plan.reason and "held back" in plan.reason


def test_host25_what_the_host_measured_free_caps_the_loan_and_nothing_goes_negative():
    host = HostMemory(machine_mb=8 * GB, reserve_mb=1 * GB, free_mb=1500,
                      runners=(RunnerMemory(1, "busy", 2 * GB),))  # fmt: skip
    plan = plan_memory_pool(host)
    assert plan.rules.floor_mb == 1 * GB  # the operator's reserve, above a twentieth
    assert plan.rules.capacity_mb == 1500 - 1 * GB
    assert "measured free" in plan.reason
    starved = plan_memory_pool(HostMemory(machine_mb=8 * GB, free_mb=100))
    assert starved.rules.capacity_mb == 0


def test_host21_host25_the_default_ceiling_factor_and_floor_share_as_the_spec_gives_them():
    assert DEFAULT_CEILING_FACTOR == 1.5
    assert memory_floor(20_000) == 1000 and memory_floor(20_000, 4000) == 4000
    assert memory_ceiling(1000) == 1500 and memory_ceiling(1000, 0.5) == 1000  # never below


runners = st.lists(
    st.builds(
        RunnerMemory,
        runner_id=st.integers(1, 50),
        state=st.sampled_from(["idle", "busy", "provisioning", "registering", "draining"]),
        guarantee_mb=st.one_of(st.none(), st.integers(0, 8 * GB)),
        lent_mb=st.integers(0, 2 * GB),
    ),
    max_size=12,
    unique_by=lambda r: r.runner_id,
)


@given(
    machine=st.integers(512, 256 * GB),
    reserve=st.integers(0, 8 * GB),
    free=st.one_of(st.none(), st.integers(0, 256 * GB)),
    rows=runners,
    held=st.integers(0, 8 * GB),
)
def test_host25_property_never_lends_into_the_floor_nor_past_free_nor_below_zero(
    machine, reserve, free, rows, held
):
    plan = plan_memory_pool(HostMemory(machine, reserve, free, tuple(rows), held))
    rules = plan.rules
    assert rules.capacity_mb >= 0
    assert rules.floor_mb >= machine // 20 and rules.floor_mb >= reserve
    charged = sum(r.guarantee_mb or 0 for r in rows if r.state != "idle")
    charged += max((r.guarantee_mb or 0 for r in rows if r.state == "idle"), default=0)
    assert rules.capacity_mb <= max(0, machine - rules.floor_mb - charged - held)
    if free is not None:
        assert rules.capacity_mb <= max(0, free - rules.floor_mb)
    for rule in rules.runners:
        assert rule.guarantee_mb > 0 and rule.ceiling_mb >= rule.guarantee_mb
    # One more idle runner no larger than the largest idle one changes nothing.
    idle = [r.guarantee_mb for r in rows if r.state == "idle" and r.guarantee_mb]
    if idle:
        more = (*rows, RunnerMemory(99, "idle", min(idle)))
        assert plan_memory_pool(
            HostMemory(machine, reserve, free, more, held)
        ).rules.capacity_mb == (rules.capacity_mb)


def test_the_planner_is_pure():
    """No clock, no ORM, no network: standard library and the protocol's rules only."""
    allowed = {"__future__", "collections.abc", "dataclasses", "fleet.protocol"}
    assert impurities(Path("fleet/memory_planner.py"), allowed) == []
