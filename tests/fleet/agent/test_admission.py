"""The host's one create slot: AGENT-01, 02, 05, 06, 07, 08, with an in-memory backend."""

from __future__ import annotations

import threading

from fleet.agent.backends.base import (
    Backend,
    Handle,
    HostSize,
    RunnerSpec,
    Workload,
    WorkloadExists,
    WorkloadStatus,
)
from tests.fleet.agent.fakes import wait_until


class GatedBackend(Backend):
    """Obeys the Backend interface in memory; each create waits until the test opens its gate."""

    name = "process"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workloads: dict[int, WorkloadStatus] = {}
        self.gates: dict[int, threading.Event] = {}
        self.creating = 0
        self.most_at_once = 0
        self.started: list[int] = []
        self.stopped: list[int] = []

    def gate(self, runner_id: int) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(runner_id, threading.Event())

    def create(self, spec: RunnerSpec) -> Handle:
        with self.lock:
            if spec.runner_id in self.workloads:
                raise WorkloadExists(str(spec.runner_id))
            self.creating += 1
            self.most_at_once = max(self.most_at_once, self.creating)
            self.started.append(spec.runner_id)
        try:
            assert self.gate(spec.runner_id).wait(10), "the test never opened the gate"
        finally:
            with self.lock:
                self.creating -= 1
        with self.lock:
            self.workloads[spec.runner_id] = WorkloadStatus.RUNNING
        return Handle(spec.runner_id, f"mem:{spec.runner_id}")

    def inspect(self, runner_id: int) -> Workload:
        with self.lock:
            found = self.workloads.get(runner_id, WorkloadStatus.MISSING)
        return Workload(runner_id=runner_id, status=found)

    def list(self) -> list[Workload]:
        with self.lock:
            return [Workload(runner_id=r, status=s) for r, s in self.workloads.items()]

    def stop(self, runner_id: int, timeout: float) -> None:
        with self.lock:
            self.stopped.append(runner_id)
            if runner_id in self.workloads:
                self.workloads[runner_id] = WorkloadStatus.EXITED

    def remove(self, runner_id: int) -> None:
        with self.lock:
            self.workloads.pop(runner_id, None)

    def logs(self, runner_id: int) -> bytes:
        return b""

    def probe(self) -> HostSize:
        return HostSize(cpus=4.0, memory_mb=8192, platform="linux/x64")


CMD = ["true"]


def test_agent01_agent02_one_create_at_a_time_in_arrival_order(make_agent, controller):
    backend = GatedBackend()
    agent = make_agent(backend)
    agent.connect()
    ids = [controller.enqueue_create(r, CMD) for r in (1, 2, 3)]

    agent.poll_once(wait=0, block=False)
    for runner_id in (1, 2, 3):
        wait_until(lambda r=runner_id: backend.started[-1:] == [r])
        assert backend.creating == 1
        backend.gate(runner_id).set()
    assert agent.wait_for_tasks(5)

    assert backend.started == [1, 2, 3] and backend.most_at_once == 1
    assert [controller.result_of(i)["ok"] for i in ids] == [True, True, True]


def test_agent05_agent06_a_stop_runs_meanwhile_and_skips_the_waiting_create(make_agent, controller):
    backend = GatedBackend()
    agent = make_agent(backend)
    agent.connect()
    first = controller.enqueue_create(1, CMD)
    second = controller.enqueue_create(2, CMD)
    agent.poll_once(wait=0, block=False)
    wait_until(lambda: backend.started == [1])

    stop = controller.enqueue("stop_runner", 2, {"timeout": 1})
    agent.poll_once(wait=0, block=False)
    # AGENT-05: the stop is answered while the slot is still held by runner 1's create.
    wait_until(lambda: controller.result_of(stop))
    wait_until(lambda: controller.result_of(second))
    assert controller.result_of(second)["ok"] is False
    assert "skipped" in controller.result_of(second)["error"]

    backend.gate(1).set()
    assert agent.wait_for_tasks(5)
    assert backend.started == [1]
    assert controller.result_of(first)["ok"] is True


def test_agent07_shutdown_cancels_creates_waiting_for_the_slot(make_agent, controller):
    backend = GatedBackend()
    agent = make_agent(backend)
    agent.connect()
    first = controller.enqueue_create(1, CMD)
    waiting = controller.enqueue_create(2, CMD)
    agent.poll_once(wait=0, block=False)
    wait_until(lambda: backend.started == [1])

    stopper = threading.Thread(target=agent.stop, kwargs={"grace": 5})
    stopper.start()
    wait_until(lambda: agent.stopping)
    backend.gate(1).set()  # AGENT-20: the create under way runs to its end
    stopper.join(10)

    assert controller.result_of(first)["ok"] is True
    assert controller.result_of(waiting) is None, "left unanswered, for redelivery"
    assert backend.started == [1]


def test_agent08_a_cordon_is_checked_when_a_create_reaches_the_front(make_agent, controller):
    backend = GatedBackend()
    agent = make_agent(backend)
    agent.connect()
    controller.cordoned = True
    agent.heartbeat_once()
    task_id = controller.enqueue_create(1, CMD)
    agent.poll_once(wait=0)

    assert controller.result_of(task_id) == {
        "ok": False,
        "error": "the host is cordoned",
        "attempt": 1,
    }
    assert backend.started == []
