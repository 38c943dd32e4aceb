"""A host judged lost that comes back keeps the workloads still running jobs GitHub shows in
progress (issue 11 item 4, docs/reliability.md): the removes queued for those workloads are
cancelled, the others still go. A heartbeat alone leaves the rows failed (HOST-04); once the
agent shows the workload ran on, the rows are put back to the truth (issue 21 item 20)."""

from __future__ import annotations

import pytest

from fleet import actions, protocol
from fleet.health import check_host_health
from fleet.models import AgentTask
from runners.actions import JobUpdate, apply_agent_reports, apply_job_update
from runners.actions.steps import HOST_LOST_JOB_FAILURE as LOST_JOB_FAILURE
from runners.housekeeping import fleet_step
from runners.models import Job, Runner
from tests.fleet.conftest import T0, join, later, make_runner

pytestmark = pytest.mark.usefixtures("registry_defaults")


def job_on(runner, github_id: int, status: str = "in_progress") -> Job:
    return Job.objects.create(
        github_id=github_id,
        repository="acme/app",
        status=status,
        runner=runner,
        runner_name=runner.name,
        created_at=T0,
        updated_at=T0,
    )


def removes(runner) -> list[str]:
    return list(
        AgentTask.objects.filter(runner=runner, kind="remove_runner").values_list(
            "state", flat=True
        )
    )


def lose(host) -> None:
    actions.record_heartbeat(host=host, facts={}, now=T0)
    reasons = check_host_health(later(minutes=5, seconds=1))
    assert reasons[0].startswith(f"host {host.name} lost")


@pytest.mark.django_db
def test_host04_a_lost_host_coming_back_keeps_its_busy_workloads_and_loses_the_rest():
    """HOST-04, TASK-08: back from lost, the busy runner's remove is cancelled (its job is
    still in progress at GitHub) and never issued again; the idle one's remove still goes."""
    host, _ = join("h1")
    busy, idle, finished = (make_runner(host, s) for s in ("busy", "idle", "busy"))
    job_on(busy, 7)
    job_on(finished, 8, status="completed")
    lose(host)
    for runner in (busy, idle, finished):
        runner.refresh_from_db()
        assert runner.state == "failed"
        assert removes(runner) == ["pending"]

    actions.record_heartbeat(host=host, facts={}, now=later(minutes=6))

    assert removes(busy) == ["cancelled"]
    assert removes(idle) == ["pending"]
    assert removes(finished) == ["pending"]  # its job ended: the workload goes
    busy.refresh_from_db()
    assert busy.state == "failed"  # the row stays as the loss left it
    # Housekeeping does not issue the cancelled remove again (TASK-08 is for failed ones).
    fleet_step(later(minutes=30))
    assert removes(busy) == ["cancelled"]


@pytest.mark.django_db
def test_a_failed_runner_its_host_reports_running_on_a_live_job_is_not_removed():
    """Issue 11 item 4: the agent's report that a failed runner is still running spares it
    while its job is in progress (the job's in_progress arrived after the host came back)."""
    host, _ = join("h1")
    busy = make_runner(host, "busy")
    lose(host)
    actions.record_heartbeat(host=host, facts={}, now=later(minutes=6))
    assert removes(busy) == ["pending"]  # no job known yet: nothing to spare
    job_on(busy, 9)

    accepted, _ = apply_agent_reports(
        host=host, reports=[{"runner_id": busy.pk, "phase": "running"}], now=later(minutes=7)
    )

    assert accepted == [busy.pk]
    assert removes(busy) == ["cancelled"]


# -- issue 21 item 20: the rows follow the truth when the host comes back ------------------


def github_says(job: Job, status: str, at) -> None:
    """GitHub's word on `job`, as a webhook brings it."""
    apply_job_update(
        JobUpdate(
            github_id=job.github_id,
            status=status,
            repository=job.repository,
            runner_name=job.runner_name,
            conclusion="success" if status == "completed" else "",
        ),
        installation=None,
        now=at,
        source="webhook",
        actor="system:webhook",
    )


def loss_left(runner, job) -> None:
    """What HOST-04 leaves: the runner failed with the host-lost message, its job the
    fleet's failure, a remove queued."""
    runner.refresh_from_db()
    job.refresh_from_db()
    assert runner.state == "failed"
    assert runner.message.startswith(f"host {runner.host.name} lost: ")
    assert job.fleet_failure == LOST_JOB_FAILURE
    assert removes(runner) == ["pending"]


@pytest.mark.django_db
def test_an_adopted_runner_of_a_lost_host_is_busy_again_and_ends_removed_with_its_job_clean():
    """Issue 21 item 20: the host was lost and its agent restarted within minutes; its
    inventory (the adoption, sent before any heartbeat) lists the workload still running
    the job. The row is busy again, the job no longer the fleet's failure, the remove
    cancelled; GitHub's completed then ends the runner as any other: removed, not failed."""
    host, _ = join("h1")
    runner = make_runner(host, "busy")
    job = job_on(runner, 31)
    lose(host)
    loss_left(runner, job)

    actions.record_inventory(
        host=host,
        inventory=protocol.InventoryRequest(runners=(runner.pk,)),
        now=later(minutes=7),
    )

    host.refresh_from_db()
    runner.refresh_from_db()
    job.refresh_from_db()
    assert host.health == "healthy"  # the inventory is a sign of life, as a heartbeat
    assert runner.state == "busy"
    assert runner.failed_at is None and runner.finished_at is None
    assert "lost" not in runner.message.split(";")[-1]
    assert job.fleet_failure == ""
    assert removes(runner) == ["cancelled"]
    # A health tick after the adoption does not fail it again.
    assert check_host_health(later(minutes=7, seconds=30)) == []

    github_says(job, "completed", later(minutes=9))
    apply_agent_reports(
        host=host,
        reports=[{"runner_id": runner.pk, "state": "removed", "phase": "exited", "exit_code": 0}],
        now=later(minutes=9, seconds=5),
    )
    runner.refresh_from_db()
    job.refresh_from_db()
    assert (runner.state, runner.exit_code, runner.failed_at) == ("removed", 0, None)
    assert (job.status, job.conclusion, job.fleet_failure) == ("completed", "success", "")


@pytest.mark.django_db
def test_a_lost_runner_whose_agent_ran_on_unrestarted_ends_removed_when_it_reports_its_exit():
    """Issue 21 item 20: the agent was cut off, not restarted (its running phase was sent
    before the loss, so only the end is reported). GitHub's completed arrives first and
    moves nothing (the row is failed); the clean exit the agent then reports brings the
    row back (busy, then the completed job's end) and clears the job's fleet failure."""
    host, _ = join("h1")
    runner = make_runner(host, "busy")
    job = job_on(runner, 32)
    lose(host)
    actions.record_heartbeat(host=host, facts={}, now=later(minutes=6))
    github_says(job, "completed", later(minutes=8))
    runner.refresh_from_db()
    assert runner.state == "failed"  # the completed job alone proves nothing of the workload

    apply_agent_reports(
        host=host,
        reports=[{"runner_id": runner.pk, "state": "removed", "phase": "exited", "exit_code": 0}],
        now=later(minutes=8, seconds=3),
    )

    runner.refresh_from_db()
    job.refresh_from_db()
    assert (runner.state, runner.failed_at) == ("removed", None)
    assert job.fleet_failure == ""
    assert not AgentTask.objects.filter(runner=runner, state="pending").exists()


@pytest.mark.django_db
def test_only_a_host_loss_is_undone_and_only_with_proof_the_runner_ran_on():
    """Issue 21 item 20, narrowness: a runner failed for its own reason stays failed though
    its agent reports it running a job; a lost host's runner with no job at GitHub stays
    failed; a report while the host is still lost revives nothing (the next health tick
    would fail it again)."""
    host, _ = join("h1")
    own_failure = make_runner(host, "busy")
    no_job = make_runner(host, "busy")
    too_early = make_runner(host, "busy")
    job_on(own_failure, 41)
    job_on(too_early, 42)
    lose(host)
    running = [{"runner_id": r.pk, "phase": "running"} for r in (too_early,)]
    apply_agent_reports(host=host, reports=running, now=later(minutes=6))
    too_early.refresh_from_db()
    assert too_early.state == "failed"  # the host is still lost

    Runner.objects.filter(pk=own_failure.pk).update(message="the runner exited with code 1")
    actions.record_heartbeat(host=host, facts={}, now=later(minutes=7))
    running = [{"runner_id": r.pk, "phase": "running"} for r in (own_failure, no_job)]
    apply_agent_reports(host=host, reports=running, now=later(minutes=7, seconds=1))

    for runner in (own_failure, no_job):
        runner.refresh_from_db()
        assert runner.state == "failed"
    assert Job.objects.get(github_id=41).fleet_failure == LOST_JOB_FAILURE
