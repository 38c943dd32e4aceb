"""A group of task results in one transaction (fleet.task_results.record_task_results,
issue 28) writes exactly what the same answers write one by one: the tasks, their runners,
the removes a failure queues, the host check, the audit trail and the events; and each
answer's refusal (another host's task, one not in flight, an old attempt) or failure is its
own, the rest commit. Then the route: results posted at once are closed together."""

from __future__ import annotations

import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError, connection

from accounts.models import AuditLog
from fleet import actions, agent_asgi, api
from fleet.models import AgentTask, Host
from fleet.task_results import TaskAnswer
from fleet.taskqueue import enqueue_task, take_tasks
from runners import host_facts
from runners.models import Runner
from tests.fleet.conftest import T0, join, later, make_runner
from tests.fleet.test_agent_hot_path import call
from tests.waiting import wait_until
from zoomies_site.core.models import Event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("registry_defaults")]
POOL_THREADS = 8


@pytest.fixture
def agent_pool(monkeypatch):
    """The agent routes' pool with room for every result of the test at once."""
    pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix=agent_asgi.THREAD_PREFIX)
    run = sync_to_async(agent_asgi._run_view, thread_sensitive=False, executor=pool)
    monkeypatch.setattr(agent_asgi, "_run_view_async", run)
    yield
    for _ in range(POOL_THREADS):
        pool.submit(agent_asgi.close_connections)
    pool.shutdown(wait=True)


def taken(host: Host, runner: Runner | None, kind: str) -> AgentTask:
    task = enqueue_task(host_id=host.pk, runner_id=runner.pk if runner else None, kind=kind,
                        payload={"runner_id": runner.pk if runner else None}, now=T0)  # fmt: skip
    (got,) = [t for t in take_tasks(host, later(1)) if t.pk == task.pk]
    return got


def a_burst_of_answers() -> list[TaskAnswer]:
    """The fleet, then one answer of every kind the route sees."""
    h1, _ = join("h1")
    h2, _ = join("h2")

    def answer(task, ok=True, error=None, *, host=h1, attempt=None, report=None):
        attempt = task.attempt if attempt is None else attempt
        return TaskAnswer(host=host, task_id=task.pk, ok=ok, error=error, attempt=attempt,
                          now=later(5), report=report)  # fmt: skip

    created = taken(h1, make_runner(h1, "provisioning"), "create_runner")
    failed_create = taken(h1, make_runner(h1, "provisioning"), "create_runner")
    failed_stop = taken(h1, make_runner(h1, "draining"), "stop_runner")
    removed = taken(h1, make_runner(h1, "failed"), "remove_runner")
    theirs = taken(h2, make_runner(h2, "provisioning"), "create_runner")
    redelivered = taken(h1, make_runner(h1, "provisioning"), "create_runner")
    broken = taken(h1, make_runner(h1, "provisioning"), "create_runner")
    check = host_checks_task(h1)
    # Last, as every take above takes all of h1's pending tasks.
    waiting = enqueue_task(host_id=h1.pk, runner_id=make_runner(h1, "draining").pk,
                           kind="stop_runner", payload={}, now=later(2))  # fmt: skip
    return [
        answer(created),
        answer(failed_create, False, "  the image could not be pulled "),
        answer(failed_stop, False, "docker: no such container"),
        answer(removed),
        answer(theirs),  # TASK-14: h1 answers h2's task
        answer(waiting, attempt=0),  # not in flight
        answer(redelivered, attempt=redelivered.attempt + 1),  # another delivery's answer
        answer(broken, False, "breaks the runners side"),
        answer(check, report={"engine.docker": "reachable", "clock": later(7).timestamp()}),
        answer(created),  # the same answer twice: the second is a conflict
    ]


def host_checks_task(host: Host) -> AgentTask:
    task = actions.request_host_check(host, now=later(1), actor="user:otto")
    (got,) = [t for t in take_tasks(host, later(2)) if t.pk == task.pk]
    return got


@pytest.fixture
def a_broken_runners_side(monkeypatch):
    real = host_facts.task_failed

    def task_failed(task, **kwargs):
        if kwargs["error"] == "breaks the runners side":
            raise RuntimeError("a bug in one row")
        return real(task, **kwargs)

    monkeypatch.setattr(host_facts, "task_failed", task_failed)


def state() -> dict:
    runners = {r.pk: f"{r.host.name if r.host else '-'}/{r.state}" for r in Runner.objects.all()}
    return {
        "tasks": Counter(
            (
                runners.get(t.runner_id, "-"),
                t.kind,
                t.state,
                t.error,
                t.finished_at is None,
                t.attempt,
            )
            for t in AgentTask.objects.all()
        ),  # fmt: skip
        "runners": Counter(runners.values()),
        "audits": Counter(
            (a.actor, a.action, a.detail.get("reason", "")) for a in AuditLog.objects.all()
        ),
        "events": Counter(e.kind for e in Event.objects.all()),
        "checks": [{**h.last_check, "task": "N"} for h in Host.objects.order_by("name")],
    }


def outcomes_as_text(outcomes) -> list[str]:
    return [
        re.sub(r"task \d+", "task N", f"{type(o).__name__}: {o}")
        if isinstance(o, Exception)
        else f"{o.kind} {o.state}"
        for o in outcomes
    ]


def one_by_one(answers: list[TaskAnswer]) -> list:
    outcomes = []
    for a in answers:
        try:
            outcomes.append(actions.record_task_result(host=a.host, task_id=a.task_id, ok=a.ok,
                                                       error=a.error, attempt=a.attempt,
                                                       now=a.now, report=a.report))  # fmt: skip
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


def wipe() -> None:
    for model in (AgentTask, Runner, AuditLog, Event, Host):
        model.objects.all().delete()


@pytest.mark.usefixtures("a_broken_runners_side")
def test_task14_run14_task05_a_group_writes_what_one_by_one_writes():
    alone = outcomes_as_text(one_by_one(a_burst_of_answers()))
    expected = state()
    wipe()
    answers = a_burst_of_answers()
    together = outcomes_as_text(actions.record_task_results(answers))
    assert together == alone
    assert state() == expected
    # What the burst holds, so the comparison is of something.
    assert together[0] == "create_runner done" and together[3] == "remove_runner done"
    assert together[1:3] == ["create_runner failed", "stop_runner failed"]
    assert together[4].startswith("TaskNotFound: ")
    assert together[5].startswith("TaskNotInFlight: ") and "pending" in together[5]
    assert together[6].startswith("TaskNotInFlight: ") and "attempt" in together[6]
    assert together[7] == "RuntimeError: a bug in one row"
    assert together[8] == "check_host done"
    assert together[9].startswith("TaskNotInFlight: ") and "done" in together[9]
    assert expected["checks"][0]["report"]["clock_skew_s"] == 2.0
    assert expected["runners"]["h1/failed"] >= 3  # RUN-14 and TASK-05 failed two runners
    broken = AgentTask.objects.get(pk=answers[7].task_id)
    assert (broken.state, broken.runner.state) == ("in_flight", "provisioning")  # undone alone


def test_a_group_whose_commit_the_database_refuses_raises_and_writes_nothing(monkeypatch):
    answers = a_burst_of_answers()
    before = state()

    def refuse() -> None:
        raise OperationalError("disk I/O error")

    monkeypatch.setattr(connection, "_commit", refuse)
    with pytest.raises(OperationalError, match="disk I/O error"):
        actions.record_task_results(answers)
    monkeypatch.undo()
    assert state() == before


@pytest.mark.usefixtures("agent_pool")
def test_results_posted_at_once_are_closed_together_and_each_is_answered(monkeypatch):
    host, token = join("h1")
    tasks = [taken(host, make_runner(host, "provisioning"), "create_runner") for _ in range(6)]
    groups: list[int] = []
    first_started, release = threading.Event(), threading.Event()
    alone, together = actions.record_task_result, actions.record_task_results

    def record_task_result(**kwargs):
        groups.append(1)
        first_started.set()
        assert release.wait(30)
        return alone(**kwargs)

    def record_task_results(answers):
        groups.append(len(answers))
        return together(answers)

    monkeypatch.setattr(actions, "record_task_result", record_task_result)
    monkeypatch.setattr(actions, "record_task_results", record_task_results)
    other = taken(join("h2")[0], None, "check_host")

    def post(task, ok=True):
        return call(f"/api/v1/agent/tasks/{task.pk}/result",
                    {"ok": ok, "attempt": task.attempt}, token=token)  # fmt: skip

    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(post, tasks[0])
        assert first_started.wait(30)
        rest = [pool.submit(post, t) for t in tasks[1:]] + [pool.submit(post, other)]
        wait_until(lambda: api._task_results.waiting() == 6, 30, "six results queued")
        release.set()
        answers = [first.result(60)] + [f.result(60) for f in rest]
    assert [a[0] for a in answers] == [200] * 6 + [404]
    assert all(a[2] == {"accepted": True} for a in answers[:6])
    assert "not a task of this host" in answers[6][2]["error"]
    assert groups == [1, 6], groups  # the first alone, the six that waited for it together
    assert set(
        AgentTask.objects.filter(pk__in=[t.pk for t in tasks]).values_list("state", flat=True)
    ) == {"done"}
