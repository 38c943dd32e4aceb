"""The agent's timings come from the controller (issue 7 item 5): the join answer sets them,
every heartbeat answer may change them, and the loops use what was last answered."""

from __future__ import annotations

import sys

from fleet import protocol
from fleet.agent.backends.base import RunnerSpec, WorkloadStatus

LONG = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_host01_the_join_answer_sets_the_timings_before_any_heartbeat(make_agent, controller):
    controller.heartbeat_interval = 9
    controller.tunables = protocol.AgentTunables(long_poll_wait=4, orphan_grace=10)
    agent = make_agent()
    assert agent.tunables == protocol.AgentTunables()  # the defaults, until an answer
    agent.connect()
    assert agent.heartbeat_interval == 9
    assert (agent.tunables.long_poll_wait, agent.tunables.orphan_grace) == (4, 10)

    waits: list[str | None] = []
    agent.client._http.event_hooks["request"].append(
        lambda request: waits.append(request.url.params.get("wait"))
    )
    controller.enqueue("remove_runner", 1)  # so the wait is not waited out
    agent.poll_once()  # no wait given: the controller's long_poll_wait
    assert waits[0] == "4"


def test_agent16_the_orphan_grace_is_the_controllers(make_agent, controller, clock):
    """AGENT-16 with agent.orphan_grace at 10 s, as the heartbeat answer says."""
    agent = make_agent()
    agent.connect()
    controller.tunables = protocol.AgentTunables(orphan_grace=10)
    agent.heartbeat_once()
    agent.poll_once(wait=0)
    agent.backends["process"].create(RunnerSpec(21, "stray", "pool", "process", command=LONG))
    agent.reconcile_once(clock())
    clock.advance(9)
    agent.reconcile_once(clock())
    assert agent.backends["process"].inspect(21).status == WorkloadStatus.RUNNING
    clock.advance(1)
    agent.reconcile_once(clock())
    assert agent.backends["process"].inspect(21).status == WorkloadStatus.MISSING


def test_agent17_the_missing_grace_is_the_controllers(make_agent, controller, clock):
    """AGENT-17 with agent.missing_grace at 5 s."""
    controller.tunables = protocol.AgentTunables(missing_grace=5)
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(22, LONG)
    agent.poll_once(wait=0)
    agent.reconcile_once(clock())
    agent.backends["process"].remove(22)
    clock.advance(4)
    agent.reconcile_once(clock())
    assert [r["state"] for r in controller.reports_for(22)] == ["registering"]
    clock.advance(1)
    agent.reconcile_once(clock())
    assert [r["state"] for r in controller.reports_for(22)] == ["registering", "failed"]


def test_agent18_the_retention_is_the_controllers_unless_the_operator_set_one(
    make_agent, controller
):
    controller.tunables = protocol.AgentTunables(finished_retention=600)
    agent = make_agent()
    agent.connect()
    assert agent.finished_retention == 600
    own = make_agent(finished_retention=5)
    own.connect()
    assert own.finished_retention == 5


def test_agent19_the_shutdown_grace_is_the_controllers(make_agent, controller):
    controller.tunables = protocol.AgentTunables(shutdown_grace=0)
    agent = make_agent()
    agent.connect()
    waited: list[float | None] = []
    agent.wait_for_tasks = lambda timeout=None: waited.append(timeout) or True  # type: ignore[method-assign]
    agent.stop()
    assert waited == [0]
