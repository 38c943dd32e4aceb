"""The agent against a fake controller over real HTTP: RUN-15/17, AGENT-16..19, 23, 24."""

from __future__ import annotations

import sys
import threading

from fleet.agent import reconcile, tasks
from fleet.agent.backends.base import RunnerSpec, WorkloadStatus
from fleet.agent.backends.process import ProcessBackend
from tests.waiting import wait_until

PY = sys.executable
SHORT = [PY, "-c", "print('hi'); import time; time.sleep(0.3)"]
LONG = [PY, "-c", "import time; time.sleep(60)"]


def status(agent, runner_id: int) -> WorkloadStatus:
    return agent.backends["process"].inspect(runner_id).status


def phases(controller, runner_id: int) -> list[tuple[str | None, str]]:
    return [(r["state"], r["phase"]) for r in controller.reports_for(runner_id)]


def test_host01_heartbeat_carries_size_and_disk_and_the_answer_sets_the_sleep(
    make_agent, controller
):
    controller.heartbeat_interval = 7
    agent = make_agent()
    agent.connect()

    assert agent.heartbeat_once() == 7
    (beat,) = controller.calls_to("/heartbeat")
    assert beat.headers["authorization"].startswith("Bearer zat_")
    body = beat.body
    for key in ("capacity", "backends", "platform", "cpus", "memory_mb", "labels", "version"):
        assert key in body
    assert body["disk_total_mb"] > 0 and body["disk_free_mb"] >= 0  # HOST-08
    assert "load1" in body["usage"]

    slept: list[float] = []

    def wait(seconds: float) -> bool:
        slept.append(seconds)
        controller.heartbeat_interval = 11  # the next answer changes the sleep
        return len(slept) == 2

    agent.heartbeat_loop(wait=wait)
    assert slept == [7, 11]
    assert len(controller.calls_to("/heartbeat")) == 3


def test_run15_run17_a_runner_reports_registering_running_then_removed_once(
    make_agent, controller, clock, dirs
):
    agent = make_agent()
    agent.connect()
    task_id = controller.enqueue_create(5, SHORT)

    agent.poll_once(wait=0)

    assert controller.result_of(task_id) == {"ok": True, "error": None, "attempt": 1}
    run_dir = dirs[1] / "runners" / "5"
    assert (run_dir / "meta.json").exists()
    agent.reconcile_once(clock())  # registering, on its own, with the phase it runs in
    agent.reconcile_once(clock())  # the same phase is not said again
    assert phases(controller, 5) == [("registering", "running")]

    wait_until(lambda: status(agent, 5) == WorkloadStatus.EXITED)
    controller.reports_status = 503  # the end report does not get through...
    agent.reconcile_once(clock())
    assert run_dir.exists(), "AGENT-18: nothing is deleted before the controller accepted"
    controller.reports_status = 200  # ...until it does
    agent.reconcile_once(clock())
    agent.reconcile_once(clock())

    reports = controller.reports_for(5)
    assert phases(controller, 5) == [("registering", "running"), ("removed", "exited")]
    assert reports[-1]["exit_code"] == 0
    assert not run_dir.exists()
    assert agent.tracked == {}


def test_agent18_a_finished_runner_stays_for_the_retention(make_agent, controller, clock, dirs):
    agent = make_agent(finished_retention=10)
    agent.connect()
    controller.enqueue_create(6, [PY, "-c", "print('done')"])
    agent.poll_once(wait=0)
    wait_until(lambda: status(agent, 6) == WorkloadStatus.EXITED)

    agent.reconcile_once(clock())  # registering and the end, in that order, in one post
    assert phases(controller, 6) == [("registering", "exited"), ("removed", "exited")]
    run_dir = dirs[1] / "runners" / "6"
    clock.advance(9.9)
    agent.reconcile_once(clock())
    assert (run_dir / "output.log").read_text() == "done\n"
    clock.advance(0.1)
    agent.reconcile_once(clock())
    assert not run_dir.exists()
    assert len(controller.reports_for(6)) == 2


def test_run15_a_failing_command_reports_failed_with_its_exit_code(make_agent, controller, clock):
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(7, [PY, "-c", "import sys; sys.exit(3)"])
    agent.poll_once(wait=0)
    wait_until(lambda: status(agent, 7) == WorkloadStatus.EXITED)

    agent.reconcile_once(clock())
    agent.reconcile_once(clock())

    end = controller.reports_for(7)[-1]
    assert (end["state"], end["phase"], end["exit_code"]) == ("failed", "exited", 3)
    # Issue 8 item 14: the output's end travels with the report; the file goes with the dir.
    assert "code 3" in end["message"] and "output.log" not in end["message"]
    assert [r["state"] for r in controller.reports_for(7)].count("failed") == 1


def test_run14_a_create_that_cannot_start_answers_not_ok(make_agent, controller):
    agent = make_agent()
    agent.connect()
    task_id = controller.enqueue_create(8, ["zoomies-no-such-program"])
    agent.poll_once(wait=0)

    result = controller.result_of(task_id)
    assert result["ok"] is False and "zoomies-no-such-program" in result["error"]
    assert agent.tracked == {}


def test_agent23_a_restarted_agent_adopts_its_runner_and_reports_its_end_once(
    make_agent, controller, clock
):
    first = make_agent()
    first.connect()
    controller.enqueue_create(9, [PY, "-c", "import time, sys; time.sleep(0.5); sys.exit(4)"])
    first.poll_once(wait=0)
    first.reconcile_once(clock())
    assert phases(controller, 9) == [("registering", "running")]
    del first  # the agent restarts; its runner carries on without it

    second = make_agent()
    second.connect()
    assert second.adopt_existing() == [9]
    wait_until(lambda: status(second, 9) == WorkloadStatus.EXITED)
    second.reconcile_once(clock())
    second.reconcile_once(clock())

    ends = [r for r in controller.reports_for(9) if r["state"] in ("removed", "failed")]
    assert len(ends) == 1
    assert (ends[0]["state"], ends[0]["exit_code"]) == ("failed", 4)  # read from the shim's file


def test_agent24_a_redelivered_create_adopts_instead_of_building_a_second_runner(
    make_agent, controller, clock
):
    first = make_agent()
    first.connect()
    controller.enqueue_create(10, LONG)
    first.poll_once(wait=0)
    pid = first.backends["process"].run_dir(10).joinpath("meta.json").read_text()
    del first  # restarted before it said anything

    second = make_agent()
    second.connect()  # no adopt_existing: the task alone must trigger adoption
    task_id = controller.enqueue_create(10, LONG, attempt=2)
    second.poll_once(wait=0)

    assert controller.result_of(task_id) == {"ok": True, "error": None, "attempt": 2}
    assert second.backends["process"].run_dir(10).joinpath("meta.json").read_text() == pid
    assert second.tracked[10].adopted
    second.reconcile_once(clock())
    assert phases(controller, 10)[-1] == ("registering", "running")


def test_agent16_an_unclaimed_workload_goes_two_minutes_after_first_seen_and_after_a_poll(
    make_agent, controller, clock
):
    agent = make_agent()
    agent.connect()
    agent.adopt_existing()
    backend = agent.backends["process"]
    # A workload appears that nothing in this agent created or adopted.

    backend.create(RunnerSpec(11, "stray", "pool", "process", command=LONG))

    agent.reconcile_once(clock())  # first seen
    clock.advance(125)
    agent.reconcile_once(clock())
    assert status(agent, 11) == WorkloadStatus.RUNNING, "never before one task poll completed"

    agent.poll_once(wait=0)
    clock.advance(1)
    agent.reconcile_once(clock())
    assert status(agent, 11) == WorkloadStatus.MISSING
    assert controller.reports_for(11) == []


def test_agent16_the_two_minutes_count_from_first_seen(make_agent, controller, clock):
    agent = make_agent()
    agent.connect()
    agent.poll_once(wait=0)

    agent.backends["process"].create(RunnerSpec(12, "stray", "pool", "process", command=LONG))
    agent.reconcile_once(clock())
    clock.advance(119)
    agent.reconcile_once(clock())
    assert status(agent, 12) == WorkloadStatus.RUNNING
    clock.advance(1)
    agent.reconcile_once(clock())
    assert status(agent, 12) == WorkloadStatus.MISSING


def test_agent16_woken_passes_list_the_backends_for_orphans_once_in_a_while(
    make_agent, controller, clock, monkeypatch
):
    """A burst wakes the pass for every create: the listing for orphans (every workload, or
    the engine's every container) is made once per reconcile interval, and at once when a
    stray it already saw comes due."""
    agent = make_agent()
    agent.connect()
    agent.poll_once(wait=0)
    backend = agent.backends["process"]
    listings = []
    listed = backend.list
    monkeypatch.setattr(backend, "list", lambda: listings.append(clock()) or listed())

    for _ in range(5):  # woken passes, all at one moment
        agent.reconcile_once(clock())
    assert len(listings) == 1
    clock.advance(reconcile.ORPHAN_LISTING_EVERY - 0.5)
    agent.reconcile_once(clock())
    assert len(listings) == 1
    clock.advance(0.5)
    agent.reconcile_once(clock())
    assert len(listings) == 2, "each interval lists again: a new stray is seen in time"

    backend.create(RunnerSpec(14, "stray", "pool", "process", command=LONG))
    clock.advance(reconcile.ORPHAN_LISTING_EVERY)
    agent.reconcile_once(clock())  # first seen
    clock.advance(agent.tunables.orphan_grace - 0.25)
    agent.reconcile_once(clock())
    assert status(agent, 14) == WorkloadStatus.RUNNING
    clock.advance(0.25)  # due, though the last listing was a quarter second ago
    agent.reconcile_once(clock())
    assert status(agent, 14) == WorkloadStatus.MISSING


def test_agent17_a_new_runner_is_not_reported_missing_within_a_minute(
    make_agent, controller, clock
):
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(13, LONG)
    agent.poll_once(wait=0)
    agent.reconcile_once(clock())
    agent.backends["process"].remove(13)  # gone behind the agent's back

    clock.advance(59)
    agent.reconcile_once(clock())
    assert phases(controller, 13) == [("registering", "running")]
    clock.advance(2)
    agent.reconcile_once(clock())
    agent.reconcile_once(clock())
    assert phases(controller, 13) == [("registering", "running"), ("failed", "missing")]
    assert agent.tracked == {}


def test_agent19_stop_leaves_runners_running_and_sends_one_last_report(
    make_agent, controller, clock
):
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(14, LONG)
    agent.poll_once(wait=0)
    agent.reconcile_once(clock())
    agent.reconcile_once(clock())
    posts_before = len(controller.calls_to("/reports"))

    agent.stop(grace=5)

    assert status(agent, 14) == WorkloadStatus.RUNNING
    assert len(controller.calls_to("/reports")) == posts_before + 1
    assert controller.reports_for(14)[-1] == {
        "runner_id": 14,
        "state": None,
        "phase": "running",
        "exit_code": None,
        "message": None,
    }
    # No new task is started once stopping.
    controller.enqueue_create(15, LONG)
    assert agent.poll_once(wait=0) == []
    assert not agent.backends["process"].run_dir(15).exists()


def test_agent19_run_starts_the_loops_and_a_stop_request_ends_them(make_agent, controller):
    agent = make_agent()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            agent.run(install_signals=False)
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    task_id = controller.enqueue_create(16, LONG)
    wait_until(lambda: controller.result_of(task_id))
    wait_until(lambda: ("registering", "running") in phases(controller, 16))
    assert controller.calls_to("/heartbeat")

    agent.request_stop()
    thread.join(10)
    assert not thread.is_alive() and errors == []
    assert status(agent, 16) == WorkloadStatus.RUNNING


def test_stop_runner_task_stops_the_workload_and_its_end_is_reported(make_agent, controller, clock):
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(17, LONG)
    agent.poll_once(wait=0)
    stop_id = controller.enqueue("stop_runner", 17, {"timeout": 5})
    agent.poll_once(wait=0)

    assert controller.result_of(stop_id)["ok"] is True
    agent.reconcile_once(clock())
    end = controller.reports_for(17)[-1]
    assert (end["state"], end["exit_code"]) == ("failed", 143)
    assert "stopped" in end["message"]


def test_remove_runner_task_deletes_the_workload_and_says_so_once(
    make_agent, controller, clock, dirs
):
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(18, LONG)
    agent.poll_once(wait=0)
    agent.reconcile_once(clock())
    remove_id = controller.enqueue("remove_runner", 18)
    agent.poll_once(wait=0)

    assert controller.result_of(remove_id)["ok"] is True
    assert not (dirs[1] / "runners" / "18").exists()
    agent.reconcile_once(clock())
    agent.reconcile_once(clock())
    assert phases(controller, 18) == [("registering", "running"), ("removed", "missing")]
    assert agent.tracked == {}


def test_run18_a_refused_end_is_final(make_agent, controller, clock, dirs):
    controller.refused_runner_ids.add(19)
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(19, [PY, "-c", "pass"])
    agent.poll_once(wait=0)
    wait_until(lambda: status(agent, 19) == WorkloadStatus.EXITED)
    agent.reconcile_once(clock())
    agent.reconcile_once(clock())
    assert len(controller.reports_for(19)) == 2
    assert not (dirs[1] / "runners" / "19").exists()


def test_run11_a_stop_with_a_grace_lets_the_runner_finish_its_job_unsignalled(
    make_agent, controller, clock
):
    """RUN-11: stop_runner's `grace` is waited out before any signal, so a draining runner
    that finishes its job within it ends with its own exit code, not SIGTERM's."""
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(20, [PY, "-c", "import time; time.sleep(0.8)"])
    agent.poll_once(wait=0)
    stop_id = controller.enqueue("stop_runner", 20, {"grace": 10, "timeout": 5})
    agent.poll_once(wait=0)

    assert controller.result_of(stop_id)["ok"] is True
    agent.reconcile_once(clock())
    end = controller.reports_for(20)[-1]
    assert (end["state"], end["exit_code"]) == ("removed", 0)


def test_run11_a_stop_without_a_grace_signals_at_once(make_agent, controller, clock, monkeypatch):
    """RUN-11: grace defaults to 0 (an idle runner is stopped at once): the backend is asked
    to stop with no grace, and the runner ends on SIGTERM."""
    stops: list[tuple[int, float, float]] = []
    real_stop = ProcessBackend.stop

    def recording_stop(self, runner_id, timeout, grace=0.0):
        stops.append((runner_id, timeout, grace))
        return real_stop(self, runner_id, timeout, grace=grace)

    monkeypatch.setattr(ProcessBackend, "stop", recording_stop)
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(21, LONG)
    agent.poll_once(wait=0)
    stop_id = controller.enqueue("stop_runner", 21, {"timeout": 5})
    agent.poll_once(wait=0)
    assert stops == [(21, 5, 0)]
    assert controller.result_of(stop_id)["ok"] is True
    agent.reconcile_once(clock())
    assert controller.reports_for(21)[-1]["exit_code"] == 128 + 15


def test_agent_a_result_is_offered_again_through_a_long_outage_then_given_up(
    make_agent, controller
):
    """A stop's result refused for 10 tries (a 45 s write lock on a slow machine) still
    lands: three tries in about 23 s left the task in flight for its whole lease. Past
    RESULT_PATIENCE of waiting the agent gives up (the lease brings the task back)."""
    waits: list[float] = []
    agent = make_agent(sleep=waits.append)
    agent.connect()
    controller.results_refused = 10
    stop = controller.enqueue("stop_runner", 31, {"timeout": 1})
    agent.poll_once(wait=0)
    wait_until(lambda: controller.result_of(stop))
    assert controller.result_of(stop)["ok"] is True
    assert waits == [1, 2, 4, 8, 15, 15, 15, 15, 15, 15]

    waits.clear()
    controller.results_refused = 1000
    again = controller.enqueue("stop_runner", 32, {"timeout": 1})
    agent.poll_once(wait=0)
    assert agent.wait_for_tasks(10)
    assert controller.result_of(again) is None
    assert sum(waits) <= tasks.RESULT_PATIENCE < sum(waits) + tasks.RESULT_MAX_WAIT
