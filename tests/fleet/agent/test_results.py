"""The agent's task results posted in groups (fleet/agent/results.py, issue 28), against the
fake controller over real HTTP: a result alone goes at once, the results that arrive while
a post is under way go together in the next one, each thread gets its own result's answer,
and an older controller without the route gets one request a result."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from fleet.agent.client import ControllerClient, ControllerUnavailable, Unauthorized
from fleet.agent.results import REGROUP_AFTER, ResultPoster
from tests.fleet.agent.fakes import JOIN_TOKEN, FakeController
from tests.waiting import wait_until


@pytest.fixture
def client(controller: FakeController) -> Iterator[ControllerClient]:
    made = ControllerClient(controller.url)
    made.agent_token = made.join(JOIN_TOKEN, {"name": "h"}).agent_token
    yield made
    made.close()


def in_flight(controller: FakeController, count: int) -> list[int]:
    ids = [controller.enqueue("stop_runner", runner_id=100 + i) for i in range(count)]
    for task_id in ids:
        controller.tasks[task_id].state = "in_flight"
    return ids


def post_on_threads(
    poster: ResultPoster, client: ControllerClient, ids: list[int], ok: bool = True
) -> tuple[list[threading.Thread], dict[int, object]]:
    answers: dict[int, object] = {}

    def post(task_id: int) -> None:
        try:
            answers[task_id] = poster.post(client, task_id, ok=ok, error=None, attempt=1)
        except Exception as exc:
            answers[task_id] = exc

    threads = [threading.Thread(target=post, args=(i,), daemon=True) for i in ids]
    for thread in threads:
        thread.start()
    return threads, answers


def queued(poster: ResultPoster) -> int:
    with poster._lock:
        return len(poster._queue)


def test_results_that_arrive_during_a_post_go_together_in_the_next(controller, client):
    poster = ResultPoster()
    first, *rest = in_flight(controller, 10)
    controller.results_gate = threading.Event()  # the controller is slow to answer
    leader, answers = post_on_threads(poster, client, [first])
    wait_until(lambda: len(controller.calls_to("/tasks/results")) == 1)
    followers, more = post_on_threads(poster, client, rest)
    wait_until(lambda: queued(poster) == 9)
    controller.results_gate.set()
    for thread in leader + followers:
        thread.join(timeout=30)
    answers.update(more)
    assert answers == {task_id: True for task_id in [first, *rest]}
    posts = controller.calls_to("/tasks/results")
    assert [[r["id"] for r in call.body["results"]] for call in posts] == [[first], rest]
    assert {task_id for task_id, _ in controller.results} == {first, *rest}
    assert not controller.calls_to("/result"), "no result went alone"


def test_a_result_alone_is_posted_at_once_and_the_poster_is_free_again(controller, client):
    poster = ResultPoster()
    one, two = in_flight(controller, 2)
    assert poster.post(client, one, ok=True, error=None, attempt=1) is True
    assert poster.post(client, two, ok=False, error="no room", attempt=1) is True
    assert controller.result_of(two) == {"ok": False, "error": "no room", "attempt": 1}
    assert len(controller.calls_to("/tasks/results")) == 2
    assert not poster._posting and not poster._queue


def test_each_thread_gets_its_own_results_answer(controller, client):
    """404 (not this host's) and 409 (no longer in flight) are that result's final False;
    the others of the group are accepted."""
    poster = ResultPoster()
    fine, done = in_flight(controller, 2)
    controller.tasks[done].state = "done"
    controller.results_gate = threading.Event()
    leader, answers = post_on_threads(poster, client, [fine])
    wait_until(lambda: len(controller.calls_to("/tasks/results")) == 1)
    followers, more = post_on_threads(poster, client, [done, 424242])
    wait_until(lambda: queued(poster) == 2)
    controller.results_gate.set()
    for thread in leader + followers:
        thread.join(timeout=30)
    answers.update(more)
    assert answers == {fine: True, done: False, 424242: False}
    assert [c.status for c in controller.calls_to("/tasks/results")] == [200, 200]


def test_a_busy_controller_fails_every_result_of_the_group_for_its_thread_to_retry(
    controller, client
):
    poster = ResultPoster()
    ids = in_flight(controller, 3)
    controller.results_refused = 2
    controller.results_gate = threading.Event()
    leader, answers = post_on_threads(poster, client, ids[:1])
    wait_until(lambda: len(controller.calls_to("/tasks/results")) == 1)
    followers, more = post_on_threads(poster, client, ids[1:])
    wait_until(lambda: queued(poster) == 2)
    controller.results_gate.set()
    for thread in leader + followers:
        thread.join(timeout=30)
    answers.update(more)
    assert [len(c.body["results"]) for c in controller.calls_to("/tasks/results")] == [1, 2]
    assert all(isinstance(answers[i], ControllerUnavailable) for i in ids), answers
    assert not controller.results, "a 503 recorded nothing"
    assert not poster._posting and not poster._queue
    assert [poster.post(client, i, ok=True, error=None, attempt=1) for i in ids] == [True] * 3


def test_a_revoked_token_is_unauthorized_for_every_result(controller, client):
    poster = ResultPoster()
    (task_id,) = in_flight(controller, 1)
    controller.revoke_agent_tokens()
    with pytest.raises(Unauthorized):
        poster.post(client, task_id, ok=True, error=None, attempt=1)
    assert poster.grouped, "a 401 says nothing about the route"


def test_an_older_controller_without_the_route_gets_one_request_a_result(controller, client):
    controller.grouped_results = False
    poster = ResultPoster()
    one, two, gone = in_flight(controller, 3)
    controller.tasks[gone].state = "done"
    assert poster.post(client, one, ok=True, error=None, attempt=1) is True
    assert poster.grouped is False
    assert poster.post(client, two, ok=True, error=None, attempt=1) is True
    assert poster.post(client, gone, ok=True, error=None, attempt=1) is False  # its 409
    assert [c.status for c in controller.calls_to("/tasks/results")] == [404], "asked once"
    assert [c.path.rsplit("/", 2)[-2] for c in controller.calls_to("/result")] == [
        str(one), str(two), str(gone)
    ]  # fmt: skip


def test_after_an_older_controller_the_group_route_is_asked_again_in_time(controller, client):
    """An agent outlives the controller it met: once the controller is upgraded, results go
    in groups again within REGROUP_AFTER, with no restart of the agent."""
    now = [1000.0]
    controller.grouped_results = False
    poster = ResultPoster(clock=lambda: now[0])
    one, two, three, four = in_flight(controller, 4)
    assert poster.post(client, one, ok=True, error=None, attempt=1) is True
    controller.grouped_results = True  # upgraded meanwhile
    now[0] += REGROUP_AFTER - 1
    assert poster.post(client, two, ok=True, error=None, attempt=1) is True
    assert len(controller.calls_to("/tasks/results")) == 1, "not asked again before its time"
    assert len(controller.calls_to("/result")) == 2
    now[0] += 1
    assert poster.post(client, three, ok=True, error=None, attempt=1) is True
    assert poster.post(client, four, ok=True, error=None, attempt=1) is True
    assert [c.status for c in controller.calls_to("/tasks/results")] == [404, 200, 200]
    assert len(controller.calls_to("/result")) == 2, "grouped again, not one a result"
    assert poster.grouped


def test_an_error_too_long_is_cut_to_the_protocols_bound(controller, client):
    poster = ResultPoster()
    (task_id,) = in_flight(controller, 1)
    assert poster.post(client, task_id, ok=False, error="x" * 10_000, attempt=1) is True
    error = controller.result_of(task_id)["error"]
    assert len(error) == 4096 and error.endswith("…")
