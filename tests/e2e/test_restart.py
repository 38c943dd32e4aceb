"""A killed controller loses nothing: its runner keeps running, and the restarted controller
adopts it and records the job GitHub finished while nobody was listening."""

from __future__ import annotations

import pytest

from tests.e2e.harness import wait_for
from tests.e2e.test_first_job import LABELS, POOL, api_job, setup_fleet

pytestmark = pytest.mark.e2e


def test_agent23_a_controller_killed_mid_job_restarts_and_loses_nothing(e2e):
    """AGENT-23, LEASE-02, LEASE-06, POLL-01, RUN-17: SIGKILL mid-job, then restart."""
    controller, fake = e2e
    setup_fleet(controller, fake)
    controller.start()
    controller.api("pools", method="POST", json=POOL)
    job_id = fake.queue_job(repo="acme/app", labels=LABELS, duration=6, conclusion="success")
    wait_for(lambda: fake.job(job_id)["status"] == "in_progress", 60, "the job to start")
    runner_name = fake.job(job_id)["runner_name"]

    controller.kill()
    # GitHub finishes the job while no controller listens; its delivery is refused.
    wait_for(lambda: fake.job(job_id)["status"] == "completed", 30, "the job to finish")

    controller.start()  # the same data dir, port and database: the kernel freed the lock
    recorded = wait_for(
        lambda: (j := api_job(controller, job_id)) and j["status"] == "completed" and j,
        60,
        "the restarted controller to learn the job completed",
    )
    assert recorded["runner_name"] == runner_name
    # The completed job drains its runner; the restarted agent then reports it gone.
    wait_for(
        lambda: all(
            r["state"] == "removed" for r in controller.api("runners") if r["name"] == runner_name
        ),
        90,  # a deadline for a wait that would never end, not a speed (PostgreSQL, load 6)
        "the finished runner to be removed",
    )
    runners = {r["name"]: r for r in controller.api("runners")}
    assert not [r for r in runners.values() if r["state"] == "failed"]
    mints = [c for c in fake.calls if c[0] == "POST" and c[1].endswith("/generate-jitconfig")]
    assert len(mints) == 1, "nothing was created twice"
    hosts = controller.api("hosts")
    assert len(hosts) == 1 and hosts[0]["health"] == "healthy"
