"""What the drills read off a controller after a burst, and the wait for it to settle.

The drills (tests/e2e/test_drills_*.py) each end the same way: every runner ended, no runner
process left, every agent task ended. These read the controller's database (its SQLite file,
or its PostgreSQL database on a PostgreSQL run) and /proc directly, since a drill's
controller may be down or degraded when they are asked.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from fleet.agent.backends.process_shim import SPAWNER_NAME
from tests.e2e.harness import wait_for


def query(controller, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows of one read of the controller's own database, whichever engine it runs on
    (`sql` with `%s` placeholders)."""
    url = controller.env.get("ZOOMIES_DATABASE_URL")
    if url:
        with psycopg.connect(url) as db:
            return db.execute(sql, params).fetchall()
    db = sqlite3.connect(controller.data_dir / "zoomies.db", timeout=30)
    try:
        return db.execute(sql.replace("%s", "?"), params).fetchall()
    finally:
        db.close()


def task_states(controller) -> dict[str, int]:
    """The agent tasks by state, read from the controller's database."""
    return dict(query(controller, "SELECT state, COUNT(*) FROM fleet_agenttask GROUP BY state"))


def audited(controller, action: str) -> int:
    """How many audit rows of this action the controller wrote (rows outlive the runners)."""
    sql = "SELECT COUNT(*) FROM accounts_auditlog WHERE action = %s"
    return query(controller, sql, (action,))[0][0]


def live_workloads(data_dir: Path) -> int:
    """Runner processes still alive: their command lines name the agent's state dir. The
    process backend's spawner names it too but is the agent's own helper, not a runner's
    (its supervisors keep its command line: its name tells them apart)."""
    count = 0
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if str(data_dir) not in cmdline:
                continue
            count += (pid_dir / "comm").read_text().strip() != SPAWNER_NAME
        except OSError:
            continue
    return count


def tasks_once_ended(controller) -> dict[str, int]:
    """Waits until no agent task is pending or in flight; the tasks by state."""
    return wait_for(
        lambda: (
            (t := task_states(controller)) and not t.get("pending") and not t.get("in_flight") and t
        ),
        120,
        "every agent task to end",
    )


def settled(controller) -> dict[str, int]:
    """Waits for every runner to end, no runner process to be left and every agent task to
    end; the tasks by state."""
    wait_for(
        lambda: all(r["state"] in ("removed", "failed") for r in controller.api("runners")),
        180,
        "every runner to end",
    )
    wait_for(lambda: live_workloads(controller.data_dir) == 0, 90, "no runner process left")
    return tasks_once_ended(controller)
