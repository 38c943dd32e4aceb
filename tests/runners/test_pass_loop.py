"""The woken reconcile pass off the task queue (issue 28): wakes on the real wake bus, sent
after their transaction commits, to a real listener thread (runners/pass_loop.py)."""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator

import pytest
from django.db import transaction
from django_q.models import OrmQ

from runners import wake
from runners.pass_loop import HUNG_AFTER, PassLoop
from tests.runners.conftest import wakes_asked
from tests.waiting import wait_until
from zoomies_site.core import wakebus
from zoomies_site.core.metrics import RECONCILE_WAKES
from zoomies_site.core.models import Lease


def signalled() -> float:
    return RECONCILE_WAKES.labels("signalled")._value.get()


def pending(loop: PassLoop) -> bool:
    """Whether a wake waits in the loop's socket, not yet taken."""
    listener = loop._listener
    assert listener is not None
    readable, _, _ = select.select([listener], [], [], 0)
    return bool(readable)


@pytest.fixture
def loops() -> Iterator[list[PassLoop]]:
    started: list[PassLoop] = []
    yield started
    for loop in started:
        loop.stop()


def started(loops: list[PassLoop], **kwargs) -> PassLoop:
    loop = PassLoop(**kwargs)
    assert loop.start(), "the wake bus could not be set up"
    loops.append(loop)
    return loop


@pytest.mark.django_db(transaction=True)
def test_hook04_a_burst_of_wakes_in_one_transaction_writes_nothing_and_runs_one_pass(loops):
    """HOOK-04, SCHED-27: with a loop listening, the webhook writer's transaction gets no
    flag and no queued task; one wake is sent, after the commit, and one pass runs."""
    loop = started(loops, run=lambda: None)
    asked, sent = wakes_asked(), signalled()
    with transaction.atomic():
        for _ in range(20):
            wake.wake_reconcile()
        assert signalled() == sent, "a wake sent before the commit could run a pass that misses it"
    assert wakes_asked() == asked + 20
    assert signalled() == sent + 1
    wait_until(lambda: loop.passes == 1, 10, "the woken pass")
    assert not OrmQ.objects.exists()
    # No flag row was claimed either (the queue's coalescing write).
    assert not Lease.objects.filter(name=wake.WAKE_FLAG, dirty=True).exists()


@pytest.mark.django_db(transaction=True)
def test_sched27_wakes_during_a_pass_run_exactly_one_more(loops):
    """SCHED-27: wakes that land while a pass runs wait in the socket, and the next wait
    takes them all: one more pass, not one a wake, and none lost."""
    inside, release = threading.Event(), threading.Event()

    def slow_pass() -> None:
        inside.set()
        release.wait(10)

    loop = started(loops, run=slow_pass)
    wake.wake_reconcile()
    assert inside.wait(10)
    for _ in range(5):
        wake.wake_reconcile()
    release.set()
    wait_until(lambda: loop.passes == 2 and loop.pass_started is None, 10, "the second pass")
    assert not pending(loop), "a wake was left for a third pass"
    assert loop.wakes == 2


@pytest.mark.django_db(transaction=True)
def test_a_pass_that_fails_is_logged_and_the_next_wake_runs_another(loops, caplog):
    outcomes = iter([RuntimeError("the database went away"), None])

    def flaky() -> None:
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome

    loop = started(loops, run=flaky)
    wake.wake_reconcile()
    wait_until(lambda: loop.passes == 1, 10, "the failing pass")
    assert "the database went away" in caplog.text
    wake.wake_reconcile()
    wait_until(lambda: loop.passes == 2, 10, "the pass after it")


@pytest.mark.django_db(transaction=True)
def test_an_inactive_loop_takes_the_wake_and_runs_nothing_while_another_runs_it(loops):
    """Scale-out: every workers process listens, only the ticker's holder runs the pass;
    the senders see listeners, so nothing falls back to the queue."""
    standby = started(
        loops, run=lambda: pytest.fail("the standby ran a pass"), active=lambda: False
    )
    holder = started(loops, run=lambda: None)
    wake.wake_reconcile()
    wait_until(lambda: standby.wakes == 1 and holder.passes == 1, 10, "both woken")
    assert standby.passes == 0
    assert not OrmQ.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_with_no_loop_listening_a_wake_queues_a_pass_after_the_commit():
    """A wake outside the controller (a command, a test) still runs a pass: on the task
    queue, coalesced by the flag, and only once its transaction has committed."""
    assert not list(wakebus._default_directory().glob(f"{wakebus.RECONCILE}.*.sock"))
    with transaction.atomic():
        wake.wake_reconcile()
        wake.wake_reconcile()
        assert not OrmQ.objects.exists()
    assert OrmQ.objects.get().task["func"] == "runners.tasks.reconcile_task"
    wake.wake_reconcile()
    assert OrmQ.objects.count() == 1  # queued and not started: the flag holds the rest


@pytest.mark.django_db(transaction=True)
def test_a_stopped_loop_leaves_no_socket_so_wakes_fall_back_to_the_queue(loops):
    loop = started(loops, run=lambda: None)
    loop.stop()
    assert not loop.listening
    wake.wake_reconcile()
    assert OrmQ.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_pass_running_past_the_queues_timeout_reads_as_hung_until_it_ends(loops):
    """The controller warns while `hung()` holds: the loop's wakes wait behind that pass, and
    the ticker's passes take over only once its lease expires."""
    now = [1000.0]
    inside, release = threading.Event(), threading.Event()

    def stuck() -> None:
        inside.set()
        release.wait(10)

    loop = started(loops, run=stuck, clock=lambda: now[0])
    assert not loop.hung()
    wake.wake_reconcile()
    assert inside.wait(10)
    now[0] += HUNG_AFTER
    assert not loop.hung()
    now[0] += 1
    assert loop.hung()
    release.set()
    wait_until(lambda: loop.passes == 1, 10, "the pass to end")
    assert not loop.hung()
