"""The slot share and the host reserve: pure arithmetic (BACK-04..07), no engine needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.agent.backends import resources
from fleet.agent.backends.resources import (
    FROM_HOST,
    FROM_POOL,
    Allocatable,
    Share,
    allocatable,
    allocation,
    cpu_reserve,
    floor_hundredth,
    slot_share,
)
from tests.purity import impurities


@pytest.mark.parametrize(
    ("machine", "reserve"),
    [(1, 0.5), (2, 0.5), (8, 0.5), (10, 0.5), (16, 0.8), (64, 3.2), (96, 4.8)],
)
def test_back07_the_cpu_reserve_is_half_a_core_or_a_twentieth_of_the_machine(machine, reserve):
    """BACK-07: whichever is larger; the allocatable machine excludes it."""
    assert cpu_reserve(machine) == pytest.approx(reserve)
    assert allocatable(machine, 1000).cpus == pytest.approx(max(0.0, machine - reserve))


def test_back07_an_operator_reserve_counts_only_above_the_floor():
    assert cpu_reserve(8, operator_reserve=2.0) == 2.0
    assert cpu_reserve(8, operator_reserve=0.1) == 0.5
    host = allocatable(8, 16_000, reserve_cpus=2.0, reserve_memory_mb=1_000)
    assert host == Allocatable(cpus=6.0, memory_mb=15_000)


def test_back06_a_cpu_share_is_floored_to_the_hundredth():
    """BACK-06: 1.5 cores over 4 slots is 0.37 (not 0.38); 7.5 over 3 stays 2.5."""
    assert slot_share(Allocatable(1.5, 4000), 4) == Share(cpus=0.37, memory_mb=1000)
    assert slot_share(Allocatable(7.5, 3001), 3) == Share(cpus=2.5, memory_mb=1000)
    # Binary noise must not cost a hundredth: 0.29 * 100 is 28.999999999999996.
    assert floor_hundredth(0.29) == 0.29
    assert slot_share(Allocatable(1.0, 100), 0) is None


@given(
    machine=st.integers(min_value=1, max_value=256),
    memory=st.integers(min_value=256, max_value=4_000_000),
    slots=st.integers(min_value=1, max_value=64),
)
def test_back06_back07_shares_never_add_up_past_the_allocatable_machine(machine, memory, slots):
    host = allocatable(machine, memory)
    share = slot_share(host, slots)
    assert share is not None
    assert share.cpus * slots <= host.cpus + 1e-9
    assert share.memory_mb * slots <= host.memory_mb
    # ...and the reserve stays free under them.
    assert machine - share.cpus * slots >= cpu_reserve(machine) - 1e-9
    # Floored, not rounded down by more than the hundredth it was floored to.
    assert host.cpus / slots - share.cpus < 0.01 + 1e-9


def test_back04_the_pool_figure_wins_and_an_unset_field_takes_the_slot_share():
    """BACK-04: each field on its own."""
    share = Share(cpus=0.75, memory_mb=2048)
    given_ = allocation(2.0, None, share)
    assert (given_.cpus, given_.cpus_from) == (2.0, FROM_POOL)
    assert (given_.memory_mb, given_.memory_from) == (2048, FROM_HOST)
    given_ = allocation(None, 512, share)
    assert (given_.cpus, given_.cpus_from, given_.memory_mb, given_.memory_from) == (
        0.75,
        FROM_HOST,
        512,
        FROM_POOL,
    )
    assert given_.nano_cpus == 750_000_000
    assert given_.memory_bytes == 512 * 1024 * 1024


def test_back05_a_share_only_where_the_engine_can_apply_it_and_the_host_has_a_size():
    """BACK-05: no share for a limit the engine cannot apply, nor without a share at all;
    a pool's own figure is still given (the engine refusing it is said at create)."""
    share = Share(cpus=1.0, memory_mb=1000)
    none_ = allocation(None, None, share, can_limit_cpus=False, can_limit_memory=False)
    assert (none_.cpus, none_.memory_mb, none_.cpus_from, none_.memory_from) == (
        None,
        None,
        None,
        None,
    )
    assert none_.nano_cpus is None and none_.memory_bytes is None
    assert allocation(None, None, None).cpus is None
    typed = allocation(1.25, 300, share, can_limit_cpus=False, can_limit_memory=False)
    assert (typed.cpus, typed.memory_mb) == (1.25, 300)


def test_back04_nano_cpus_are_exact_to_the_hundredth():
    for cpus in (0.01, 0.29, 0.37, 1.1, 2.57, 33.33):
        nano = allocation(cpus, None, None).nano_cpus
        assert nano == round(cpus * 100) * 10_000_000


def test_back07_the_share_module_is_pure_so_the_scheduler_can_use_it():
    """Only math and dataclasses: the scheduler's purity guard (SCHED-01) would accept it."""
    assert impurities(Path(resources.__file__), {"__future__", "math", "dataclasses"}) == []
