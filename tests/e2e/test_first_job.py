"""The first end-to-end job: queued at the fake GitHub, run on the embedded agent, cleaned away.

Real processes throughout: the controller (daphne, the django-q2 cluster, the embedded agent)
is `manage.py controller` in a child process over its own SQLite file; the fake GitHub is a
real HTTP server in this process; the runner is the fake runner in its own process.
"""

from __future__ import annotations

import time

import pytest

from runners.reconcile import FAKE_RUNNER_IMAGE
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.e2e
POOL = {
    "name": "zoomies-e2e",
    "labels": ["e2e"],
    "backend": "process",
    "image": FAKE_RUNNER_IMAGE,
    "max_runners": 4,
}
LABELS = ["self-hosted", "e2e"]


def setup_fleet(controller, fake, *, accounts=("acme",)):
    ids = {}
    controller.prepare()
    for account in accounts:
        inst = fake.add_installation(
            account=account, account_type="Organization", repositories=[f"{account}/app"]
        )
        controller.manage(
            "add_installation", "--id", str(inst), "--account", account,
            "--repo", f"{account}/app",
        )  # fmt: skip
        ids[account] = inst
    return ids


def api_job(controller, github_id):
    for job in controller.api("jobs"):
        if job["github_id"] == github_id:
            return job
    return None


def test_arch02_rec_a_webhook_job_runs_on_a_fresh_runner_and_the_row_is_reaped(e2e):
    """ARCH-01, ARCH-02, ARCH-03, ARCH-04, ARCH-09, HOOK-04, HOOK-05, HOOK-06, RUN-15, RUN-19:
    the webhook path end to end."""
    controller, fake = e2e
    setup_fleet(controller, fake)
    controller.start()
    pool = controller.api("pools", method="POST", json=POOL)
    assert pool["name"] == "zoomies-e2e"
    wait_for(lambda: controller.api("hosts"), 30, "the embedded agent to join")
    host = controller.api("hosts")[0]
    assert host["embedded"] or host["name"].startswith("zoomies-")

    job_id = fake.queue_job(repo="acme/app", labels=LABELS, duration=0.5, conclusion="success")
    wait_for(lambda: fake.job(job_id)["status"] == "completed", 60, "the job to complete")
    finished = wait_for(
        lambda: (j := api_job(controller, job_id)) and j["status"] == "completed" and j,
        30,
        "the controller to record the job completed",
    )
    assert finished["conclusion"] == "success"
    runner_name = fake.job(job_id)["runner_name"]
    assert finished["runner_name"] == runner_name
    assert runner_name.startswith("zoomies-e2e-")
    # The runner was fresh and is gone: its row is reaped once the agent reported it removed.
    wait_for(
        lambda: all(r["name"] != runner_name for r in controller.api("runners")),
        30,
        "the runner row to be reaped",
    )
    assert fake.deliveries and all(d["status_code"] in (200, 202) for d in fake.deliveries)


def test_poll01_with_every_webhook_dropped_the_poller_alone_gets_the_job_run(e2e):
    """POLL-01, POLL-04: no delivery arrives; the poll fallback finds the job."""
    controller, fake = e2e
    setup_fleet(controller, fake)
    fake.set_delivery(drop=True)
    controller.start()
    controller.api("pools", method="POST", json=POOL)
    job_id = fake.queue_job(repo="acme/app", labels=LABELS, duration=0.3, conclusion="success")
    wait_for(lambda: fake.job(job_id)["status"] == "completed", 90, "the polled job to complete")
    assert all(d["status_code"] is None for d in fake.deliveries)
    recorded = wait_for(
        lambda: (j := api_job(controller, job_id)) and j["status"] == "completed" and j,
        30,
        "the poller to record the completed job",
    )
    assert recorded["source"] == "poll"
    problems = {p["key"]: p for p in controller.api("problems")}
    assert "polling alone" in problems["github.polling_only"]["title"]


def test_hook03_duplicated_and_reordered_deliveries_move_no_job_back_or_add_a_runner(e2e):
    """HOOK-02, HOOK-03: duplicates and reversed order; every job ends completed, once."""
    controller, fake = e2e
    setup_fleet(controller, fake)
    fake.set_delivery(duplicate=True, reorder=True)
    controller.start()
    controller.api("pools", method="POST", json=POOL)
    jobs = [
        fake.queue_job(repo="acme/app", labels=LABELS, duration=0.3, conclusion="success")
        for _ in range(3)
    ]
    wait_for(lambda: all(fake.job(j)["status"] == "completed" for j in jobs), 90, "all three jobs")
    recorded = wait_for(
        lambda: (
            (rows := [api_job(controller, j) for j in jobs])
            and all(r and r["status"] == "completed" for r in rows)
            and rows
        ),
        30,
        "the controller to record every job completed",
    )
    assert len({r["runner_name"] for r in recorded}) == 3
    # One JIT configuration per job: nobody minted a second runner for a job.
    mints = [c for c in fake.calls if c[0] == "POST" and c[1].endswith("/generate-jitconfig")]
    assert len(mints) == 3
    time.sleep(1)  # late duplicates still in flight must not move anything back
    assert all(api_job(controller, j)["status"] == "completed" for j in jobs)


def test_poll05_a_rate_limited_installation_waits_for_its_reset_while_another_runs(e2e):
    """POLL-05, POLL-06: the limited installation resumes when the fake's reset passes."""
    controller, fake = e2e
    ids = setup_fleet(controller, fake, accounts=("acme", "globex"))
    controller.start()
    controller.api("pools", method="POST", json=POOL)
    reset_in = 8.0
    limited_at = time.time()
    fake.rate_limit(ids["acme"], reset_in=reset_in)
    limited_job = fake.queue_job(repo="acme/app", labels=LABELS, duration=0.2)
    free_job = fake.queue_job(repo="globex/app", labels=LABELS, duration=0.2)
    wait_for(lambda: fake.job(free_job)["status"] == "completed", 60, "the other install's job")
    assert fake.job(limited_job)["status"] == "queued"
    wait_for(lambda: fake.job(limited_job)["status"] == "completed", 60, "the limited job")
    started = fake.job(limited_job)["started_at"]
    from datetime import datetime

    started_epoch = datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    assert started_epoch >= limited_at + reset_in - 1, "it ran before the reset"
    assert started_epoch <= limited_at + reset_in + 30, "it waited far past the reset"
