"""A starting agent reports its inventory before its first poll, and watches the runners the
controller answers it should hold (issue 11 item 3): AGENT-17, AGENT-23, RUN-15."""

from __future__ import annotations

import threading

from fleet import protocol
from fleet.agent.backends.base import BackendError, RunnerSpec
from fleet.agent.backends.process import ProcessBackend
from tests.fleet.agent.test_agent import LONG, phases
from tests.waiting import wait_until


def test_agent23_run_sends_the_inventory_of_adopted_workloads_before_its_first_poll(
    make_agent, controller, dirs
):
    """AGENT-23: what the host holds is adopted and told before any task can be taken, so
    the controller may settle the tasks the dead predecessor had in flight from it."""
    ProcessBackend(dirs[1]).create(RunnerSpec(31, "left-running", "pool", "process", command=LONG))
    agent = make_agent()
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    wait_until(lambda: controller.calls_to("/tasks"))
    agent.request_stop()
    thread.join(10)

    paths = [
        c.path.rsplit("/", 1)[-1]
        for c in controller.calls
        if c.method == "POST" or "tasks" in c.path
    ]
    assert paths.index("inventory") < paths.index("tasks")
    (sent,) = [c.body for c in controller.calls_to("/inventory")]
    assert sent == {"runners": [31], "complete": True}
    assert agent.tracked[31].adopted


def test_agent17_an_expected_runner_with_no_workload_is_reported_missing_once_a_minute_old(
    make_agent, controller, clock
):
    """AGENT-17, RUN-15: the controller answers that runner 32 should be here, its create
    answered 30 s ago; nothing is. Not reported within the minute that counts from that
    answer; reported failed/missing as soon as it is over, and once."""
    controller.expected = [protocol.ExpectedRunner(32, "process", "provisioning", age=30.0)]
    agent = make_agent()
    agent.connect()
    assert agent.report_inventory() is not None

    agent.reconcile_once(clock())
    clock.advance(29)
    agent.reconcile_once(clock())
    assert phases(controller, 32) == []
    clock.advance(2)
    agent.reconcile_once(clock())
    agent.reconcile_once(clock())

    assert phases(controller, 32) == [("failed", "missing")]
    assert agent.tracked == {}


def test_agent17_an_expected_runner_older_than_a_minute_is_reported_missing_at_once(
    make_agent, controller, clock
):
    """AGENT-17: a workload made over a minute ago is not one a backend could be slow to
    list: its absence is reported on the first pass after the inventory."""
    controller.expected = [protocol.ExpectedRunner(33, "docker", "idle", age=61.0)]
    agent = make_agent()
    agent.connect()
    agent.report_inventory()
    agent.reconcile_once(clock())

    assert phases(controller, 33) == [("failed", "missing")]


def test_run15_a_provisioning_runner_whose_workload_is_here_is_reported_registering(
    make_agent, controller, clock, dirs
):
    """RUN-15: the dead agent made the workload and died before saying so; the controller
    still has the runner provisioning. The restarted agent adopts it and, told so, reports
    registering and then its phase, as after its own create."""
    ProcessBackend(dirs[1]).create(
        RunnerSpec(34, "made-then-died", "pool", "process", command=LONG)
    )
    controller.expected = [protocol.ExpectedRunner(34, "process", "provisioning", age=3.0)]
    agent = make_agent()
    agent.connect()
    agent.report_inventory()
    agent.reconcile_once(clock())

    assert phases(controller, 34) == [("registering", "running")]


class UnlistableBackend(ProcessBackend):
    def list(self):
        raise BackendError("the engine did not answer")


def test_agent11_an_inventory_with_a_backend_that_cannot_be_listed_says_it_is_incomplete(
    make_agent, controller, dirs
):
    """AGENT-11: a listing that failed proves no workload gone; the controller is told."""
    agent = make_agent(UnlistableBackend(dirs[1]))
    agent.connect()
    agent.report_inventory()

    (sent,) = [c.body for c in controller.calls_to("/inventory")]
    assert sent == {"runners": [], "complete": False}
