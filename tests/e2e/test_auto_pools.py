"""Automatic pools on a real controller (issue 27 item 1, SCHED-29, SCHED-30): with
`scheduler.auto_pools` on, the embedded agent's host joins, the controller makes the pool
for its platform on its own (the join's wake, not the minute's timer), the operator sets
what is theirs (the image), and a job asking for the platform's labels runs on it."""

from __future__ import annotations

import time

import pytest

from runners.github.programs import FAKE_RUNNER as FAKE_RUNNER_IMAGE
from tests.e2e.harness import wait_for
from tests.e2e.test_first_job import setup_fleet

# Over 20 s of a worker: .ci/run's slow pass runs it, after the test command.
pytestmark = [pytest.mark.e2e, pytest.mark.any_database, pytest.mark.slow]


def test_sched29_sched30_a_joining_host_gets_its_platforms_pool_and_a_job_runs_on_it(e2e):
    controller, fake = e2e
    controller.env["ZOOMIES_SCHEDULER_AUTO_POOLS"] = "true"
    setup_fleet(controller, fake)
    began = time.monotonic()
    controller.start()
    (host,) = wait_for(lambda: controller.api("hosts"), 30, "the embedded agent to join")
    platform = host["platform"]
    assert platform.count("/") == 1, host
    (pool,) = wait_for(
        lambda: [p for p in controller.api("pools") if p["auto_key"]], 30,
        "the automatic pool for the host's platform",
    )  # fmt: skip
    assert time.monotonic() - began < 45  # well inside the minute's timer: the join woke it
    assert pool["auto_key"] == f"auto:{platform}" and pool["auto_active"] is True
    labels = ["self-hosted", *platform.lower().split("/")]
    assert pool["labels"] == labels and pool["name"] == "zoomies-auto-" + "-".join(labels[1:])
    # The image is the operator's to set; the shape is not.
    patched = controller.api(f"pools/{pool['id']}", method="PATCH",
                             json={"image": FAKE_RUNNER_IMAGE})  # fmt: skip
    assert patched["image"] == FAKE_RUNNER_IMAGE and patched["labels"] == labels

    job_id = fake.queue_job(repo="acme/app", labels=labels, duration=0.5, conclusion="success")
    wait_for(lambda: fake.job(job_id)["status"] == "completed", 90, "the job to complete")
    assert fake.job(job_id)["runner_name"].startswith(pool["name"] + "-")
    audited = controller.api("audit?action=pool.auto_create")
    assert [a["actor"] for a in audited] == ["auto-pools"]
