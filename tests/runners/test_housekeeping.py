"""The housekeeping tick's runner half on a moved clock: the failed retention (RUN-10) and
the reap (RUN-19), which keeps a row while its host still owes a removal (TASK-08).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet.actions import record_heartbeat
from fleet.models import AgentTask
from fleet.task_results import record_task_result
from fleet.taskqueue import take_tasks
from runners.actions import apply_agent_reports as apply_reports
from runners.actions import fail_runner
from runners.housekeeping import housekeeping_step, reap_removed_runners
from runners.models import Runner
from tests.fleet.conftest import T0, join, later, make_runner

pytestmark = pytest.mark.usefixtures("github_settings")


def tick(host, now) -> list[str]:
    record_heartbeat(host=host, facts={}, now=now)
    return housekeeping_step(now).lines


def fail_the_remove(host, now) -> None:
    (task,) = take_tasks(host, now)
    record_task_result(
        host=host, task_id=task.pk, ok=False, error="rm: busy", attempt=task.attempt, now=now
    )


def exists(runner: Runner) -> bool:
    return Runner.objects.filter(pk=runner.pk).exists()


@pytest.mark.django_db
def test_task08_run19_a_removed_runner_is_kept_while_its_remove_is_owed_then_reaped():
    """TASK-08, RUN-19: the failed runner's remove failed; past the failed retention the
    runner is removed but its row (and with it the intent) stays until a remove succeeds."""
    host, _ = join("h1")
    runner = make_runner(host, "idle")
    fail_runner(runner, now=T0, actor="user:ada", message="test")
    fail_the_remove(host, T0)

    now = T0
    while now < later(minutes=11):  # ticks every 30 s; each re-issue fails too
        now += timedelta(seconds=30)
        tick(host, now)
        for task in take_tasks(host, now):
            record_task_result(
                host=host, task_id=task.pk, ok=False, error="rm: busy", attempt=1, now=now
            )
    runner.refresh_from_db()
    assert runner.state == "removed"  # the failed retention is over
    assert reap_removed_runners(now) == []
    assert exists(runner)

    now += timedelta(minutes=15)
    tick(host, now)  # the remove is issued again; this time the host confirms it
    (task,) = take_tasks(host, now)
    assert task.kind == "remove_runner"
    record_task_result(host=host, task_id=task.pk, ok=True, error=None, attempt=1, now=now)
    assert f"{runner.name}: reaped" in tick(host, now + timedelta(seconds=30))
    assert not exists(runner)


@pytest.mark.django_db
def test_run19_a_runner_whose_agent_reported_its_end_is_reaped_without_a_remove():
    """RUN-19, AGENT-18: the agent said how the runner ended, so it deletes the workload
    itself; a failed remove before that is owed no longer."""
    host, _ = join("h1")
    runner = make_runner(host, "idle")
    fail_runner(runner, now=T0, actor="user:ada", message="test")
    fail_the_remove(host, T0)
    apply_reports(
        host=host,
        reports=[{"runner_id": runner.pk, "state": "failed", "phase": "exited", "exit_code": 1}],
        now=later(5),
    )
    lines = tick(host, later(minutes=10, seconds=30))
    assert f"{runner.name}: failed retention over, removed" in lines
    assert f"{runner.name}: reaped" in lines
    assert not AgentTask.objects.filter(runner_id=runner.pk).exists()


@pytest.mark.django_db
def test_run19_a_removed_runner_on_a_lost_host_is_reaped():
    """RUN-19: removal is owed only while the host is there to confirm it."""
    host, _ = join("h1")
    runner = make_runner(host, "idle")
    fail_runner(runner, now=T0, actor="user:ada", message="test")
    fail_the_remove(host, T0)
    # No heartbeat: the host is lost at 5 min and nothing more is sent to it.
    lines = housekeeping_step(later(minutes=10, seconds=30)).lines
    assert "host h1 lost: no heartbeat for 10m30s" in lines
    assert not [line for line in lines if "issued again" in line]
    assert f"{runner.name}: reaped" in lines


@pytest.mark.django_db
def test_run10_a_failed_runner_stays_listed_with_its_message_for_the_retention_then_goes():
    """RUN-10: ten minutes after finished_at, not a second sooner."""
    host, _token = join("zoomies-host-1")
    runner = make_runner(host, state="registering")
    fail_runner(runner, now=T0, actor="test", message="the agent could not start it")
    # The agent confirms the workload is gone, so nothing is owed to the host.
    apply_reports(
        host=host, reports=[{"runner_id": runner.pk, "state": "failed", "phase": "exited"}], now=T0
    )
    for task in AgentTask.objects.filter(runner=runner):
        AgentTask.objects.filter(pk=task.pk).update(state="done")

    tick(host, T0 + timedelta(minutes=9, seconds=59))
    runner.refresh_from_db()
    assert runner.state == "failed"
    assert runner.message == "the agent could not start it"

    tick(host, T0 + timedelta(minutes=10))
    assert not exists(runner), "removed at the end of its retention, then reaped"


@pytest.mark.django_db
@pytest.mark.parametrize("code", [1, 143])
def test_sched15_a_drained_runner_whose_registration_was_deleted_ends_removed_not_failed(code):
    """An idle runner is drained by deleting its registration, then stopped: its listener's
    "registration removed" 1, or the stop's SIGTERM, is the drain taking it away. The same
    end of a runner nobody deregistered is still a failure."""
    host, _ = join("h1")
    taken, lost = make_runner(host, "draining"), make_runner(host, "draining")
    Runner.objects.filter(pk=taken.pk).update(deregistered_at=T0)
    for runner in (taken, lost):
        apply_reports(host=host, now=later(5), reports=[
            {"runner_id": runner.pk, "state": "failed", "phase": "exited", "exit_code": code},
        ])  # fmt: skip
    taken.refresh_from_db()
    lost.refresh_from_db()
    assert (taken.state, lost.state) == ("removed", "failed")
    assert taken.exit_code == code and taken.failed_at is None
