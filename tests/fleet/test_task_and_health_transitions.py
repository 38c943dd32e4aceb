"""Agent tasks and host health: an allow-list each and one compare-and-set each, with the
runners' discipline (issue: agent tasks and host health get what runners and machines have).
"""

from __future__ import annotations

import importlib
import itertools

import pytest
from django.apps import apps

from accounts.models import AuditLog
from fleet.models import AgentTask, Host
from fleet.states import (
    FINAL_TASK_STATES,
    HOST_HEALTH_TRANSITIONS,
    TASK_TRANSITIONS,
    HostHealth,
    TaskState,
)
from fleet.taskqueue import cancel_tasks, enqueue_task, seal_env
from fleet.transitions import transition_host_health, transition_task
from tests.fleet.conftest import T0, join, later, make_runner

pytestmark = pytest.mark.usefixtures("registry_defaults")

TASK_EDGES = {
    ("pending", "in_flight"), ("pending", "cancelled"), ("in_flight", "pending"),
    ("in_flight", "done"), ("in_flight", "failed"), ("in_flight", "abandoned"),
    ("in_flight", "cancelled"),
}  # fmt: skip
HEALTH_EDGES = {
    ("healthy", "unhealthy"), ("healthy", "lost"), ("unhealthy", "lost"),
    ("unhealthy", "healthy"), ("lost", "healthy"),
}  # fmt: skip


def test_the_allow_lists_are_exactly_the_drawn_edges():
    """TASK-02..06 and HOST-03/04: nothing leaves a final task state; health goes down the
    silence ladder and back up only to healthy."""
    assert {(a.value, b.value) for a, b in TASK_TRANSITIONS} == TASK_EDGES
    assert {(a.value, b.value) for a, b in HOST_HEALTH_TRANSITIONS} == HEALTH_EDGES
    assert not {src for src, _ in TASK_TRANSITIONS} & set(FINAL_TASK_STATES)


def _task_in(state: str, host: Host) -> AgentTask:
    task = enqueue_task(
        host_id=host.pk,
        runner_id=make_runner(host).pk,
        kind="create_runner",
        payload=seal_env({"runner_id": 0, "env": {"TOKEN": "s3cret"}}),
        now=T0,
    )
    # A fixture row put in a state: the test's own write, not production code.
    AgentTask.objects.filter(pk=task.pk).update(state=state)
    return task


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), list(itertools.product(list(TaskState), repeat=2)))
def test_task01_every_pair_of_task_states_is_checked(src, dst):
    """TASK-01: a legal edge moves the row and writes its audit row; any other changes
    nothing; a final state drops the stored credential in the same UPDATE (AUTH-07)."""
    host, _ = join("h1")
    task = _task_in(src, host)
    before = AuditLog.objects.count()
    moved = transition_task(task.pk, dst, now=later(1), actor="test", reason="pair")
    task.refresh_from_db()
    if (src.value, dst.value) in TASK_EDGES:
        assert moved and task.state == dst
        assert AuditLog.objects.filter(action=f"task.{dst.value}").count() == 1
        if dst in FINAL_TASK_STATES:
            assert task.finished_at == later(1) and task.lease_deadline is None
            assert "env" not in task.payload and task.payload["env_keys"] == ["TOKEN"]
        else:
            assert "env" in task.payload
    else:
        assert not moved and task.state == src
        assert AuditLog.objects.count() == before


@pytest.mark.django_db
def test_task14_an_answer_to_an_old_delivery_moves_nothing():
    host, _ = join("h1")
    task = _task_in("in_flight", host)
    AgentTask.objects.filter(pk=task.pk).update(attempt=2)
    assert not transition_task(task.pk, "done", now=T0, actor="test", attempt=1)
    assert transition_task(task.pk, "done", now=T0, actor="test", attempt=2)


@pytest.mark.django_db
def test_auth07_cancel_tasks_cancels_only_open_tasks_and_audits_each():
    host, _ = join("h1")
    pending, in_flight, done = (_task_in(s, host) for s in ("pending", "in_flight", "done"))
    cancelled = cancel_tasks(
        AgentTask.objects.filter(host=host), now=later(2), actor="user:ada", reason="test"
    )
    assert cancelled == [pending.pk, in_flight.pk]
    for task in (pending, in_flight, done):
        task.refresh_from_db()
    assert (pending.state, in_flight.state, done.state) == ("cancelled", "cancelled", "done")
    assert pending.error == "test" and "env" not in pending.payload
    rows = AuditLog.objects.filter(action="task.cancelled", actor="user:ada")
    assert sorted(int(r.target_id) for r in rows) == [pending.pk, in_flight.pk]


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), list(itertools.product(list(HostHealth), repeat=2)))
def test_host03_every_pair_of_health_values_is_checked(src, dst):
    """HOST-03/04: the one compare-and-set for a host's health, audited when it moves."""
    host, _ = join("h1")
    Host.objects.filter(pk=host.pk).update(health=src)  # the test's fixture row
    moved = transition_host_health(host.pk, dst, now=later(3), actor="test", reason="pair")
    host.refresh_from_db()
    if (src.value, dst.value) in HEALTH_EDGES:
        assert moved and host.health == dst and host.health_changed_at == later(3)
        assert AuditLog.objects.filter(action=f"host.{dst.value}", actor="test").count() == 1
    else:
        assert not moved and host.health == src


@pytest.mark.django_db
def test_host03_a_judgement_made_from_an_old_heartbeat_mark_moves_nothing():
    host, _ = join("h1")
    stale = host.last_heartbeat_at
    Host.objects.filter(pk=host.pk).update(last_heartbeat_at=later(1))  # a heartbeat landed
    assert not transition_host_health(
        host.pk, "unhealthy", now=later(2), actor="test", guard={"last_heartbeat_at": stale}
    )
    host.refresh_from_db()
    assert host.health == "healthy"


@pytest.mark.django_db
def test_auth07_the_migration_drops_the_env_of_tasks_that_finished_before_it():
    """No sweep blanks env any more, so rows finished before the change are blanked once."""

    migration = importlib.import_module("fleet.migrations.0003_drop_env_of_final_tasks")
    host, _ = join("h1")
    old_done = _task_in("pending", host)
    AgentTask.objects.filter(pk=old_done.pk).update(state="done")  # finished the old way
    still_open = _task_in("pending", host)
    migration.drop_env(apps, None)
    old_done.refresh_from_db()
    still_open.refresh_from_db()
    assert "env" not in old_done.payload and old_done.payload["env_keys"] == ["TOKEN"]
    assert "env" in still_open.payload
