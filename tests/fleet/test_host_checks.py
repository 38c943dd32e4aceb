"""Host checks (TASK-09..11): asked for by an operator, carried by the task queue with a
lease and a life of their own, answered by the agent with a report kept on the host."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from fleet.actions import request_host_check
from fleet.host_checks import HostCheckRefused
from fleet.models import Host
from fleet.task_results import record_task_result
from fleet.taskqueue import sweep_tasks, take_tasks
from tests.accounts.conftest import make_user, mint
from tests.fleet.conftest import T0, join, later

pytestmark = pytest.mark.django_db


def last_check(host) -> dict:
    return Host.objects.get(pk=host.pk).last_check


def test_task09_a_check_has_its_own_90_s_lease_and_is_offered_once():
    host, _ = join("h1")
    task = request_host_check(host, now=T0, actor="user:otto")
    assert (task.lease_seconds, task.max_attempts) == (90, 1)
    (taken,) = take_tasks(host, later(1))
    assert taken.lease_deadline == later(91)
    assert sweep_tasks(later(90)).abandoned == []
    assert [t.pk for t in sweep_tasks(later(92)).abandoned] == [task.pk]
    assert take_tasks(host, later(93)) == []  # never offered again
    assert last_check(host)["state"] == "expired"


def test_task10_a_check_no_agent_takes_within_20_s_is_dropped():
    host, _ = join("h1")
    task = request_host_check(host, now=T0, actor="user:otto")
    sweep_tasks(later(19))
    assert last_check(host)["state"] == "pending"
    swept = sweep_tasks(later(21))
    assert any(f"host check {task.pk} dropped" in line for line in swept.lines)
    task.refresh_from_db()
    assert task.state == "cancelled" and take_tasks(host, later(22)) == []
    assert last_check(host)["state"] == "dropped"


def test_task11_a_new_check_waits_for_the_last_to_end_and_15_s_more():
    host, _ = join("h1")
    request_host_check(host, now=T0, actor="user:otto")
    with pytest.raises(HostCheckRefused, match="under way"):
        request_host_check(host, now=later(5), actor="user:otto")
    sweep_tasks(later(21))  # dropped: ended at 21 s
    with pytest.raises(HostCheckRefused, match="ask again in"):
        request_host_check(host, now=later(30), actor="user:otto")
    again = request_host_check(host, now=later(37), actor="user:otto")
    (taken,) = take_tasks(host, later(38))
    report = {"engine.docker": "reachable", "clock": later(42).timestamp()}
    record_task_result(host=host, task_id=taken.pk, ok=True, error=None,
                       attempt=taken.attempt, now=later(40), report=report)  # fmt: skip
    check = last_check(host)
    assert (check["task"], check["state"]) == (again.pk, "done")
    assert check["report"]["clock_skew_s"] == 2.0  # the agent's clock runs 2 s ahead
    with pytest.raises(HostCheckRefused):
        request_host_check(host, now=later(54), actor="user:otto")
    request_host_check(host, now=later(56), actor="user:otto")


def test_an_operator_asks_over_the_api_and_a_second_ask_is_a_409():
    host, _ = join("h1")
    otto = make_user("otto", "operator")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {mint(otto, ['fleet:write'])}")
    answer = api.post(f"/api/v1/hosts/{host.pk}/check")
    assert answer.status_code == 202, answer.content
    assert answer.json()["host"]["last_check"]["state"] == "pending"
    refused = api.post(f"/api/v1/hosts/{host.pk}/check")
    assert refused.status_code == 409 and "under way" in refused.json()["detail"]
    assert timedelta(seconds=Host.objects.get(pk=host.pk).tasks.get().lease_seconds) == (
        timedelta(seconds=90)
    )
