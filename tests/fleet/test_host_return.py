"""A host judged lost that comes back keeps the workloads still running jobs GitHub shows in
progress (issue 11 item 4, docs/reliability.md): the rows stay failed (HOST-04), the removes
queued for those workloads are cancelled, the others still go."""

from __future__ import annotations

import pytest

from fleet import actions
from fleet.health import check_host_health
from fleet.models import AgentTask
from runners.actions import apply_agent_reports
from runners.housekeeping import fleet_step
from runners.models import Job
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
