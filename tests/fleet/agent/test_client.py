"""The protocol calls over real HTTP: timeouts, errors and their shapes (ARCH-07)."""

from __future__ import annotations

import socket

import pytest

from fleet.agent.client import (
    ControllerClient,
    ControllerError,
    ControllerUnavailable,
    Unauthorized,
)
from tests.fleet.agent.fakes import JOIN_TOKEN


@pytest.fixture
def client(controller):
    made = ControllerClient(controller.url + "/")
    answer = made.join(JOIN_TOKEN, {"name": "h"})
    made.agent_token = answer.agent_token
    yield made
    made.close()


def test_the_long_poll_waits_wait_plus_ten_seconds_for_its_answer(client, controller):
    seen = []
    client._http.event_hooks["request"].append(
        lambda request: seen.append((request.url.params["wait"], request.extensions["timeout"]))
    )
    assert client.poll_tasks(wait=0).tasks == ()
    controller.enqueue("remove_runner", 1)  # so the long wait is not waited out
    client.poll_tasks(wait=99)  # the protocol caps a wait at 30 s
    assert seen[0] == ("0", {"connect": 10.0, "read": 10.0, "write": 10.0, "pool": 10.0})
    assert seen[1][0] == "30" and seen[1][1]["read"] == 40.0


def test_tasks_come_back_typed(client, controller):
    task_id = controller.enqueue("stop_runner", 5, {"timeout": 300}, attempt=2)
    (task,) = client.poll_tasks(wait=0).tasks
    assert (task.id, task.kind, task.attempt, task.runner_id) == (task_id, "stop_runner", 2, 5)
    assert task.payload == {"runner_id": 5, "timeout": 300}
    assert client.post_result(task_id, ok=True, error=None, attempt=2) is True
    assert client.post_result(task_id, ok=True, error=None, attempt=2) is False  # 409
    assert client.post_result(999, ok=True, error=None, attempt=1) is False  # 404


def test_a_401_is_unauthorized_with_the_controllers_sentence(client, controller):
    controller.revoke_agent_tokens()
    with pytest.raises(Unauthorized, match="This agent token is not valid") as caught:
        client.heartbeat({})
    assert caught.value.status == 401


def test_a_5xx_is_worth_retrying(client, controller):
    controller.reports_status = 503
    with pytest.raises(ControllerUnavailable, match="503: The controller is busy"):
        client.post_reports([])


def test_a_controller_that_is_not_there_is_unavailable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = ControllerClient(f"http://127.0.0.1:{port}", agent_token="zat_x", timeout=2)
    with pytest.raises(ControllerUnavailable, match="cannot reach the controller"):
        client.heartbeat({})
    assert issubclass(ControllerUnavailable, ControllerError)
