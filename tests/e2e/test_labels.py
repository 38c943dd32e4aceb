"""A job that asks for `self-hosted`, the OS and the arch runs, with GitHub's label rule on.

GitHub gives a JIT runner exactly the labels of its `generate-jitconfig` body and hands a job
only to a runner with every label the job asks for; the fake GitHub does both. So this job
runs only if the controller registers its runner with `self-hosted`, `Linux` and `X64` as
well as the pool's own label (issue 8 item 6).
"""

from __future__ import annotations

import pytest

from runners.github.programs import FAKE_RUNNER
from tests.e2e.harness import wait_for
from tests.e2e.test_first_job import api_job, setup_fleet

# GitHub's label rule through the fake, the same on either database.
pytestmark = [pytest.mark.e2e, pytest.mark.any_database]
POOL = {
    "name": "zoomies-e2e-labels",
    "labels": ["e2e-labels"],
    "backend": "process",
    "platform": "linux/x64",
    "image": FAKE_RUNNER,
    "max_runners": 2,
}
RUNS_ON = ["self-hosted", "linux", "x64", "e2e-labels"]


def test_sched04_a_job_asking_for_self_hosted_linux_x64_and_a_pool_label_runs(e2e):
    """SCHED-04, FAKE-01: runs-on [self-hosted, linux, x64, <pool label>] through the fake,
    which refuses a runner that lacks any of them."""
    controller, fake = e2e
    setup_fleet(controller, fake)
    controller.start()
    controller.api("pools", method="POST", json=POOL)
    job_id = fake.queue_job(repo="acme/app", labels=RUNS_ON, duration=0.3, conclusion="success")
    wait_for(lambda: fake.job(job_id)["status"] == "completed", 90, "the job to complete")
    runner_name = fake.job(job_id)["runner_name"]
    assert runner_name.startswith("zoomies-e2e-labels-")
    recorded = wait_for(
        lambda: (j := api_job(controller, job_id)) and j["status"] == "completed" and j,
        30,
        "the controller to record the job completed",
    )
    assert recorded["conclusion"] == "success"
