"""`POST tasks/results`: an agent's results together, one request and one transaction, each
answered as `tasks/{id}/result` would have answered it alone (TASK-14, RUN-14, issue 28)."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from fleet import protocol
from fleet.models import AgentTask
from fleet.taskqueue import sweep_tasks, take_tasks
from runners import host_facts
from tests.fleet.conftest import T0, join, later, make_runner
from tests.fleet.test_tasks import enqueue

pytestmark = pytest.mark.usefixtures("registry_defaults")


def states(*tasks: AgentTask) -> list[str]:
    return [AgentTask.objects.get(pk=t.pk).state for t in tasks]


@pytest.mark.django_db(transaction=True)
def test_task14_run14_each_result_of_a_batch_is_answered_as_it_would_be_alone(agent_api):
    host, token = join("h1")
    other, _ = join("h2")
    done, failing, late, fine = (enqueue(host, make_runner(host)) for _ in range(4))
    theirs = enqueue(other, make_runner(other))
    take_tasks(host, T0)
    take_tasks(other, T0)
    AgentTask.objects.filter(pk=late.pk).update(lease_deadline=T0)
    sweep_tasks(later(1))
    take_tasks(host, later(2))  # `late` is in flight as attempt 2; attempt 1 answers below
    body = {
        "results": [
            {"id": done.pk, "ok": True, "attempt": 1},
            {"id": failing.pk, "ok": False, "error": "image not found", "attempt": 1},
            {"id": theirs.pk, "ok": True, "attempt": 1},
            {"id": done.pk, "ok": True, "attempt": 1},  # answered a moment ago
            {"id": 999999, "ok": True},
            {"id": late.pk, "ok": True, "attempt": 1},
            {"id": fine.pk, "ok": True, "error": None, "attempt": 1},
        ]
    }
    answer = agent_api.post("tasks/results", body, token=token)
    assert answer.status_code == 200
    outcomes = protocol.TaskResultsAnswer.from_json(answer.json()).results
    assert [(o.id, o.accepted, o.status) for o in outcomes] == [
        (done.pk, True, None),
        (failing.pk, True, None),
        (theirs.pk, False, 404),
        (done.pk, False, 409),
        (999999, False, 404),
        (late.pk, False, 409),
        (fine.pk, True, None),
    ]
    assert outcomes[3].error == f"task {done.pk} is done, not in flight"
    assert outcomes[5].error == f"task {late.pk} is in flight as attempt 2, not 1"
    assert states(done, failing, late, fine, theirs) == [
        "done", "failed", "in_flight", "done", "in_flight"
    ]  # fmt: skip
    runner = AgentTask.objects.get(pk=failing.pk).runner
    assert (runner.state, runner.message) == ("failed", "image not found")  # RUN-14


@pytest.mark.django_db(transaction=True)
def test_a_busy_database_mid_batch_keeps_none_of_it_and_answers_503(agent_api, monkeypatch):
    """The agent posts the whole batch again after a 503, so what the 503 answered must
    not be half recorded."""
    host, token = join("h1")
    first, second = (enqueue(host, make_runner(host)) for _ in range(2))
    take_tasks(host, T0)

    def locked(*args, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(host_facts, "task_failed", locked)  # the second result's step
    body = {
        "results": [
            {"id": first.pk, "ok": True, "attempt": 1},
            {"id": second.pk, "ok": False, "error": "no room", "attempt": 1},
        ]
    }
    answer = agent_api.post("tasks/results", body, token=token)
    assert answer.status_code == 503 and answer.headers["Retry-After"]
    assert states(first, second) == ["in_flight", "in_flight"]
    monkeypatch.undo()
    again = agent_api.post("tasks/results", body, token=token)
    assert [o["accepted"] for o in again.json()["results"]] == [True, True]
    assert states(first, second) == ["done", "failed"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "results"),
        ({"results": []}, "results"),
        ({"results": {"id": 1}}, "results"),
        ({"results": [{"id": 1, "ok": True}, {"id": 2}]}, "results[1].ok"),
        ({"results": [{"ok": True}]}, "results[0].id"),
        ({"results": [{"id": 0, "ok": True}]}, "results[0].id"),
        ({"results": [{"id": 2**63, "ok": True}]}, "results[0].id"),
        ({"results": [{"id": "7", "ok": True}]}, "results[0].id"),
        ({"results": [{"id": 1, "ok": True, "error": "x\u0000"}]}, "results[0].error"),
        ({"results": [{"id": 1, "ok": True, "attempt": -1}]}, "results[0].attempt"),
        ({"results": [{"id": i, "ok": True} for i in range(1, 102)]}, "results"),
    ],
)
def test_a_malformed_batch_is_a_400_naming_the_field_and_records_nothing(agent_api, body, field):
    host, token = join("h1")
    task = enqueue(host, make_runner(host))
    take_tasks(host, T0)
    answer = agent_api.post("tasks/results", body, token=token)
    assert answer.status_code == 400 and answer.json()["field"] == field
    assert states(task) == ["in_flight"]


@pytest.mark.django_db(transaction=True)
def test_the_batch_route_wants_a_token_and_a_post(agent_api):
    body = {"results": [{"id": 1, "ok": True}]}
    assert agent_api.post("tasks/results", body).status_code == 401
    assert agent_api.post("tasks/results", body, token="zat_nope").status_code == 401
    _, token = join("h1")
    assert agent_api.get("tasks/results", token=token).status_code == 405
