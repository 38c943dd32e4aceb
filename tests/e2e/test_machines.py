"""A rented host, end to end, on one box (issue 23 item 6): a queued job on an empty fleet
rents a machine from the local provider (a fresh agent process), whose agent joins with the
machine's claim code and runs the job on a runner; idle, the machine drains and is deleted.
And the same with the controller killed while the machine is being created: one machine,
no orphan, the job done (MACH-05, MACH-06 across a crash)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.e2e.drills import query
from tests.e2e.harness import wait_for
from tests.e2e.test_first_job import LABELS, POOL, setup_fleet

pytestmark = pytest.mark.e2e

MACHINE_ENV = {
    "ZOOMIES_MACHINES_INTERVAL": "1s",
    "ZOOMIES_MACHINES_IDLE_TIMEOUT": "10s",
    "ZOOMIES_MACHINES_JOIN_TIMEOUT": "2m",
}
CONFIGURE = (
    "from django.utils import timezone; from fleet.models import MachineProvider; "
    "MachineProvider.objects.create(name='local', kind='local', pools=['zoomies-e2e'], "
    "max_machines=1, max_per_pool=1, slots_per_machine=2, config={'capacity': 2}, "
    "created_at=timezone.now())"
)


def machines(controller) -> list[tuple[str, str]]:
    return query(controller, "SELECT name, state FROM fleet_machine ORDER BY id")


def machine_dirs(controller) -> list[str]:
    """The machines the local provider has, not a create's files still being written beside
    them (`.<identity>.creating`, renamed into place whole)."""
    root = controller.data_dir / "machines"
    return (
        sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
        if root.is_dir()
        else []
    )


def agents_running(controller) -> int:
    """Agent processes of rented machines still alive (their command lines name the dir)."""
    needle = str(controller.data_dir / "machines")
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    count += needle.encode() in f.read()
            except OSError:
                continue
    return count


def rent_and_run(controller, fake) -> int:
    """A controller with no embedded agent and the local provider configured, a pool, and
    one job queued for it: the job's id."""
    controller.env.update(MACHINE_ENV)
    setup_fleet(controller, fake)
    controller.manage("shell", "-c", CONFIGURE)
    controller.start("--no-agent")
    controller.api("pools", method="POST", json=POOL)
    return fake.queue_job(repo="acme/app", labels=LABELS, duration=2)


@pytest.mark.slow  # over 20 s of a worker: .ci/run's slow pass, on both databases
def test_a_job_on_an_empty_fleet_rents_a_machine_runs_on_it_and_the_machine_is_given_back(e2e):
    """MACH-04, 11, 12, 14, 15: planned, created, joined with its claim code, a host that
    ran the job, then idle, drained, deleted, and proved gone; nothing left behind."""
    controller, fake = e2e
    job = rent_and_run(controller, fake)

    wait_for(lambda: fake.job(job)["status"] == "completed", 180, "the job to run on a machine")
    ((name, _state),) = machines(controller)
    hosts = {h["name"]: h for h in controller.api("hosts")}
    assert name in hosts, hosts  # its agent joined under the machine's name
    assert fake.job(job)["runner_name"], "the job ran on a runner"
    wait_for(lambda: machines(controller) == [(name, "deleted")], 120, "the machine given back")
    assert machine_dirs(controller) == []
    wait_for(lambda: agents_running(controller) == 0, 30, "no agent of a machine left")
    log = controller.log()
    assert "Traceback" not in log, log


@pytest.mark.slow  # a drill: .ci/run's slow pass, after the test command
def test_a_controller_killed_while_a_machine_is_created_ends_with_one_machine_and_the_job_done(
    e2e,
):
    """MACH-05, MACH-06 across a crash: the controller is SIGKILLed the moment the machine's
    resource appears (its row says creating, the answer never came back); the restarted
    loop asks who owns the identity and carries on with that machine. Exactly one machine,
    no orphan, the job done."""
    controller, fake = e2e
    job = rent_and_run(controller, fake)

    deadline = time.monotonic() + 120
    while not machine_dirs(controller):
        assert time.monotonic() < deadline, "no machine was created"
        time.sleep(0.002)
    os.killpg(controller.process.pid, signal.SIGKILL)  # the controller alone: its group
    controller.process.wait(timeout=10)
    killed_in = machines(controller)
    # The row written, the resource made, the answer never recorded.
    assert [state for _, state in killed_in] == ["creating"], killed_in

    controller.start("--no-agent")
    wait_for(lambda: fake.job(job)["status"] == "completed", 180, "the job to run after it")
    wait_for(lambda: [s for _, s in machines(controller)] == ["deleted"], 120,
             "the one machine given back")  # fmt: skip
    left = list((controller.data_dir / "machines").iterdir())
    assert left == [], f"an orphan machine (or a create's files) was left: {left}"
    wait_for(lambda: agents_running(controller) == 0, 30, "no agent of a machine left")
