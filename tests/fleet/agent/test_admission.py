"""The host's one create slot: AGENT-01, 02, 05..08, 11, 12, 20, with an in-memory backend."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fleet.agent.backends.base import (
    Backend,
    BackendError,
    Handle,
    HostSize,
    RunnerSpec,
    Workload,
    WorkloadExists,
    WorkloadStatus,
)
from tests.fleet.agent.fakes import FakeClock
from tests.waiting import wait_until


class GatedBackend(Backend):
    """Obeys the Backend interface in memory; each create waits until the test opens its gate,
    and so does a stop or remove of a runner in `gated` (keyed ("stop", id), ("remove", id))."""

    name = "process"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workloads: dict[int, WorkloadStatus] = {}
        self.gates: dict[object, threading.Event] = {}
        self.gated: set[tuple[str, int]] = set()
        self.creating = 0
        self.most_at_once = 0
        self.started: list[int | str | None] = []
        self.stopped: list[tuple[int, float]] = []  # (runner, the timeout it was given)
        self.removed: list[int] = []
        self.entered: list[tuple[str, int]] = []  # stops and removes begun, gated or not
        self.calls: list[tuple[str, int]] = []  # every create and inspect, by runner
        self.inventory_down = False  # inspect cannot tell: the engine does not answer

    def gate(self, key: object) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(key, threading.Event())

    def _pass(self, key: tuple[str, int]) -> None:
        with self.lock:
            self.entered.append(key)
            gated = key in self.gated
        if gated:
            assert self.gate(key).wait(10), "the test never opened the gate"

    def create(self, spec: RunnerSpec) -> Handle:
        with self.lock:
            self.calls.append(("create", spec.runner_id))
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
            self.calls.append(("inspect", runner_id))
            if self.inventory_down:
                raise BackendError("the engine did not answer while inspecting")
            found = self.workloads.get(runner_id, WorkloadStatus.MISSING)
        return Workload(runner_id=runner_id, status=found)

    def list(self) -> list[Workload]:
        with self.lock:
            return [Workload(runner_id=r, status=s) for r, s in self.workloads.items()]

    def stop(self, runner_id: int, timeout: float, grace: float = 0.0) -> None:
        self._pass(("stop", runner_id))
        with self.lock:
            self.stopped.append((runner_id, timeout))
            if runner_id in self.workloads:
                self.workloads[runner_id] = WorkloadStatus.EXITED

    def remove(self, runner_id: int) -> None:
        self._pass(("remove", runner_id))
        with self.lock:
            self.removed.append(runner_id)
            self.workloads.pop(runner_id, None)

    def logs(self, runner_id: int) -> bytes:
        return b""

    def probe(self) -> HostSize:
        return HostSize(cpus=4.0, memory_mb=8192, platform="linux/x64")

    def prewarm(self, image: str | None, *, dind: bool = False) -> list[str]:
        """Holds the slot like a create, until the test opens the image's gate."""
        with self.lock:
            self.creating += 1
            self.most_at_once = max(self.most_at_once, self.creating)
            self.started.append(image)
        try:
            assert self.gate(image).wait(10), "the test never opened the gate"
        finally:
            with self.lock:
                self.creating -= 1
        return [image] if image else []


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


def test_agent06_a_removal_skips_the_waiting_create_before_it_touches_the_engine(
    make_agent, controller
):
    """AGENT-06: a removal overtakes its runner's create still waiting for the slot, as a stop
    does; the create is skipped and never reaches the backend, not even to look for its
    workload (the one lookup of runner 2 is the removal's own adoption, AGENT-24)."""
    backend = GatedBackend()
    agent = make_agent(backend)
    agent.connect()
    first = controller.enqueue_create(1, CMD)
    second = controller.enqueue_create(2, CMD)
    agent.poll_once(wait=0, block=False)
    wait_until(lambda: backend.started == [1])

    remove = controller.enqueue("remove_runner", 2)
    agent.poll_once(wait=0, block=False)
    wait_until(lambda: controller.result_of(remove))
    wait_until(lambda: controller.result_of(second))
    assert controller.result_of(remove)["ok"] is True
    assert controller.result_of(second) == {
        "ok": False,
        "error": "skipped: a stop or remove for this runner arrived first",
        "attempt": 1,
    }

    backend.gate(1).set()
    assert agent.wait_for_tasks(5)
    assert controller.result_of(first)["ok"] is True
    assert [call for call in backend.calls if call[1] == 2] == [("inspect", 2)]
    assert backend.started == [1] and backend.removed == [2]


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


def test_agent20_a_create_stop_and_remove_under_way_at_shutdown_run_to_their_end(
    make_agent, controller
):
    """AGENT-20: shutdown cancels none of the create, stop and remove already under way in
    the backend: the shutdown waits for them (within AGENT-19's grace) while each goes on,
    the stop with its own timeout, to its end, and each is answered."""
    backend = GatedBackend()
    agent = make_agent(backend)
    agent.connect()
    for runner_id in (5, 6):
        backend.gate(runner_id).set()
        controller.enqueue_create(runner_id, CMD)
    agent.poll_once(wait=0)
    backend.gated = {("stop", 5), ("remove", 6)}
    create = controller.enqueue_create(7, CMD)
    stop = controller.enqueue("stop_runner", 5, {"timeout": 120})
    remove = controller.enqueue("remove_runner", 6)
    agent.poll_once(wait=0, block=False)
    wait_until(lambda: backend.started[-1:] == [7])
    wait_until(lambda: {("stop", 5), ("remove", 6)} <= set(backend.entered))

    stopper = threading.Thread(target=agent.stop, kwargs={"grace": 10})
    stopper.start()
    wait_until(lambda: agent.stopping)
    assert stopper.is_alive(), "the shutdown waits for the three under way"
    assert [controller.result_of(t) for t in (create, stop, remove)] == [None, None, None]
    for key in (7, ("stop", 5), ("remove", 6)):
        backend.gate(key).set()
    stopper.join(10)

    assert not stopper.is_alive()
    assert [controller.result_of(t)["ok"] for t in (create, stop, remove)] == [True, True, True]
    assert backend.stopped == [(5, 120.0)]  # the task's own timeout, not the shutdown's grace
    assert backend.removed == [6]
    assert backend.workloads == {5: WorkloadStatus.EXITED, 7: WorkloadStatus.RUNNING}


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


def test_issue21_item6_an_uncordon_reaches_the_agent_with_the_next_create(make_agent, controller):
    """Issue 21 item 6: the agent heard "cordoned" at its last heartbeat; the host is
    uncordoned and a create placed on it before the next heartbeat. The task list carries
    the cordon as of the take, so the create starts rather than failing "the host is
    cordoned" (three such failures opened the pool's start backoff)."""
    backend = GatedBackend()
    agent = make_agent(backend)
    agent.connect()
    controller.cordoned = True
    agent.heartbeat_once()
    assert agent.cordoned
    controller.cordoned = False  # uncordoned; no heartbeat since
    task_id = controller.enqueue_create(1, CMD)
    backend.gate(1).set()
    agent.poll_once(wait=0)

    assert controller.result_of(task_id) == {"ok": True, "error": None, "attempt": 1}
    assert backend.started == [1]
    assert not agent.cordoned


def prewarm(controller, image: str) -> int:
    return controller.enqueue(
        "image_prewarm", None, {"backend": "process", "image": image, "pool": "zoomies-p"}
    )


def test_agent01_agent02_a_prewarm_shares_the_slot_and_waits_behind_every_create(
    make_agent, controller
):
    """AGENT-01: a prewarm takes the host's one slot like a create; AGENT-02: a waiting
    create goes before a waiting prewarm that arrived earlier, and prewarms keep their own
    order after the creates; a prewarm under way is not interrupted."""
    backend = GatedBackend()
    agent = make_agent(backend)
    agent.connect()
    first = controller.enqueue_create(1, CMD)
    agent.poll_once(wait=0, block=False)
    wait_until(lambda: backend.started == [1])

    early = prewarm(controller, "img-a")
    late = prewarm(controller, "img-b")
    second = controller.enqueue_create(2, CMD)
    agent.poll_once(wait=0, block=False)
    backend.gate(1).set()
    wait_until(lambda: backend.started == [1, 2])  # the create that arrived after the prewarms
    assert backend.creating == 1
    backend.gate(2).set()
    wait_until(lambda: backend.started == [1, 2, "img-a"])

    third = controller.enqueue_create(3, CMD)
    agent.poll_once(wait=0, block=False)
    backend.gate("img-a").set()
    wait_until(lambda: backend.started == [1, 2, "img-a", 3])  # ahead of the waiting img-b
    backend.gate(3).set()
    backend.gate("img-b").set()
    assert agent.wait_for_tasks(5)
    assert backend.started == [1, 2, "img-a", 3, "img-b"] and backend.most_at_once == 1
    assert all(controller.result_of(i)["ok"] for i in (first, early, late, second, third))


def moved_pause(clock: FakeClock) -> tuple[list[float], Callable[[float], bool]]:
    """The agent's pause, moving the fake clock instead of sleeping; never interrupted."""
    pauses: list[float] = []

    def pause(seconds: float) -> bool:
        pauses.append(seconds)
        clock.advance(seconds)
        return False

    return pauses, pause


def test_agent11_agent12_a_first_delivery_in_doubt_asks_three_more_times_then_fails_loudly(
    make_agent, controller, clock
):
    """AGENT-11: an inventory lookup that cannot tell whether the runner's workload exists is
    asked three more times, 2, 5 and 10 s apart (on the moved clock), and no workload is built
    on doubt; AGENT-12: a first delivery then fails out loud, so the scheduler replaces it."""
    backend = GatedBackend()
    backend.inventory_down = True
    agent = make_agent(backend)
    agent.connect()
    pauses, agent._pause = moved_pause(clock)
    began = clock()
    task = controller.enqueue_create(1, CMD)
    agent.poll_once(wait=0)

    assert pauses == [2.0, 5.0, 10.0] and clock() - began == 17.0
    assert backend.calls == [("inspect", 1)] * 4
    assert controller.result_of(task) == {
        "ok": False,
        "error": (
            "cannot tell whether runner 1's workload exists: "
            "the engine did not answer while inspecting"
        ),
        "attempt": 1,
    }


def test_agent11_agent12_a_redelivery_in_doubt_is_left_unacknowledged(
    make_agent, controller, clock
):
    """AGENT-12: a redelivered create may have a workload mid-job behind the silent engine:
    after the same three asks over 17 s (AGENT-11) it is neither built nor answered, so its
    lease runs out and the controller offers it again; the slot is given back meanwhile."""
    backend = GatedBackend()
    backend.inventory_down = True
    agent = make_agent(backend)
    agent.connect()
    pauses, agent._pause = moved_pause(clock)
    began = clock()
    task = controller.enqueue_create(1, CMD, attempt=2)
    agent.poll_once(wait=0)

    assert pauses == [2.0, 5.0, 10.0] and clock() - began == 17.0
    assert backend.calls == [("inspect", 1)] * 4
    assert controller.result_of(task) is None
    assert controller.tasks[task].state == "in_flight"

    backend.inventory_down = False
    backend.gate(2).set()
    after = controller.enqueue_create(2, CMD)
    agent.poll_once(wait=0)
    assert controller.result_of(after) == {"ok": True, "error": None, "attempt": 1}
    assert backend.started == [2]


def test_issue21_item6_a_heartbeat_sent_before_a_task_list_does_not_undo_its_cordon(
    make_agent, controller, clock
):
    """The heartbeat and the task poll run on threads of their own: a heartbeat sent while
    the host was cordoned, answered after a task list that carried the uncordon, must not
    put the old cordon back for the creates that list brought."""
    backend = GatedBackend()
    agent = make_agent(backend)
    agent.connect()
    controller.cordoned = True
    agent.heartbeat_once()
    controller.cordoned = False
    controller.enqueue_create(1, CMD)
    agent.poll_once(wait=0, block=False)  # the uncordon arrives with the create
    controller.cordoned = True  # what the late heartbeat answer says, read before
    agent.cordon_from_tasks_at = clock() + 1  # ... the list arrived after it was sent
    agent.heartbeat_once()
    assert agent.cordoned is False
    clock.advance(5)
    agent.heartbeat_once()  # a heartbeat sent after the list: its word counts again
    assert agent.cordoned is True
    backend.gate(1).set()
    agent.wait_for_tasks(10)
