"""The agent's memory valve on a moved clock (HOST-26, 27, 28, 30, 31) and the sampler that
feeds it (HOST-12). The valve against a real engine is in tests/fleet/backends."""

from __future__ import annotations

import threading
import time

import pytest

from fleet.agent.memory_valve import (
    CALM_EVERY,
    HOT_EVERY,
    MemoryUse,
    MemoryValve,
    check_every,
    plan_raise,
)
from fleet.agent.sampling import RunnerSampler
from fleet.protocol import MemoryRules, RunnerMemoryRule

RULE = RunnerMemoryRule(runner_id=1, guarantee_mb=1000, ceiling_mb=1500)
RULES = MemoryRules(capacity_mb=4000, floor_mb=500, runners=(RULE,))


def test_host26_a_container_is_looked_at_every_second_while_hot_else_every_five():
    assert check_every(MemoryUse(700, 1000), 0.0) == HOT_EVERY  # 70 % of its limit
    assert check_every(MemoryUse(690, 1000), 0.0) == CALM_EVERY
    assert check_every(MemoryUse(500, 1000), 50.0) == HOT_EVERY  # at the limit within 10 s
    assert check_every(MemoryUse(500, 1000), 40.0) == CALM_EVERY
    assert check_every(MemoryUse(500, 1000), -80.0) == CALM_EVERY


def test_host27_a_raise_goes_a_third_above_use_in_steps_at_least_128_within_the_rules():
    # 800 used of 1000: 1040 wanted, so at least 128 more, in 64 MB steps: 1128 -> 1128.
    decision = plan_raise(MemoryUse(800, 1000), RULE, lendable_mb=4000, host_free_mb=10_000)
    assert decision.limit_mb == 1128 and not decision.blocked
    # 1000 used of 1100: 1300 wanted, 200 more in 64 MB steps is 256: 1356.
    assert plan_raise(MemoryUse(1000, 1100), RULE, 4000, None).limit_mb == 1356
    # The ceiling binds: what is left up to it, even under a step.
    assert plan_raise(MemoryUse(1400, 1450), RULE, 4000, None).limit_mb == 1500
    at_ceiling = plan_raise(MemoryUse(1400, 1500), RULE, 4000, None)
    assert at_ceiling.blocked and "ceiling of 1500" in at_ceiling.reason
    # What is left to lend binds, and nine tenths of the host's free memory does.
    assert (
        plan_raise(MemoryUse(800, 1000), RULE, lendable_mb=100, host_free_mb=None).limit_mb == 1064
    )
    assert plan_raise(MemoryUse(800, 1000), RULE, 4000, host_free_mb=100).limit_mb == 1064
    starved = plan_raise(MemoryUse(800, 1000), RULE, 4000, host_free_mb=50)
    assert starved.blocked and "left to lend" in starved.reason
    # Use a third under the limit already: nothing to do.
    assert plan_raise(MemoryUse(760, 1000), RULE, 4000, None) is None
    assert plan_raise(MemoryUse(900, 1000), None, 4000, None).blocked  # no rule yet


class Container:
    """A container whose use climbs on a moved clock; its limit as the engine holds it."""

    def __init__(self, limit_mb: int, climb_mb_per_s: float) -> None:
        self.limit_mb = limit_mb
        self.climb = climb_mb_per_s
        self.used = 100.0
        self.raises: list[int] = []
        self.killed = False

    def at(self, seconds: float) -> None:
        self.used = min(1400.0, 100.0 + self.climb * seconds)
        self.killed = self.killed or self.used >= self.limit_mb

    def read(self, _runner_id: int) -> MemoryUse:
        return MemoryUse(self.used, self.limit_mb)

    def raise_limit(self, _runner_id: int, limit_mb: int) -> None:
        assert limit_mb > self.limit_mb, "a limit only ever rises (HOST-28)"
        self.raises.append(limit_mb)
        self.limit_mb = limit_mb


def drive(valve: MemoryValve, box: Container, seconds: int, free: int | None = 10_000) -> list[str]:
    lines = []
    for tick in range(seconds * 10):  # the valve's loop wakes often; each runner when due
        now = tick / 10
        box.at(now)
        lines += valve.step(now, [1], box.read, box.raise_limit, lambda: free)
    return lines


def test_host27_host28_a_climbing_container_is_raised_before_it_reaches_its_limit():
    valve = MemoryValve()
    valve.use_rules(RULES)
    box = Container(limit_mb=1000, climb_mb_per_s=100)  # 100 MB a second towards 1400
    lines = drive(valve, box, 16)
    assert not box.killed, (box.raises, lines)
    assert box.raises == sorted(box.raises) and box.limit_mb <= RULE.ceiling_mb
    assert valve.loans() == {1: box.limit_mb - 1000}
    assert any("raised memory" in line for line in lines)


def test_host30_the_last_rules_stand_while_the_controller_is_silent():
    """No new rules arrive for the whole climb (the controller is down): the valve still
    raises within the last ones it was given."""
    valve = MemoryValve(rules=RULES)
    box = Container(limit_mb=1000, climb_mb_per_s=100)
    drive(valve, box, 16)
    assert box.raises and not box.killed


def test_host31_observe_mode_decides_the_same_changes_nothing_and_records_the_loan():
    watching, acting = MemoryValve(observe=True, rules=RULES), MemoryValve(rules=RULES)
    seen, saved = Container(1000, 100), Container(1000, 100)
    would = drive(watching, seen, 16)
    did = drive(acting, saved, 16)
    assert seen.raises == [] and seen.killed  # the kernel's limit never moved
    assert watching.loans() == acting.loans() and watching.loans()[1] > 0
    assert [line.replace("would raise", "raised") for line in would] == did


def test_host32_a_raise_the_rules_refuse_is_reported_blocked_once_with_why():
    tight = MemoryRules(capacity_mb=0, floor_mb=500, runners=(RULE,))
    valve = MemoryValve(rules=tight)
    box = Container(1000, 100)
    lines = drive(valve, box, 10)
    assert box.raises == [] and "left to lend" in valve.blocked()[1]
    assert sum("blocked" in line for line in lines) == 1  # said once, not every second


def test_host12_at_most_four_samples_at_once_a_slow_one_given_up_and_its_last_value_kept():
    in_flight, most = 0, 0
    lock = threading.Lock()
    slow = {3}
    failing = {5}
    release = threading.Event()

    def read(runner_id: int) -> int:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        try:
            if runner_id in slow:
                release.wait(2)
            if runner_id in failing:
                raise RuntimeError("the engine said 500")
            time.sleep(0.05)
            return runner_id * 10
        finally:
            with lock:
                in_flight -= 1

    sampler = RunnerSampler(read, clock=time.monotonic, sample_seconds=0.3, pass_seconds=1.0)
    try:
        first = sampler.sample(range(1, 11))
        assert most <= 4
        assert {rid for rid, s in first.items() if s.fresh} == set(range(1, 11)) - slow - failing
        slow.clear()
        failing.clear()
        second = sampler.sample(range(1, 11))
        assert all(s.fresh for s in second.values()) and second[3].value == 30
        slow.add(3)
        failing.add(4)
        third = sampler.sample(range(1, 11))
        # A sample that failed keeps the previous value, marked stale with its time.
        assert third[4].value == 40 and not third[4].fresh and third[4].at == second[4].at
        assert third[3].value == 30 and not third[3].fresh
    finally:
        release.set()
        sampler.close()


def test_host12_the_pass_has_a_budget_of_its_own():
    def read(runner_id: int) -> int:
        time.sleep(0.2)
        return runner_id

    sampler = RunnerSampler(read, clock=time.monotonic, max_in_flight=1,
                            sample_seconds=5.0, pass_seconds=0.5)  # fmt: skip
    try:
        started = time.monotonic()
        got = sampler.sample(range(10))
        assert time.monotonic() - started < 1.5
        assert 1 <= len(got) < 10 and sampler.failures >= 5
    finally:
        sampler.close()


@pytest.mark.parametrize("limit", [0, -1])
def test_a_container_without_a_limit_is_left_alone(limit):
    valve = MemoryValve(rules=RULES)
    calls: list[int] = []
    lines = valve.step(0.0, [1], lambda _r: MemoryUse(5000, limit), lambda _r, mb: calls.append(mb),
                       lambda: 10_000)  # fmt: skip
    assert lines == [] and calls == [] and valve.loans() == {}


def test_host29_a_loan_made_after_the_heartbeat_left_is_still_counted_by_the_agent():
    """The answer to a heartbeat built before a raise does not count that loan: the agent
    does, so the two never lend the same memory twice; once reported, the controller does."""
    room = MemoryRules(capacity_mb=200, floor_mb=100, runners=(RULE,))
    valve = MemoryValve(rules=room)
    box = Container(limit_mb=1000, climb_mb_per_s=0)
    box.used = 800.0
    valve.step(0.0, [1], box.read, box.raise_limit, lambda: 10_000)
    assert box.raises == [1128]  # 128 lent of the 200
    valve.use_rules(room, counted_mb=0)  # the answer to a heartbeat sent before the raise
    box.used = 1000.0
    valve.step(1.0, [1], box.read, box.raise_limit, lambda: 10_000)
    assert box.raises[-1] == 1128 + 64  # only the 72 MB left, in whole steps
    valve.use_rules(room, counted_mb=192)  # the next answer counts both loans
    box.used = 1100.0
    valve.step(2.0, [1], box.read, box.raise_limit, lambda: 10_000)
    assert box.raises[-1] > 1192 and box.raises[-1] - 1192 <= 200
