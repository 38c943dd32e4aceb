"""A restarted controller takes over what its killed predecessor held at once, not at the
leases' expiry (issue 11 item 3; LEASE-06, TASK-02)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest

from fleet.models import AgentTask
from fleet.taskqueue import enqueue_task, take_tasks
from runners.reconcile import LEASE_NAME as RECONCILE
from runners.reconcile import LEASE_TTL
from tests.fleet.conftest import T0, join, make_runner
from zoomies_site.core import leases
from zoomies_site.core.models import Lease
from zoomies_site.recovery import DeadGeneration, recover_after_restart

pytestmark = pytest.mark.usefixtures("registry_defaults")

DEAD, LIVE = 4_000_001, 4_000_002


def alive(pid: int) -> bool:
    return pid == LIVE


@pytest.mark.django_db
def test_lease06_every_lease_of_a_dead_process_on_this_host_is_freed_at_restart():
    """LEASE-06: the reconcile, poll and capacity leases a killed controller's workers held
    are freed by the restart, so the first pass runs now and not after LEASE_TTL."""
    for name, holder in [
        (RECONCILE, f"box:{DEAD}:ab12"),
        ("poll", f"box:{DEAD}:cd34"),
        ("capacity", f"box:{LIVE}:ef56"),  # a live process on this host: not ours to take
        ("webhook", f"other-box:{DEAD}:0000"),  # another host: its lease runs its course
    ]:
        leases.acquire(name, holder=holder, now=T0, ttl=LEASE_TTL)
    # Before: a caller of another host cannot prove the holder dead, and waits for expiry.
    assert not leases.acquire(RECONCILE, holder="elsewhere:1:new", now=T0, ttl=LEASE_TTL)

    lines = recover_after_restart(now=T0, embedded_host=None, host="box", alive=alive)

    assert sorted(line.split(":")[0] for line in lines) == ["lease poll", "lease reconcile"]
    assert leases.acquire(RECONCILE, holder="box:1:new", now=T0, ttl=LEASE_TTL)
    assert Lease.objects.get(name="capacity").holder == f"box:{LIVE}:ef56"
    assert Lease.objects.get(name="webhook").holder == f"other-box:{DEAD}:0000"
    # A freed lease is marked dirty: the wake the dead holder owed is served.
    assert Lease.objects.get(name="poll").dirty


@pytest.mark.django_db
def test_lease06_a_lease_whose_holder_died_on_this_host_is_taken_at_once_by_the_next_caller():
    """Several `workers` on one machine: one killed mid-pass held the reconcile lease for its
    five minutes, and nothing was scheduled meanwhile (the scale-out drill, seen). The next
    caller on the same host takes it over at once; a live holder, or one of another host,
    keeps it until it expires."""
    here = socket.gethostname()
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that has ended
    leases.acquire(RECONCILE, holder=f"{here}:{dead.pid}:ab12", now=T0, ttl=LEASE_TTL)
    assert leases.acquire(RECONCILE, holder=f"{here}:{os.getpid()}:new", now=T0, ttl=LEASE_TTL)
    assert Lease.objects.get(name=RECONCILE).holder == f"{here}:{os.getpid()}:new"

    leases.acquire("poll", holder=f"{here}:{os.getpid()}:live", now=T0, ttl=LEASE_TTL)
    assert not leases.acquire("poll", holder=f"{here}:1:other", now=T0, ttl=LEASE_TTL)
    leases.acquire("capacity", holder=f"elsewhere:{dead.pid}:cd34", now=T0, ttl=LEASE_TTL)
    assert not leases.acquire("capacity", holder=f"{here}:1:other", now=T0, ttl=LEASE_TTL)
    assert leases.acquire("capacity", holder=f"{here}:1:other", now=T0 + LEASE_TTL * 2,
                          ttl=LEASE_TTL)  # fmt: skip


@pytest.mark.django_db
def test_task02_the_embedded_agents_tasks_in_flight_are_offered_again_at_restart():
    """TASK-02: the embedded agent died with the controller, so its in-flight create is
    offered again at once instead of after its 20-minute lease; a remote host's task is
    left to its lease (that agent may still be working on it)."""
    embedded, _ = join("zoomies-box")
    remote, _ = join("remote-1")
    mine = enqueue_task(
        host_id=embedded.pk,
        runner_id=make_runner(embedded).pk,
        kind="create_runner",
        payload={},
        now=T0,
    )
    theirs = enqueue_task(
        host_id=remote.pk,
        runner_id=make_runner(remote).pk,
        kind="create_runner",
        payload={},
        now=T0,
    )
    assert take_tasks(embedded, T0) and take_tasks(remote, T0)
    restart = T0 + timedelta(seconds=5)

    lines = recover_after_restart(now=restart, embedded_host="zoomies-box", alive=alive)

    assert any(f"#{mine.pk}" in line and "offered again (2)" in line for line in lines)
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert (mine.state, mine.lease_deadline) == ("pending", None)
    assert theirs.state == "in_flight"
    # The restarted embedded agent's first poll gets it, as its second offer.
    (again,) = take_tasks(embedded, restart)
    assert (again.pk, again.attempt) == (mine.pk, 2)
    assert AgentTask.objects.filter(state="in_flight").count() == 2


def test_a_zombie_is_not_alive():
    """Issue 21 item 17: the killed controller's children, dead but not yet reaped by init,
    still answer `kill(pid, 0)`; their leases must not wait for the reaper."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.01)
        os.kill(pid, 0)  # what the old check asked: it still succeeds on a zombie
        assert not leases.pid_alive(pid)
    finally:
        os.waitpid(pid, 0)
    assert not leases.pid_alive(pid)
    assert leases.pid_alive(os.getpid())


@pytest.mark.django_db
def test_lease06_a_lease_whose_holder_still_dies_is_freed_as_soon_as_it_has_died():
    """Issue 21 item 17: at the restart one worker of the killed controller still ran (its
    parent-death signal not yet served, or stuck in the kernel). Its lease is not freed then;
    the controller's loop steps the dead generation and frees it the moment the holder is
    gone, rather than leaving every pass blocked until the lease expires."""
    running = {LIVE}
    leases.acquire(RECONCILE, holder=f"box:{LIVE}:ab12", now=T0, ttl=LEASE_TTL)
    leases.acquire("poll", holder=f"box:{DEAD}:cd34", now=T0, ttl=LEASE_TTL)

    recover_after_restart(now=T0, embedded_host=None, host="box", alive=running.__contains__)
    waiting = DeadGeneration(host="box", alive=running.__contains__)

    assert Lease.objects.get(name=RECONCILE).holder == f"box:{LIVE}:ab12"
    assert waiting.step() is True  # still running: still waited for, not taken
    assert Lease.objects.get(name=RECONCILE).holder == f"box:{LIVE}:ab12"
    running.clear()  # it died
    assert waiting.step() is False
    assert leases.acquire(RECONCILE, holder="box:1:new", now=T0, ttl=LEASE_TTL)


@pytest.mark.django_db
def test_the_dead_generation_is_only_what_ran_at_the_restart():
    """A lease taken after the restart by a process of the new controller is not the dead
    generation's: stepping never frees it, and with nothing pending the steps end."""
    waiting = DeadGeneration(host="box", alive=lambda pid: True)
    leases.acquire(RECONCILE, holder=f"box:{LIVE}:new", now=T0, ttl=LEASE_TTL)
    assert waiting.step() is False
    assert Lease.objects.get(name=RECONCILE).holder == f"box:{LIVE}:new"
