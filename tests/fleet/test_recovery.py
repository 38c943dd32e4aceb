"""A restarted controller takes over what its killed predecessor held at once, not at the
leases' expiry (issue 11 item 3; LEASE-06, TASK-02)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet.models import AgentTask
from fleet.taskqueue import enqueue_task, take_tasks
from runners.reconcile import LEASE_NAME as RECONCILE
from runners.reconcile import LEASE_TTL
from tests.fleet.conftest import T0, join, make_runner
from zoomies_site.core import leases
from zoomies_site.models import Lease
from zoomies_site.recovery import recover_after_restart

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
    # Before: nobody else can run a pass until the lease expires.
    assert not leases.acquire(RECONCILE, holder="box:1:new", now=T0, ttl=LEASE_TTL)

    lines = recover_after_restart(now=T0, embedded_host=None, host="box", alive=alive)

    assert sorted(line.split(":")[0] for line in lines) == ["lease poll", "lease reconcile"]
    assert leases.acquire(RECONCILE, holder="box:1:new", now=T0, ttl=LEASE_TTL)
    assert Lease.objects.get(name="capacity").holder == f"box:{LIVE}:ef56"
    assert Lease.objects.get(name="webhook").holder == f"other-box:{DEAD}:0000"
    # A freed lease is marked dirty: the wake the dead holder owed is served.
    assert Lease.objects.get(name="poll").dirty


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
