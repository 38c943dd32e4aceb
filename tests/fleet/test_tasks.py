"""The agent task queue: rows (TASK-01) delivered under leases (TASK-02/03), at most three
offers (TASK-04), what an abandoned stop and create do (TASK-05/06), the long-poll and its
one watcher per process (TASK-13), and a host's token reaching only its own tasks (TASK-14).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import OperationalError, connection
from django.db.backends.signals import connection_created
from django.test import AsyncRequestFactory

from accounts.models import AuditLog
from fleet import api, taskqueue, wakeups
from fleet.actions import record_heartbeat, set_host_cordon
from fleet.models import AgentTask
from fleet.task_results import record_task_result
from fleet.taskqueue import enqueue_task, sweep_tasks, take_tasks
from runners.actions import apply_agent_reports, drain_runner, fail_runner, reissue_owed_removes
from runners.actions import apply_agent_reports as apply_reports
from runners.housekeeping import fleet_step as housekeeping_step
from runners.housekeeping import sweep_task_leases
from runners.selectors import removes_owed
from tests.fleet.conftest import T0, join, later, make_runner
from tests.zoomies_site.test_wakebus import notify_from_another_process
from zoomies_site.core import wakebus

pytestmark = pytest.mark.usefixtures("registry_defaults")

LEASES = {"create_runner": 20, "stop_runner": 10, "remove_runner": 5}  # minutes, TASK-03


def enqueue(host, runner, kind: str = "create_runner", now=T0) -> AgentTask:
    return enqueue_task(
        host_id=host.pk,
        runner_id=runner.pk if runner else None,
        kind=kind,
        payload={"runner_id": runner.pk if runner else None},
        now=now,
    )


# -- leases and attempts, on a moved clock -----------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["create_runner", "stop_runner", "remove_runner"])
def test_task02_03_04_a_task_is_offered_three_times_under_its_lease_then_abandoned(kind):
    """TASK-02, TASK-03, TASK-04: leases of 20/10/5 min, three offers, then abandoned."""
    host, _ = join("h1")
    runner = make_runner(host, "draining" if kind == "stop_runner" else "provisioning")
    task = enqueue(host, runner, kind)
    lease = timedelta(minutes=LEASES[kind])
    now = T0
    for attempt in (1, 2, 3):
        (taken,) = take_tasks(host, now)
        assert (taken.pk, taken.attempt, taken.state) == (task.pk, attempt, "in_flight")
        assert taken.lease_deadline == now + lease
        assert taken.taken_at == now
        assert take_tasks(host, now) == []  # in flight: not offered twice at once
        assert sweep_tasks(now + lease - timedelta(seconds=1)).lines == []
        now += lease
        swept = sweep_tasks(now)
        assert len(swept.lines) == 1
        assert [t.pk for t in swept.abandoned] == ([task.pk] if attempt == 3 else [])
    task.refresh_from_db()
    # The host is given up on after 1 h (create), 30 min (stop) or 15 min (remove).
    assert task.state == "abandoned"
    assert now - T0 == 3 * lease
    assert task.finished_at == now
    assert task.pk not in [t.pk for t in take_tasks(host, now)]
    assert AuditLog.objects.filter(action="task.requeued").count() == 2
    assert AuditLog.objects.filter(action="task.abandoned").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["stream_logs", "cancel_logs"])
def test_task07_a_log_relay_task_is_never_put_back_when_its_lease_ends(kind):
    """TASK-07: the browser that asked may be gone by then; the relay is offered once."""
    host, _ = join("h1")
    task = enqueue(host, make_runner(host, "idle"), kind)
    (taken,) = take_tasks(host, T0)
    assert taken.pk == task.pk and taken.max_attempts == 1
    after = taken.lease_deadline + timedelta(seconds=1)
    swept = sweep_tasks(after)
    assert [t.pk for t in swept.abandoned] == [task.pk]
    assert take_tasks(host, after) == []  # not offered again
    task.refresh_from_db()
    assert task.state == "abandoned"
    assert not AuditLog.objects.filter(action="task.requeued").exists()


@pytest.mark.django_db
def test_task05_an_abandoned_stop_fails_its_runner():
    host, _ = join("h1")
    runner = make_runner(host, "idle")
    drain_runner(runner, now=T0, actor="user:ada", reason="test")
    now = T0
    for _ in range(3):
        assert take_tasks(host, now)
        now += timedelta(minutes=10)
        reasons = sweep_task_leases(now)
    runner.refresh_from_db()
    assert runner.state == "failed"
    assert runner.message == "host never confirmed the stop after 3 attempts"
    assert any("failed" in r for r in reasons)
    # Its workload is still to be removed (a failed runner's remove task).
    assert AgentTask.objects.filter(runner=runner, kind="remove_runner", state="pending").exists()


@pytest.mark.django_db
def test_task06_an_abandoned_create_is_left_to_the_provision_timeout():
    host, _ = join("h1")
    runner = make_runner(host, "provisioning")
    enqueue(host, runner)
    now = T0
    for _ in range(3):
        assert take_tasks(host, now)
        now += timedelta(minutes=20)
        reasons = sweep_task_leases(now)
    assert "provision timeout" in reasons[-1]
    runner.refresh_from_db()
    assert runner.state == "provisioning"


@pytest.mark.django_db
def test_task01_tasks_are_rows_that_survive_a_restart():
    host, _ = join("h1")
    runner = make_runner(host)
    task = enqueue(host, runner)
    take_tasks(host, T0)
    # A "restart" is nothing but a new process reading the rows: all of it is there.
    row = AgentTask.objects.get(pk=task.pk)
    assert (row.kind, row.host_id, row.runner_id, row.attempt, row.state) == (
        "create_runner",
        host.pk,
        runner.pk,
        1,
        "in_flight",
    )
    assert row.lease_deadline == T0 + timedelta(minutes=20)
    assert row.payload == {"runner_id": runner.pk}


@pytest.mark.django_db
def test_tasks_are_taken_oldest_first_and_only_the_hosts_own():
    host, _ = join("h1")
    other, _ = join("h2")
    first = enqueue(host, make_runner(host), now=T0)
    second = enqueue(host, make_runner(host), "remove_runner", now=later(1))
    theirs = enqueue(other, make_runner(other), now=T0)
    assert [t.pk for t in take_tasks(host, later(2))] == [first.pk, second.pk]
    assert [t.pk for t in take_tasks(other, later(2))] == [theirs.pk]


@pytest.mark.django_db
def test_task02_a_take_is_one_guarded_update_a_task(django_assert_max_num_queries, monkeypatch):
    """Issue 28: a poll's take of ten tasks is a read, one compare-and-set UPDATE a task and
    a read of what it took (four statements a task before: a savepoint, a fresh read, the
    UPDATE, the release), each stamped as a delivery; a task another poll took meanwhile
    (its attempt moved on) is not taken twice."""
    host, _ = join("h1")
    tasks = [enqueue(host, make_runner(host), now=later(i)) for i in range(10)]
    AgentTask.objects.filter(pk=tasks[3].pk).update(attempt=1)  # "the other poll", as read
    real_take = taskqueue.take_pending_tasks

    def stale_for_one(candidates, *, now):
        for task in candidates:
            if task.pk == tasks[3].pk:
                task.attempt = 0  # this poll read it before the other took it
        return real_take(candidates, now=now)

    monkeypatch.setattr(taskqueue, "take_pending_tasks", stale_for_one)
    with django_assert_max_num_queries(10 + 6):
        taken = take_tasks(host, later(20))
    assert [t.pk for t in taken] == [t.pk for i, t in enumerate(tasks) if i != 3]
    for task in taken:
        assert (task.state, task.attempt, task.taken_at) == ("in_flight", 1, later(20))
        assert task.lease_deadline == later(20) + timedelta(seconds=task.lease_seconds)
    assert AgentTask.objects.get(pk=tasks[3].pk).state == "pending"


@pytest.mark.django_db
def test_agent06_a_create_for_a_draining_or_ended_runner_is_cancelled_not_delivered():
    """AGENT-06: the drain or failure cancels the pending create in its own transaction."""
    host, _ = join("h1")
    draining = make_runner(host, "provisioning")
    failed = make_runner(host, "provisioning")
    live = make_runner(host, "provisioning")
    for runner in (draining, failed, live):
        enqueue(host, runner)
    drain_runner(draining, now=T0, actor="user:ada", reason="test")
    fail_runner(failed, now=T0, actor="user:ada", message="test")
    taken = take_tasks(host, T0)
    assert [(t.runner_id, t.kind) for t in taken if t.kind == "create_runner"] == [
        (live.pk, "create_runner")
    ]
    assert set(AgentTask.objects.filter(state="cancelled").values_list("runner_id", flat=True)) == {
        draining.pk,
        failed.pk,
    }


# -- over HTTP ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_task14_a_host_cannot_take_or_answer_another_hosts_task(agent_api):
    host, token = join("h1")
    other, other_token = join("h2")
    task = enqueue(other, make_runner(other))
    assert agent_api.get("tasks?wait=0", token=token).json() == {"tasks": []}
    taken = agent_api.get("tasks?wait=0", token=other_token).json()["tasks"]
    assert [t["id"] for t in taken] == [task.pk]
    answer = agent_api.post(f"tasks/{task.pk}/result", {"ok": True, "attempt": 1}, token=token)
    assert answer.status_code == 404 and answer.json()["error"]
    task.refresh_from_db()
    assert task.state == "in_flight"
    mine = agent_api.post(
        f"tasks/{task.pk}/result", {"ok": True, "error": None, "attempt": 1}, token=other_token
    )
    assert mine.status_code == 200 and mine.json() == {"accepted": True}
    task.refresh_from_db()
    assert task.state == "done"


@pytest.mark.django_db(transaction=True)
def test_a_result_for_a_task_not_in_flight_or_an_old_attempt_is_409(agent_api):
    host, token = join("h1")
    task = enqueue(host, make_runner(host))
    assert agent_api.post(f"tasks/{task.pk}/result", {"ok": True}, token=token).status_code == 409
    take_tasks(host, T0)
    AgentTask.objects.filter(pk=task.pk).update(lease_deadline=T0)
    sweep_tasks(later(1))
    take_tasks(host, later(2))  # attempt 2 in flight; attempt 1 answers late
    late = agent_api.post(f"tasks/{task.pk}/result", {"ok": True, "attempt": 1}, token=token)
    assert late.status_code == 409
    ok = agent_api.post(f"tasks/{task.pk}/result", {"ok": True, "attempt": 2}, token=token)
    assert ok.status_code == 200
    again = agent_api.post(f"tasks/{task.pk}/result", {"ok": True, "attempt": 2}, token=token)
    assert again.status_code == 409
    assert agent_api.post(f"tasks/{task.pk}/result", {"ok": "yes"}, token=token).status_code == 400
    assert agent_api.post("tasks/999999/result", {"ok": True}, token=token).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_run14_a_failed_create_fails_the_runner_with_the_agents_reason(agent_api):
    host, token = join("h1")
    runner = make_runner(host)
    enqueue(host, runner)
    (task,) = agent_api.get("tasks?wait=0", token=token).json()["tasks"]
    assert task["kind"] == "create_runner" and task["attempt"] == 1
    assert task["runner_id"] == runner.pk and task["payload"] == {"runner_id": runner.pk}
    answer = agent_api.post(
        f"tasks/{task['id']}/result",
        {"ok": False, "error": "image zoomies/runner:1 not found", "attempt": 1},
        token=token,
    )
    assert answer.status_code == 200
    runner.refresh_from_db()
    assert runner.state == "failed"
    assert runner.message == "image zoomies/runner:1 not found"
    row = AgentTask.objects.get(pk=task["id"])
    assert (row.state, row.error) == ("failed", "image zoomies/runner:1 not found")


@pytest.mark.django_db(transaction=True)
def test_the_long_poll_answers_at_once_when_a_task_is_pending(agent_api):
    """ARCH-07: work reaches the agent on a request the agent opened."""
    host, token = join("h1")
    task = enqueue(host, make_runner(host))
    # Held for its whole 30 s wait, the poll would outlast the client's 20 s and fail.
    answer = agent_api.get("tasks?wait=30", token=token, timeout=20)
    assert [t["id"] for t in answer.json()["tasks"]] == [task.pk]


@pytest.mark.django_db(transaction=True)
def test_issue21_item6_the_tasks_carry_the_hosts_cordon_as_of_their_take(agent_api):
    """Issue 21 item 6: a create placed just after an uncordon reaches the agent with the
    uncordon, not a heartbeat later (when it failed "the host is cordoned")."""
    host, token = join("h1")
    set_host_cordon(host=host, cordoned=True, now=T0, actor="user:op")
    set_host_cordon(host=host, cordoned=False, now=later(1), actor="user:op")
    task = enqueue(host, make_runner(host))
    answer = agent_api.get("tasks?wait=0", token=token).json()
    assert ([t["id"] for t in answer["tasks"]], answer["cordoned"]) == ([task.pk], False)
    set_host_cordon(host=host, cordoned=True, now=later(2), actor="user:op")
    enqueue(host, make_runner(host))
    assert agent_api.get("tasks?wait=0", token=token).json()["cordoned"] is True


@pytest.mark.django_db(transaction=True)
def test_the_long_poll_answers_empty_after_the_wait_and_needs_a_token(agent_api, monkeypatch):
    host, token = join("h1")
    waits: list[tuple[int, float, bool]] = []
    real_wait = wakeups.wait_for_work

    async def recorded_wait(host_id: int, timeout: float) -> bool:
        woken = await real_wait(host_id, timeout)
        waits.append((host_id, timeout, woken))
        return woken

    takes: list[int] = []
    real_take = api._take

    def counted_take(host_id, polled_at):
        takes.append(host_id)
        return real_take(host_id, polled_at)

    monkeypatch.setattr(wakeups, "wait_for_work", recorded_wait)
    monkeypatch.setattr(api, "_take", counted_take)
    answer = agent_api.get("tasks?wait=1", token=token)
    assert answer.status_code == 200 and answer.json() == {"tasks": []}
    # One look when the poll came in; a wait that ran out unwoken does not look again.
    assert takes == [host.pk]
    # The wait is honoured: rather than answering at once, the poll handed the rest of its
    # second to the watcher, which was never woken (the answer came when that wait ran out).
    assert waits and 0 < waits[0][1] <= 1
    assert {(h, woken) for h, _timeout, woken in waits} == {(host.pk, False)}
    assert agent_api.get("tasks?wait=1").status_code == 401
    assert agent_api.get("tasks?wait=soon", token=token).status_code == 400


def poll_in_background(agent_api, token: str, wait: float = 10) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        out["answer"] = agent_api.get(f"tasks?wait={wait}", token=token)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def wait_until_waiting(host_ids: set[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not host_ids <= set(wakeups.watcher.waiting_hosts()):
        assert time.monotonic() < deadline, "the poll never started waiting"
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)
def test_task13_an_enqueue_in_this_process_wakes_a_waiting_poll(agent_api, monkeypatch):
    """TASK-13: the enqueue's own hint wakes the poll: with the watcher blinded, only the
    hint can end the 30 s wait before the test's 20 s deadline."""
    monkeypatch.setattr(wakeups.watcher, "_look", lambda host_ids: set())
    host, token = join("h1")
    thread, out = poll_in_background(agent_api, token, wait=30)
    wait_until_waiting({host.pk})
    task = enqueue(host, make_runner(host))
    thread.join(20)
    assert not thread.is_alive(), "the enqueue did not wake the waiting poll"
    assert [t["id"] for t in out["answer"].json()["tasks"]] == [task.pk]


@pytest.mark.django_db(transaction=True)
def test_task13_a_task_written_by_another_process_is_found_by_the_watcher(agent_api, monkeypatch):
    host, token = join("h1")
    # Another process's enqueue cannot call this process's notify hook: only the watcher's
    # look can find the task.
    monkeypatch.setattr("fleet.taskqueue.notify_host_on_commit", lambda host_id: None)
    thread, out = poll_in_background(agent_api, token, wait=30)
    wait_until_waiting({host.pk})
    task = enqueue(host, make_runner(host))
    thread.join(20)
    assert not thread.is_alive(), "the watcher did not wake the waiting poll"
    assert [t["id"] for t in out["answer"].json()["tasks"]] == [task.pk]


@pytest.mark.django_db(transaction=True)
def test_task13_many_waiting_agents_share_one_watcher_and_one_query_per_look(
    agent_api, monkeypatch
):
    looked_at: list[set[int]] = []
    real_look = wakeups.watcher._look

    def recording_look(host_ids):
        looked_at.append(set(host_ids))
        return real_look(host_ids)

    monkeypatch.setattr(wakeups.watcher, "_look", recording_look)
    hosts = [join(f"h{i}") for i in range(4)]
    everyone = {host.pk for host, _ in hosts}
    polls = [poll_in_background(agent_api, token, wait=10) for _, token in hosts]
    wait_until_waiting(everyone)
    # Each look is one query for every waiting host at once, not one per agent.
    deadline = time.monotonic() + 30
    while not any(look == everyone for look in looked_at):
        assert time.monotonic() < deadline, f"no look covered all four hosts: {looked_at}"
        time.sleep(0.02)
    watchers = [t for t in threading.enumerate() if t.name == "zoomies-task-watcher"]
    assert len(watchers) == 1
    # Each poll ends on its own 10 s wait; the join allows for a loaded machine (on CI's, four
    # xdist workers on two cores, one took longer than a 10 s join).
    for thread, out in polls:
        thread.join(40)
        assert not thread.is_alive(), "a 10 s long-poll was still open after 40 s more"
        assert out["answer"].json() == {"tasks": []}


@pytest.mark.django_db(transaction=True)
def test_task13_the_long_poll_never_queues_on_the_shared_sync_thread(monkeypatch):
    """TASK-13: under ASGI every thread-sensitive sync call shares one thread; the long-poll's
    database calls must not wait behind it (a slow admin page would stall every agent).
    They run on the poll's own threads, which keep their connections: thirty polls open
    no more connections than there are threads (issue 12: a connection per call was the
    web server's first cost at 1,000 agents)."""

    host, token = join("h1")
    task = enqueue(host, make_runner(host))
    opened_on: list[str] = []

    def record(sender, connection, **kwargs):
        opened_on.append(threading.current_thread().name)

    async def scenario():
        gate = threading.Event()
        # Hog the one thread-sensitive thread, as a slow sync view would.
        hog = asyncio.ensure_future(sync_to_async(gate.wait)(10))
        await asyncio.sleep(0.1)

        async def poll():
            request = AsyncRequestFactory().get(
                "/api/v1/agent/tasks", {"wait": "0"}, headers={"Authorization": f"Bearer {token}"}
            )
            return await asyncio.wait_for(api.tasks(request), timeout=3)

        try:
            first = await poll()
            rest = [await poll() for _ in range(29)]
            return first, rest
        finally:
            gate.set()
            await hog

    connection_created.connect(record)
    try:
        first, rest = async_to_sync(scenario)()
    finally:
        connection_created.disconnect(record)
    assert first.status_code == 200
    assert [t["id"] for t in json.loads(first.content)["tasks"]] == [task.pk]
    assert all(r.status_code == 200 and json.loads(r.content) == {"tasks": []} for r in rest)
    assert opened_on, "the polls opened no connection of their own"
    assert all(name.startswith(api.POLL_THREAD_PREFIX) for name in opened_on), opened_on
    assert len(opened_on) <= api.POLL_THREADS, opened_on


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("fault", "status"),
    [
        (OperationalError("database is locked"), 503),  # busy, or dropped: the agent retries
        (OperationalError("no such table: fleet_agenttask"), None),  # a fault stays a fault
    ],
    ids=["busy", "fault"],
)
def test_task13_a_poll_threads_failed_call_closes_its_connection(monkeypatch, fault, status):
    """A long-poll call that fails gives its thread's connection up, so the next call on that
    thread opens a fresh one rather than reusing one a database restart may have broken. A
    busy or dropped database is a 503 with Retry-After (never a 500), as on the POST routes."""
    host, token = join("h1")
    calls = {"n": 0}
    real = api.take_tasks

    def fail_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise fault
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "take_tasks", fail_once)
    closed: list[str] = []
    real_release = api._release_connection

    def release():
        closed.append(threading.current_thread().name)
        real_release()

    monkeypatch.setattr(api, "_release_connection", release)

    def poll():
        request = AsyncRequestFactory().get(
            "/api/v1/agent/tasks", {"wait": "0"}, headers={"Authorization": f"Bearer {token}"}
        )
        return async_to_sync(api.tasks)(request)

    if status is None:
        with pytest.raises(OperationalError, match="no such table"):
            poll()
    else:
        answer = poll()
        assert answer.status_code == status
        assert answer["Retry-After"] == str(api.BUSY_RETRY_AFTER_SECONDS)
    assert len(closed) == 1 and closed[0].startswith(api.POLL_THREAD_PREFIX)
    assert json.loads(poll().content) == {"tasks": []}
    assert len(closed) == 1  # a call that succeeds keeps its connection


# -- stops and removes that failed: rebuilt from rows on every tick (TASK-05, TASK-08) -----


def answer(host, task, *, ok: bool, now, error: str | None = None):

    return record_task_result(
        host=host, task_id=task.pk, ok=ok, error=error, attempt=task.attempt, now=now
    )


def tick(host, now) -> list[str]:
    """One housekeeping tick on a moved clock, the host heartbeating as a live one does."""

    record_heartbeat(host=host, facts={}, now=now)
    return housekeeping_step(now)


def removes(runner) -> list[AgentTask]:
    return list(AgentTask.objects.filter(runner=runner, kind="remove_runner").order_by("pk"))


@pytest.mark.django_db
def test_task05_a_failed_stop_fails_its_runner_and_asks_the_host_for_a_remove():
    """TASK-05: a stop the host answered with a failure fails the runner at once (nothing
    else would end it), which frees its slot and queues the removal of its workload."""
    host, _ = join("h1")
    runner = make_runner(host, "busy")
    drain_runner(runner, now=T0, actor="user:ada", reason="test")
    (stop,) = take_tasks(host, later(1))
    answer(host, stop, ok=False, error="cannot signal runner 5: permission denied", now=later(2))

    runner.refresh_from_db()
    assert runner.state == "failed"
    assert runner.message == "the host could not stop the runner: cannot signal runner 5: " + (
        "permission denied"
    )
    assert [t.state for t in removes(runner)] == ["pending"]


@pytest.mark.django_db
def test_task05_a_draining_runner_never_reported_gone_after_its_stop_is_failed():
    """TASK-05: the host confirmed the stop but never reported the runner's end; a stop lease
    (10 min) after that answer the runner is failed and its workload's removal queued."""
    host, _ = join("h1")
    runner = make_runner(host, "idle")
    drain_runner(runner, now=T0, actor="user:ada", reason="test")
    (stop,) = take_tasks(host, later(1))
    answer(host, stop, ok=True, now=later(minutes=1))

    assert tick(host, later(minutes=10, seconds=59)) == []
    runner.refresh_from_db()
    assert runner.state == "draining"
    lines = tick(host, later(minutes=11))
    runner.refresh_from_db()
    assert runner.state == "failed"
    assert runner.message == "the host never reported the runner gone after its stop"
    assert lines == [f"runner {runner.name} failed: {runner.message}"]
    assert [t.state for t in removes(runner)] == ["pending"]


@pytest.mark.django_db
def test_task05_a_draining_runner_whose_end_was_reported_is_left_alone():

    host, _ = join("h1")
    runner = make_runner(host, "idle")
    other = make_runner(host, "idle")
    for r in (runner, other):
        drain_runner(r, now=T0, actor="user:ada", reason="test")
    for stop in take_tasks(host, later(1)):
        answer(host, stop, ok=True, now=later(minutes=1))
    apply_reports(
        host=host,
        reports=[{"runner_id": runner.pk, "state": "removed", "phase": "exited", "exit_code": 0}],
        now=later(minutes=2),
    )
    tick(host, later(minutes=30))
    runner.refresh_from_db()
    other.refresh_from_db()
    assert (runner.state, other.state) == ("removed", "failed")


@pytest.mark.django_db
def test_task08_a_failed_remove_is_issued_again_until_the_host_confirms_one():
    """TASK-08: a failed remove is issued again a minute after it failed (doubling for each
    further failure), from the rows alone, until a remove succeeds; then nothing more."""

    host, _ = join("h1")
    runner = make_runner(host, "idle")
    fail_runner(runner, now=T0, actor="user:ada", message="test")
    (first,) = take_tasks(host, T0)
    answer(host, first, ok=False, error="device or resource busy", now=later(10))

    assert tick(host, later(69)) == []  # a minute after the failure, not before
    lines = tick(host, later(70))
    assert len(lines) == 1 and "issued again (retry 1)" in lines[0]
    second = removes(runner)[-1]
    assert (second.state, second.payload) == ("pending", {"runner_id": runner.pk, "retry": 1})
    assert tick(host, later(71)) == []  # one open remove at a time
    assert AuditLog.objects.filter(action="task.reissued", actor="system:housekeeping").exists()

    (taken,) = take_tasks(host, later(80))
    answer(host, taken, ok=False, error="device or resource busy", now=later(90))
    assert tick(host, later(90 + 119)) == []  # the second failure waits two minutes
    assert tick(host, later(90 + 120))
    (taken,) = take_tasks(host, later(300))
    assert taken.payload["retry"] == 2
    answer(host, taken, ok=True, now=later(310))

    assert tick(host, later(minutes=30)) == []
    assert [t.state for t in removes(runner)] == ["failed", "failed", "done"]


@pytest.mark.django_db
def test_task08_an_abandoned_remove_is_issued_again():
    """TASK-08: a remove offered three times without a result (15 min) is issued again."""

    host, _ = join("h1")
    runner = make_runner(host, "idle")
    fail_runner(runner, now=T0, actor="user:ada", message="test")
    now = T0
    for _ in range(3):
        assert take_tasks(host, now)
        now += timedelta(minutes=5)
        tick(host, now)
    assert [t.state for t in removes(runner)] == ["abandoned"]
    assert tick(host, now + timedelta(seconds=59)) == []
    assert tick(host, now + timedelta(minutes=1))
    assert [t.state for t in removes(runner)] == ["abandoned", "pending"]


@pytest.mark.django_db
def test_task08_no_remove_is_owed_once_the_agent_reported_the_end_or_the_host_was_lost():
    """TASK-08, AGENT-18: an agent that reported a runner's end deletes its workload itself;
    a lost host is given up on. Neither is sent another remove."""

    host, _ = join("h1")
    lost, _ = join("h2")
    ended = make_runner(host, "idle")
    on_lost = make_runner(lost, "idle")
    for runner in (ended, on_lost):
        fail_runner(runner, now=T0, actor="user:ada", message="test")
    for h in (host, lost):
        for task in take_tasks(h, T0):
            answer(h, task, ok=False, error="boom", now=later(1))
    assert set(removes_owed().values_list("pk", flat=True)) == {ended.pk, on_lost.pk}

    apply_reports(
        host=host,
        reports=[{"runner_id": ended.pk, "state": "failed", "phase": "exited", "exit_code": 1}],
        now=later(2),
    )
    lost.__class__.objects.filter(pk=lost.pk).update(health="lost")
    assert list(removes_owed()) == []
    assert reissue_owed_removes(later(minutes=5)) == []


# -- runner credentials at rest (AUTH-07, SEC-05) ------------------------------------------

JIT = "eyJqaXQiOiAidGhlLXJ1bm5lcnMtb25lLWNyZWRlbnRpYWwifQ=="


def enqueue_create_with_jit(host, runner, now=T0) -> AgentTask:
    """A create task as the reconcile pass enqueues it: the JIT config in plain text."""
    return enqueue_task(
        host_id=host.pk,
        runner_id=runner.pk,
        kind="create_runner",
        payload={"runner_id": runner.pk, "env": {"ACTIONS_RUNNER_INPUT_JITCONFIG": JIT}},
        now=now,
    )


def row_text(task: AgentTask) -> str:
    task.refresh_from_db()
    return json.dumps(task.payload)


@pytest.mark.django_db(transaction=True)
def test_auth07_a_jit_config_is_sealed_in_the_row_plain_for_its_agent_and_gone_when_done(
    agent_api,
):
    """AUTH-07, SEC-05: the task row never holds the JIT config in plain text; the agent's
    long-poll answer carries it plain; a finished task holds it in no form at all."""
    host, token = join("h1")
    task = enqueue_create_with_jit(host, make_runner(host))
    assert JIT not in row_text(task)
    assert task.payload["env"]["ACTIONS_RUNNER_INPUT_JITCONFIG"].startswith("sealed:v1:")

    (served,) = agent_api.get("tasks?wait=0", token=token).json()["tasks"]
    assert served["payload"]["env"] == {"ACTIONS_RUNNER_INPUT_JITCONFIG": JIT}
    assert JIT not in row_text(task)  # serving it changes nothing stored

    answer = agent_api.post(f"tasks/{task.pk}/result", {"ok": True, "attempt": 1}, token=token)
    assert answer.status_code == 200
    text = row_text(task)
    assert "sealed:" not in text and JIT not in text
    assert task.payload == {
        "runner_id": task.runner_id,
        "env_keys": ["ACTIONS_RUNNER_INPUT_JITCONFIG"],
    }


@pytest.mark.django_db
def test_auth07_a_redelivered_task_still_has_its_env_and_an_abandoned_one_loses_it():
    host, _ = join("h1")
    task = enqueue_create_with_jit(host, make_runner(host))
    now = T0
    for _ in range(3):
        (taken,) = take_tasks(host, now)
        assert taken.payload["env"]["ACTIONS_RUNNER_INPUT_JITCONFIG"].startswith("sealed:")
        now += timedelta(minutes=20)
        sweep_tasks(now)
    task.refresh_from_db()
    assert task.state == "abandoned"
    assert "env" not in task.payload and "sealed:" not in row_text(task)


@pytest.mark.django_db
def test_auth07_a_cancelled_task_loses_its_env_in_the_cancel_itself():
    """AUTH-07: every cancel (a drain's, a failure's, a rejoin's, an end report's) goes
    through `cancel_tasks`, which drops the credential in the same UPDATE and audits it: no
    sweep is needed to blank env afterwards."""
    host, _ = join("h1")
    drained = make_runner(host, "idle")
    drain_create = enqueue_create_with_jit(host, drained)
    drain_runner(drained, now=T0, actor="user:ada", reason="test")

    failed = make_runner(host, "provisioning")
    fail_create = enqueue_create_with_jit(host, failed)
    fail_runner(failed, now=T0, actor="user:ada", message="test")

    reported = make_runner(host, "provisioning")
    report_create = enqueue_create_with_jit(host, reported)
    apply_agent_reports(host=host, reports=[{"runner_id": reported.pk, "state": "failed"}], now=T0)

    rejoined = make_runner(host, "provisioning")
    rejoin_create = enqueue_create_with_jit(host, rejoined)
    join("h1")

    for task in (drain_create, fail_create, report_create, rejoin_create):
        task.refresh_from_db()
        assert task.state == "cancelled", task
        assert "env" not in task.payload and "sealed:" not in row_text(task)
        assert task.payload["env_keys"] == ["ACTIONS_RUNNER_INPUT_JITCONFIG"]
        assert AuditLog.objects.filter(
            action="task.cancelled", target_id=str(task.pk), actor__in=["user:ada", "agent:h1"]
        ).exists()


@pytest.mark.django_db(transaction=True)
def test_auth07_a_task_whose_env_cannot_be_unsealed_fails_its_runner(agent_api):
    """A task sealed under another key is not delivered as garbage: it fails, and so does its
    create's runner (RUN-14), with a message saying why."""
    host, token = join("h1")
    runner = make_runner(host)
    task = enqueue_create_with_jit(host, runner)
    AgentTask.objects.filter(pk=task.pk).update(
        payload={"runner_id": runner.pk, "env": {"JIT": "sealed:v1:bm90LXNlYWxlZC1oZXJl"}}
    )
    assert agent_api.get("tasks?wait=0", token=token).json() == {"tasks": []}
    task.refresh_from_db()
    runner.refresh_from_db()
    assert task.state == "failed" and "cannot unseal" in task.error
    assert runner.state == "failed" and "cannot unseal" in runner.message
    assert "env" not in task.payload


@pytest.mark.django_db(transaction=True)
def test_task13_a_task_from_another_process_wakes_the_watcher_through_the_bus(
    agent_api, monkeypatch
):
    """TASK-13: a task written by another process (a worker's reconcile pass) reaches a
    waiting long-poll by that process's wake, not by the watcher's interval (60 s here)."""
    monkeypatch.setattr(wakeups.watcher, "interval", 60)
    monkeypatch.setattr("fleet.taskqueue.notify_host_on_commit", lambda host_id: None)
    real_look = wakeups.watcher._look
    sent = threading.Event()
    looks_while_blind = []

    def look_after_the_wake(host_ids):
        if not sent.is_set():
            looks_while_blind.append(1)
            return set()
        return real_look(host_ids)

    monkeypatch.setattr(wakeups.watcher, "_look", look_after_the_wake)
    host, token = join("h1")
    thread, out = poll_in_background(agent_api, token, wait=50)
    wait_until_waiting({host.pk})
    task = enqueue(host, make_runner(host))
    # Once the watcher has looked (blind) since the poll began waiting, it is in its 60 s
    # pause, which only a wake can end before the test's deadline.
    deadline = time.monotonic() + 30
    while not looks_while_blind:
        assert time.monotonic() < deadline, "the watcher never looked"
        time.sleep(0.02)
    sent.set()
    directory = wakebus.bus_directory(connection.settings_dict)
    assert notify_from_another_process(wakebus.AGENT_TASKS, directory) >= 1
    thread.join(20)
    assert not thread.is_alive(), "the wake did not cut the watcher's pause short"
    assert [t["id"] for t in out["answer"].json()["tasks"]] == [task.pk]
