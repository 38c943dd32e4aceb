"""A restarted agent's inventory settles what its dead predecessor had in flight at once, not
at the leases' end (issue 11 item 3), and names the runners the host should hold, so a
provisioning runner with no workload is failed without waiting out the provision timeout
(issue 11 item 5 of the brief: "failed at once")."""

from __future__ import annotations

import pytest
from django.utils import timezone

from fleet import actions, protocol, task_results
from fleet.agent.agent import Agent
from fleet.agent.backends.process import ProcessBackend
from fleet.agent.client import ControllerClient
from fleet.models import AgentTask
from fleet.taskqueue import enqueue_task, sweep_tasks, take_tasks
from runners.actions import apply_agent_reports
from runners.models import Runner
from tests.fleet.agent.fakes import FakeClock
from tests.fleet.conftest import T0, join, later, make_runner

pytestmark = pytest.mark.usefixtures("registry_defaults")


def task_for(host, runner, kind: str, *, now=T0) -> AgentTask:
    return enqueue_task(
        host_id=host.pk, runner_id=runner.pk, kind=kind, payload={"runner_id": runner.pk}, now=now
    )


def inventory(host, *runner_ids: int, complete: bool = True, now=None):
    return actions.record_inventory(
        host=host,
        inventory=protocol.InventoryRequest(runners=runner_ids, complete=complete),
        now=now or later(5),
    )


def state_of(task: AgentTask) -> tuple[str, int]:
    task.refresh_from_db()
    return task.state, task.attempt


@pytest.mark.django_db
def test_task02_a_restarted_agents_inventory_settles_every_task_it_had_in_flight():
    """TASK-02, AGENT-24: five seconds after the kill, far inside the 20-minute create lease,
    the inventory settles each task: a create whose workload is there is done, one whose
    workload is not is offered again now; a stop whose runner left nothing is done, a remove
    whose workload is still there is offered again. Another host's task and a task not yet
    taken are not the inventory's business."""
    host, _ = join("restarted")
    other, _ = join("elsewhere")
    made, lost, stopping, removing = (make_runner(host) for _ in range(4))
    created = task_for(host, made, "create_runner")
    not_made = task_for(host, lost, "create_runner")
    stop = task_for(host, stopping, "stop_runner")
    remove = task_for(host, removing, "remove_runner")
    theirs = task_for(other, make_runner(other), "create_runner")
    assert len(take_tasks(host, T0)) == 4 and take_tasks(other, T0)
    queued = task_for(host, make_runner(host), "create_runner", now=later(1))

    answer = inventory(host, made.pk, removing.pk)

    assert answer.settled == 4
    assert state_of(created) == ("done", 1)
    assert state_of(not_made) == ("pending", 1)  # its next delivery is its second offer
    assert state_of(stop) == ("done", 1)
    assert state_of(remove) == ("pending", 1)
    assert state_of(theirs) == ("in_flight", 1)
    assert state_of(queued) == ("pending", 0)
    # The restarted agent's first poll gets what was offered again.
    again = take_tasks(host, later(6))
    assert {(t.pk, t.attempt) for t in again} == {(not_made.pk, 2), (remove.pk, 2), (queued.pk, 1)}


@pytest.mark.django_db
def test_task02_an_incomplete_inventory_proves_no_workload_gone():
    """TASK-02, AGENT-11: a backend that could not be listed is no proof: the stop and the
    remove whose runners the inventory lacks are offered again, not taken as done."""
    host, _ = join()
    stop = task_for(host, make_runner(host, "draining"), "stop_runner")
    remove = task_for(host, make_runner(host, "failed"), "remove_runner")
    take_tasks(host, T0)

    inventory(host, complete=False)

    assert state_of(stop) == ("pending", 1)
    assert state_of(remove) == ("pending", 1)


@pytest.mark.django_db
def test_task02_only_tasks_taken_before_the_inventory_arrived_are_settled():
    """TASK-02: a task the restarted agent took after its inventory reached the controller
    (a slow first try of the same inventory landing late) is that agent's, and stays."""
    host, _ = join()
    task = task_for(host, make_runner(host), "create_runner")
    take_tasks(host, later(10))

    assert inventory(host, now=later(5)).settled == 0
    assert state_of(task) == ("in_flight", 1)


@pytest.mark.django_db
def test_task06_a_create_whose_runner_ended_meanwhile_is_cancelled_not_offered_again():
    """TASK-06, AGENT-06: the dead agent started the runner, which ran and exited, and its
    end report got through but the create's result did not: nothing is left to start, so
    the create is cancelled rather than offered again (a second workload on a spent
    registration)."""
    host, _ = join()
    runner = make_runner(host)
    task = task_for(host, runner, "create_runner")
    take_tasks(host, T0)
    ended = {"runner_id": runner.pk, "state": "removed", "phase": "exited", "exit_code": 0}
    apply_agent_reports(host=host, reports=[ended], now=later(2))
    assert state_of(task)[0] == "in_flight"

    assert inventory(host).settled == 1

    assert state_of(task)[0] == "cancelled"
    assert not take_tasks(host, later(6))


@pytest.mark.django_db
def test_run14_an_absent_create_out_of_offers_is_abandoned_and_its_runner_failed_by_the_agent():
    """TASK-04, RUN-15, AGENT-17: the third offer's agent died too and no workload is there:
    the create is abandoned at once, and the answer names the runner with the age of its
    last delivery, so the agent reports it missing (a minute after that delivery at the
    latest) and the runner fails with that reason, not at the provision timeout."""
    host, _ = join()
    runner = make_runner(host)
    task = task_for(host, runner, "create_runner")
    for offer in range(3):
        take_tasks(host, later(minutes=21 * offer))
        if offer < 2:
            sweep_tasks(later(minutes=21 * offer + 20, seconds=1))
    assert state_of(task) == ("in_flight", 3)
    now = later(minutes=42, seconds=90)

    answer = inventory(host, now=now)

    assert state_of(task)[0] == "abandoned"
    (expected,) = answer.runners
    assert expected == protocol.ExpectedRunner(
        runner_id=runner.pk, backend="process", state="provisioning", age=90.0
    )
    # What the agent does with it (tests/fleet/agent/test_inventory.py): a missing report.
    missing = {"runner_id": runner.pk, "state": "failed", "phase": "missing", "message": "gone"}
    assert apply_agent_reports(host=host, reports=[missing], now=now) == ([runner.pk], [])
    runner.refresh_from_db()
    assert (runner.state, runner.message) == ("failed", "gone")


@pytest.mark.django_db
def test_run15_the_answer_names_live_runners_without_an_open_create_and_their_ages():
    """RUN-15, AGENT-17: the host should hold every live runner no open create will start;
    each age counts from its create's answer (a workload cannot be younger than that), or
    from the row for one with no create at all."""
    host, _ = join()
    answered = make_runner(host)
    task = task_for(host, answered, "create_runner")
    take_tasks(host, later(1))
    task_results.record_task_result(
        host=host, task_id=task.pk, ok=True, error=None, attempt=1, now=later(10)
    )
    busy = make_runner(host, "busy")
    waiting = make_runner(host)
    task_for(host, waiting, "create_runner")  # pending: the agent will start it
    make_runner(host, "removed")

    answer = inventory(host, answered.pk, now=later(100))

    assert [(r.runner_id, r.state, r.age) for r in answer.runners] == [
        (answered.pk, "provisioning", 90.0),
        (busy.pk, "busy", 100.0),
    ]
    assert Runner.objects.get(pk=answered.pk).state == "provisioning"  # the agent says more


@pytest.mark.django_db
def test_task14_the_inventory_route_takes_the_agents_token_and_the_protocols_shape(agent_api):
    """TASK-14: an inventory is the host's own (its token), in the protocol's shape."""
    host, token = join("over-http")
    runner = make_runner(host)
    task = task_for(host, runner, "create_runner")
    take_tasks(host, T0)

    assert agent_api.post("inventory", {"runners": [runner.pk]}).status_code == 401
    bad = agent_api.post("inventory", {"runners": ["7"]}, token=token)
    assert (bad.status_code, bad.json()["field"]) == (400, "runners[0]")
    ok = agent_api.post("inventory", {"runners": [runner.pk], "complete": True}, token=token)

    assert ok.status_code == 200
    answer = protocol.InventoryAnswer.from_json(ok.json())
    assert answer.settled == 1 and [r.runner_id for r in answer.runners] == [runner.pk]
    assert state_of(task) == ("done", 1)


@pytest.mark.django_db
def test_task02_a_poll_the_dead_agent_left_open_takes_nothing_after_the_inventory():
    """TASK-02: the killed agent's long-poll may still wait on the server (no FIN from a
    dead host). Woken by the task the inventory offered again, it must not take it: only
    a poll begun after the inventory does, so the task is never sent to a closed socket."""
    host, _ = join()
    task = task_for(host, make_runner(host), "create_runner")
    take_tasks(host, T0)
    inventory(host, now=later(5))

    assert take_tasks(host, later(6), polled_at=later(3)) == []
    assert [t.pk for t in take_tasks(host, later(6), polled_at=later(6))] == [task.pk]


@pytest.mark.django_db(transaction=True)
def test_run14_a_provisioning_runner_whose_workload_is_absent_fails_at_once_over_http(
    live_server, tmp_path
):
    """RUN-15, AGENT-17, issue 11 item 3: the dead agent answered the create and died before
    reporting registering, and the workload went with the host's reboot. The restarted agent's
    inventory lacks it; answered that the runner should be there, the agent reports it missing
    once the minute since the create's answer is over (on its moved clock), and the runner
    fails then, with the reason, instead of at the provision timeout 20 minutes on."""
    host, agent_token = join("rebooted", now=timezone.now())
    runner = make_runner(host, now=timezone.now())
    task = task_for(host, runner, "create_runner", now=timezone.now())
    take_tasks(host, timezone.now())
    task_results.record_task_result(
        host=host, task_id=task.pk, ok=True, error=None, attempt=1, now=timezone.now()
    )
    clock = FakeClock()
    client = ControllerClient(live_server.url, agent_token=agent_token)
    backend = ProcessBackend(tmp_path / "work")
    agent = Agent(
        live_server.url, tmp_path / "state", tmp_path / "work", [backend], "rebooted", 1,
        clock=clock, client=client,
    )  # fmt: skip

    answer = agent.report_inventory()
    assert answer is not None and [r.runner_id for r in answer.runners] == [runner.pk]
    agent.reconcile_once()
    assert Runner.objects.get(pk=runner.pk).state == "provisioning"  # within the minute
    clock.advance(61)
    agent.reconcile_once()

    runner.refresh_from_db()
    assert runner.state == "failed"
    assert "disappeared" in runner.message
