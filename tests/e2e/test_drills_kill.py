"""Drill: kill -9 the whole controller at random points during a burst of queued jobs and
restart it each time (issue 11 item 9: 200 jobs and 10 kills; CI runs 40 and 3, the
figures of both are in docs/reliability.md).

The same burst runs undisturbed first, on the same controller and fake GitHub, and the
killed one must finish within twice its time plus the time its restarts took to answer
(the machine's cost of starting the processes, not recovery). Every job must end completed
in Zoomies within one safety-sweep interval (plus the poll tick it starts on) after GitHub finished
the last one, run exactly once and on its own runner; no runner may be made that runs no
job, no agent task may be left open or given up on, and no workload may be left behind.
`ZOOMIES_DRILL_JOBS` and `ZOOMIES_DRILL_KILLS` change the size."""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.e2e.drills import live_workloads, tasks_once_ended
from tests.e2e.harness import wait_for
from tests.e2e.test_first_job import LABELS, POOL, jit_mints, setup_fleet

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    # The full size (200 jobs, 10 kills, twice) runs past the suite's 300 s per test.
    pytest.mark.timeout(1800),
    # Issue 21 item 16: on PostgreSQL too, what larger installations run on.
]

# Below about 40 jobs the burst is not much longer than three restarts take, and the bound
# of twice the undisturbed time would measure the restarts, not the recovery.
JOBS = int(os.environ.get("ZOOMIES_DRILL_JOBS", "40"))
KILLS = int(os.environ.get("ZOOMIES_DRILL_KILLS", "3"))
# The controller's github.safety_sweep_interval (its default, set here so that the bound
# below is read beside it) and the poll tick a sweep starts on (tests/e2e/harness.py).
SWEEP_INTERVAL = 120
POLL_TICK = 5
# What the sweep's own calls and this test's reading of every job add to that bound.
READ_SLACK = 10


def burst(fake) -> list[int]:
    return [
        fake.queue_job(repo="acme/app", labels=LABELS, duration=3, conclusion="success")
        for _ in range(JOBS)
    ]


def test_run_task_a_controller_killed_during_a_burst_loses_and_doubles_nothing(e2e):
    """RUN-17, TASK-01, TASK-02, LEASE-02, LEASE-06: kill -9 at random points of a burst,
    restarting each time; the burst finishes within twice its undisturbed time, every job
    is recorded completed within a sweep interval of GitHub's end, once, on its own runner,
    every runner made runs a job, no task is left open or abandoned, no workload is left."""
    controller, fake = e2e
    controller.env["ZOOMIES_GITHUB_SAFETY_SWEEP_INTERVAL"] = f"{SWEEP_INTERVAL}s"
    installation = setup_fleet(controller, fake)["acme"]
    controller.start()
    controller.api("pools", method="POST", json=POOL)

    started = time.monotonic()
    calm = burst(fake)
    wait_for(lambda: all_completed_at_github(fake, calm), 1200, "the undisturbed burst")
    undisturbed = time.monotonic() - started
    wait_for(lambda: all_recorded(controller, calm), 180, "Zoomies to record the first burst")
    wait_for(lambda: all_runners_ended(controller), 180, "the first burst's runners to end")
    calm_mints = len(jit_mints(fake))

    # Kill points drawn over the undisturbed burst's length, so each lands inside the burst.
    rng = random.Random(1107)
    points = sorted(rng.uniform(0, undisturbed) for _ in range(KILLS))
    started, calm_calls = time.monotonic(), len(fake.answers)
    jobs = burst(fake)
    restarts = 0.0  # seconds from each kill to its successor answering /healthz
    for point in points:
        time.sleep(max(0.0, started + point - time.monotonic()))
        killed_at = time.monotonic()
        controller.kill()
        controller.start()
        restarts += time.monotonic() - killed_at
    wait_for(lambda: all_completed_at_github(fake, jobs), 1200, "every job to complete at GitHub")
    finished = time.monotonic() - started
    bound = SWEEP_INTERVAL + POLL_TICK + READ_SLACK
    try:
        wait_for(lambda: all_recorded(controller, jobs), bound, "Zoomies to record every job")
    except AssertionError as exc:
        why = not_converged(controller, fake, jobs, installation)
        raise AssertionError(f"{exc}\n{why}") from None
    converged = time.monotonic() - started - finished
    runner_names = [fake.job(j)["runner_name"] for j in jobs]
    mints = len(jit_mints(fake)) - calm_mints
    wait_for(lambda: all_runners_ended(controller), 180, "every runner to end")
    wait_for(
        lambda: live_workloads(controller.data_dir) == 0,
        90,
        "no runner workload left behind after the grace",
    )
    tasks = tasks_once_ended(controller)
    print(
        f"drill: {JOBS} jobs, {KILLS} kills at {[round(p) for p in points]} s; undisturbed "
        f"burst {undisturbed:.0f} s, killed burst {finished:.0f} s (its restarts took "
        f"{restarts:.0f} s to answer) "
        f"({finished / undisturbed:.2f} times); every job recorded completed {converged:.0f} s "
        f"after GitHub finished; {mints} runners created for {JOBS} jobs ({mints - JOBS} "
        f"never ran a job); distinct runners per job: {len(set(runner_names))}; 0 workloads "
        f"left; {delivery_figures(fake, jobs)}; agent tasks by state (both bursts): {tasks}; "
        f"GitHub API calls counted against the installation's hour: "
        f"{fake.quota_used(installation)} (undisturbed {calls_by_kind(fake, 0, calm_calls)}, "
        f"killed {calls_by_kind(fake, calm_calls)})"
    )
    assert len(set(runner_names)) == JOBS, "a runner ran two jobs"
    assert mints == JOBS, "a runner was created that ran no job"
    assert not tasks.get("abandoned"), "an agent task was given up on"
    # Twice the undisturbed burst, plus what the restarts themselves took to come up: that is
    # the machine's cost of starting Python processes (a few seconds a restart on a quiet
    # fast machine, 10 to 15 s on a slow loaded one), not work lost or redone, which is what
    # the bound is for.
    assert finished <= 2 * undisturbed + restarts, (
        f"the killed burst ({finished:.0f} s) took more than twice the undisturbed "
        f"({undisturbed:.0f} s) plus its restarts ({restarts:.0f} s)"
    )


def all_completed_at_github(fake, jobs) -> bool:
    return all(fake.job(j)["status"] == "completed" for j in jobs)


def all_recorded(controller, jobs) -> bool:
    rows = {r["github_id"]: r["status"] for r in controller.api("jobs")}
    return all(rows.get(j) == "completed" for j in jobs)


def all_runners_ended(controller) -> bool:
    return all(r["state"] in ("removed", "failed") for r in controller.api("runners"))


def not_converged(controller, fake, jobs, installation) -> str:
    """Why jobs are still open in Zoomies: each one's row, its deliveries as the fake sent
    them, and how often its run's jobs were listed; the quota the installation spent."""
    rows = {r["github_id"]: r for r in controller.api("jobs")}
    calls = [c[1] for c in fake.calls]
    lines = []
    for job_id in jobs:
        row = rows.get(job_id)
        if row and row["status"] == "completed":
            continue
        truth = fake.job(job_id)
        sent = [
            (d["action"], d["status_code"], d["error"], d.get("redelivery"))
            for d in fake.deliveries
            if d["job_id"] == job_id
        ]
        listed = sum(c.endswith(f"/runs/{truth['run_id']}/jobs") for c in calls)
        lines.append(
            f"job {job_id} (run {truth['run_id']}): Zoomies {row and row['status']}, "
            f"deliveries {sent}, its run's jobs listed {listed} times"
        )
    quota = f"{fake.quota_used(installation)} {calls_by_kind(fake)}"
    return "\n".join([*lines, f"quota used: {quota}; logs in {controller.data_dir}"])


def delivery_figures(fake, jobs) -> str:
    """The killed burst's deliveries: how many failed (sent while no controller answered)
    and how many of those GitHub sent again when the controller asked."""
    ours = set(jobs)
    sent = [d for d in fake.deliveries if d["job_id"] in ours]
    first = [d for d in sent if not d.get("redelivery")]
    failed = [d for d in first if not ok(d)]
    again = {d["id"] for d in sent if d.get("redelivery") and ok(d)}
    made_good = sum(d["id"] in again for d in failed)
    return f"{len(failed)} of {len(first)} deliveries failed, {made_good} of them redelivered"


def ok(delivery) -> bool:
    return bool(delivery["status_code"]) and 200 <= delivery["status_code"] < 300


def calls_by_kind(fake, start: int = 0, end: int | None = None) -> dict[str, int]:
    """The installation's API calls GitHub counted (304s are free), by what they were for,
    of the answers from `start` to `end`."""
    kinds: dict[str, int] = {}
    for _, path, inst, status in fake.answers[start:end]:
        if inst is None or status == 304 or path == "/rate_limit":
            continue
        kind = (
            "run jobs" if path.endswith("/jobs") else
            "run lists" if path.endswith("/actions/runs") else
            "jit" if path.endswith("/generate-jitconfig") else
            path.rsplit("/", 2)[-2] if path[-1].isdigit() else path.rsplit("/", 1)[-1]
        )  # fmt: skip
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds
