"""After a restore the controller carries on from the restored rows (issue 11 items 7 and 9).

The backup drill, end to end with real processes: a backup is taken with `manage.py backup`
while the controller runs and a job's runner is busy; the controller is killed (a lost
machine's last moments), the copy is restored with `manage.py restore`, and the restarted
controller reconciles from the restored rows: the job completes on the runner it had, and no
second runner is ever minted for it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.e2e.conftest import e2e  # noqa: F401  (the fixture: a controller and a fake GitHub)
from tests.e2e.harness import wait_for
from tests.e2e.test_first_job import LABELS, POOL, api_job, jit_mints, setup_fleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_bak05_a_controller_restarted_on_a_restored_backup_runs_no_duplicate_runner(e2e):  # noqa: F811
    """BAK-01, BAK-05: a backup taken mid-job, restored; the restart mints no second runner."""
    controller, fake = e2e
    if controller.env.get("ZOOMIES_DATABASE_URL"):
        pytest.skip("this drill restores SQLite's file; pg_dump's path is test_backup_postgres")
    setup_fleet(controller, fake)
    controller.start()
    controller.api("pools", method="POST", json=POOL)
    job_id = fake.queue_job(repo="acme/app", labels=LABELS, duration=25, conclusion="success")
    wait_for(lambda: fake.job(job_id)["status"] == "in_progress", 60, "the job to start")
    wait_for(
        lambda: (j := api_job(controller, job_id)) and j["status"] == "in_progress",
        30, "the controller to record the job in progress",
    )  # fmt: skip
    runner_name = fake.job(job_id)["runner_name"]

    printed = controller.manage("backup")  # while the controller runs and the runner is busy
    backup = Path(printed.split()[0])
    assert backup.exists(), printed
    copy = sqlite3.connect(backup)
    assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert copy.execute(
        "SELECT status FROM runners_job WHERE github_id = ?", (job_id,)
    ).fetchone() == ("in_progress",)
    copy.close()

    controller.kill()
    out = controller.manage("restore", str(backup))
    assert f"restored {backup.name}" in out and "kept at" in out
    controller.start()

    wait_for(lambda: fake.job(job_id)["status"] == "completed", 60, "the job to finish")
    recorded = wait_for(
        lambda: (j := api_job(controller, job_id)) and j["status"] == "completed" and j,
        60, "the restarted controller to record the job completed",
    )  # fmt: skip
    assert recorded["runner_name"] == runner_name
    assert len(jit_mints(fake)) == 1, "no second runner was created for the running job"
    names = [r["name"] for r in controller.api("runners")]
    assert len(names) == len(set(names)) and len(names) <= 1


def test_bak05_a_backup_taken_during_a_burst_restores_and_the_controller_carries_on(e2e):  # noqa: F811
    """BAK-01, BAK-05 (issue 11 item 9, the backup drill): a backup taken while a burst of
    jobs runs passes its integrity check once restored, and the restarted controller carries
    on from it: every job of the burst completes, and each ran on exactly one runner."""
    controller, fake = e2e
    if controller.env.get("ZOOMIES_DATABASE_URL"):
        pytest.skip("this drill restores SQLite's file; pg_dump's path is test_backup_postgres")
    setup_fleet(controller, fake)
    controller.start()
    controller.api("pools", method="POST", json=POOL)
    jobs = [
        fake.queue_job(repo="acme/app", labels=LABELS, duration=6, conclusion="success")
        for _ in range(8)
    ]
    wait_for(
        lambda: sum(fake.job(j)["status"] == "in_progress" for j in jobs) >= 2,
        60, "the burst to be running",
    )  # fmt: skip
    backup = Path(controller.manage("backup").split()[0])
    at_backup = {j: fake.job(j)["status"] for j in jobs}
    controller.kill()
    out = controller.manage("restore", str(backup))
    assert "ok   integrity: PRAGMA integrity_check: ok" in out
    controller.start()

    wait_for(
        lambda: all(fake.job(j)["status"] == "completed" for j in jobs), 240,
        "every job of the burst to complete at GitHub",
    )  # fmt: skip
    rows = wait_for(
        lambda: (r := [api_job(controller, j) for j in jobs])
        and all(x and x["status"] == "completed" for x in r) and r,
        120, "the controller's rows to converge",
    )  # fmt: skip
    ran_on = {j: fake.job(j)["runner_name"] for j in jobs}
    conclusions = {j: fake.job(j)["conclusion"] for j in jobs}
    figures = {
        "jobs": len(jobs),
        "in_progress_at_backup": sum(s == "in_progress" for s in at_backup.values()),
        "runners_minted": len(jit_mints(fake)),
        "distinct_runners_that_ran_jobs": len(set(ran_on.values())),
        "conclusions": sorted(set(conclusions.values())),
    }
    print("backup drill figures:", figures)
    assert len(set(ran_on.values())) == len(jobs), f"each job had its own runner: {figures}"
    assert all(r["runner_name"] == ran_on[r["github_id"]] for r in rows)
    assert set(conclusions.values()) == {"success"}, figures
