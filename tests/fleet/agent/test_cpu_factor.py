"""HOST-20, HOST-22: the controller's CPU factor rides on each heartbeat answer and the
agent applies it to every runner it tracks, idempotently, once a runner's bootstrap grace
is over (on a moved clock; the engines' side is tests/fleet/backends). TASK-09: the agent
answers a host check with its report."""

from __future__ import annotations

import dataclasses
import time

from fleet.agent.backends.base import Workload, WorkloadStatus
from fleet.agent.memory_valve import MemoryUse
from fleet.protocol import MemoryRules, RunnerMemoryRule
from tests.fleet.agent.test_admission import CMD, GatedBackend


class FactorBackend(GatedBackend):
    """Records the factor asked for each runner, and holds it as the engine would."""

    def __init__(self) -> None:
        super().__init__()
        self.factors: dict[int, float] = {}
        self.asked: list[tuple[int, float]] = []

    def apply_cpu_factor(self, runner_id: int, factor: float) -> int:
        self.asked.append((runner_id, factor))
        if self.factors.get(runner_id, 1.0) == factor:
            return 0
        self.factors[runner_id] = factor
        return 1


def test_host20_host22_each_heartbeat_applies_the_factor_after_the_bootstrap_grace(
    make_agent, controller, clock
):
    controller.tunables = dataclasses.replace(controller.tunables, bootstrap_cpu_grace=120.0)
    backend = FactorBackend()
    agent = make_agent(backend)
    agent.connect()
    for rid in (1, 2):
        backend.gate(rid).set()
        controller.enqueue_create(rid, CMD)
    agent.poll_once(wait=0)
    assert sorted(backend.started) == [1, 2]
    controller.cpu_factor = 0.75

    agent.heartbeat_once()  # inside the grace: full quota
    assert backend.factors == {}
    clock.advance(121)
    assert agent.heartbeat_once() and backend.factors == {1: 0.75, 2: 0.75}
    assert agent.apply_cpu_factor() == 0  # idempotent: asked again, nothing changes
    controller.cpu_factor = 1.0  # calm: the throttle is lifted, the quota given back
    agent.heartbeat_once()
    assert backend.factors == {1: 1.0, 2: 1.0}


def test_task09_the_agent_answers_a_host_check_with_its_engines_disk_and_clock(
    make_agent, controller
):
    """The check takes no create slot and names no runner; its report goes back with the
    result (the controller keeps it on the host, tests/fleet/test_host_checks.py)."""
    backend = FactorBackend()
    agent = make_agent(backend)
    agent.connect()
    task_id = controller.enqueue("check_host", None, {})
    agent.poll_once(wait=0)
    result = controller.result_of(task_id)
    assert result["ok"] is True and result["error"] is None, result
    report = result["report"]
    assert report["engine.process"] == "reachable"
    assert report["disk_free_mb"] > 0 and report["disk_total_mb"] >= report["disk_free_mb"]
    assert abs(report["clock"] - time.time()) < 60


class MemoryBackend(GatedBackend):
    """A container engine's memory for the valve: each runner climbing, its limit held."""

    def __init__(self) -> None:
        super().__init__()
        self.used: dict[int, float] = {}
        self.limits: dict[int, int] = {}

    def memory_use(self, runner_id: int) -> MemoryUse | None:
        if runner_id not in self.used:
            return None
        return MemoryUse(self.used[runner_id], self.limits.setdefault(runner_id, 1000))

    def raise_memory(self, runner_id: int, limit_mb: int) -> None:
        assert limit_mb > self.limits[runner_id]
        self.limits[runner_id] = limit_mb


def one_runner_at_900_of_1000_mb(make_agent, controller):
    """An agent running runner 1, which uses 900 of its 1000 MB, on a host with room."""
    backend = MemoryBackend()
    agent = make_agent(backend)
    agent.connect()
    backend.gate(1).set()
    controller.enqueue_create(1, CMD)
    agent.poll_once(wait=0)
    backend.used[1] = 900.0
    agent._memory.free_mb = lambda: 10_000
    return agent, backend


def test_host24_host29_host30_the_agent_lends_by_the_answers_rules_and_reports_the_loan(
    make_agent, controller, clock
):
    agent, backend = one_runner_at_900_of_1000_mb(make_agent, controller)
    agent._memory.step([(1, backend.name)])
    assert backend.limits.get(1, 1000) == 1000  # no rules yet: the valve does nothing
    controller.memory = MemoryRules(capacity_mb=2000, floor_mb=100,
                                    runners=(RunnerMemoryRule(1, 1000, 1500),))  # fmt: skip
    agent.heartbeat_once()
    agent._memory.step([(1, backend.name)])
    assert backend.limits[1] == 1192  # a third above 900, in 64 MB steps above 1000
    agent.heartbeat_once()
    assert controller.heartbeats[-1].memory_loans == {1: 192}
    # The controller goes quiet: the last rules stand, and the next climb is still met.
    clock.advance(5)
    backend.used[1] = 1100.0
    agent._memory.step([(1, backend.name)])
    assert backend.limits[1] == 1448  # 1430 wanted: four steps above 1192


class StartedBackend(FactorBackend):
    """Workloads that were already running when this agent started, each with its start."""

    def __init__(self, started_at: dict[int, float]) -> None:
        super().__init__()
        self.started_at = started_at
        self.workloads.update({rid: WorkloadStatus.RUNNING for rid in started_at})

    def inspect(self, runner_id: int) -> Workload:
        found = super().inspect(runner_id)
        return dataclasses.replace(found, started_at=self.started_at.get(runner_id))

    def list(self) -> list[Workload]:
        return [dataclasses.replace(w, started_at=self.started_at.get(w.runner_id))
                for w in super().list()]  # fmt: skip


def test_host22_an_adopted_workload_s_grace_counts_from_its_own_start(
    make_agent, controller, clock
):
    """A restarted agent adopts two workloads: one started 5 min ago is past the 2 min
    grace at once; one started 30 s ago keeps its full quota for 90 s more."""
    backend = StartedBackend({1: time.time() - 300, 2: time.time() - 30})
    agent = make_agent(backend)
    agent.connect()
    agent.report_inventory()
    assert set(agent.tracked) == {1, 2}
    controller.cpu_factor = 0.5
    agent.heartbeat_once()
    assert backend.factors == {1: 0.5}
    clock.advance(95)
    agent.heartbeat_once()
    assert backend.factors == {1: 0.5, 2: 0.5}


def test_host31_an_observing_agent_reports_what_it_would_have_lent_apart(
    make_agent, controller, clock
):
    agent, backend = one_runner_at_900_of_1000_mb(make_agent, controller)
    controller.memory = MemoryRules(capacity_mb=2000, floor_mb=100, observe=True,
                                    runners=(RunnerMemoryRule(1, 1000, 1500),))  # fmt: skip
    agent.heartbeat_once()
    agent._memory.step([(1, backend.name)])
    assert backend.limits[1] == 1000  # the container is not touched
    agent.heartbeat_once()
    sent = controller.heartbeats[-1]
    assert sent.memory_would_lend == {1: 192} and not sent.memory_loans
