"""The task cluster as threads of one process (zoomies_site/thread_cluster.py): django-q2's
pusher, workers and monitor on the real broker and database, and the guard's answer to a task
that runs past its timeout, with the guard's rounds stepped by the test, not slept through."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections
from django_q.models import Success
from django_q.tasks import async_task

from tests.waiting import wait_until as wait_for
from zoomies_site import thread_cluster
from zoomies_site.thread_cluster import MAX_ABANDONED, ThreadCluster, TooManyAbandoned

pytestmark = pytest.mark.django_db(transaction=True)

RELEASE = threading.Event()
STARTED: list[str] = []


def held_task(name: str) -> str:
    STARTED.append(name)
    RELEASE.wait(30)
    return name


def quick_task(value: int) -> int:
    return value * 2


def a_task(name: str, func=held_task, timeout: int = 5) -> dict:
    """A task as django-q2's pusher hands it to a worker."""
    return {
        "id": name, "name": name, "func": func, "args": (name,), "kwargs": {},
        "timeout": timeout, "ack_failure": True,
    }  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_task_state():
    RELEASE.clear()
    STARTED.clear()
    yield
    RELEASE.set()


def test_tasks_are_taken_run_and_saved_and_a_stop_finishes_what_runs():
    """A task enqueued on the real broker is taken by the pusher thread, run by a worker
    thread and saved by the monitor thread; a stop lets a running task end and saves it."""
    cluster = ThreadCluster(workers=2)
    cluster.start()
    try:
        async_task(quick_task, 21, task_name="quick")
        wait_for(lambda: Success.objects.filter(name="quick").exists(), 30, "the result saved")
        assert Success.objects.get(name="quick").result == 42
        async_task(held_task, "held", task_name="held")
        wait_for(lambda: STARTED == ["held"], 30, "the held task to start")
        cluster.stop()
        assert not cluster.finished.wait(0.5), "the stop did not wait for the running task"
        RELEASE.set()
        assert cluster.finished.wait(30)
        assert cluster.failure is None
        assert Success.objects.filter(name="held").exists(), "a stop lost a task's result"
        assert not [t.name for t in threading.enumerate() if t.name.startswith("q-")]
    finally:
        cluster.stop()
        RELEASE.set()
        cluster.finished.wait(30)


def test_a_task_past_its_timeout_is_left_to_finish_and_its_worker_replaced():
    """A thread cannot be killed: the guard gives up on a worker whose task ran out its time
    (counted down by the guard's rounds, as django-q2's sentinel does), starts another in
    its place, and the abandoned one takes no further task once its own ends."""
    cluster = ThreadCluster(workers=1, timeout=5)
    cluster._spawn_worker()
    first = cluster.pool[0]
    cluster.tasks.put(a_task("slow", timeout=2))
    wait_for(lambda: STARTED == ["slow"], 10, "the task to start")
    rounds = 0
    while first in cluster.pool:
        cluster.guard_once(0.5)  # 2 s and the 3 s django-q2 adds, in half-second rounds
        rounds += 1
        assert rounds < 20, "the guard never gave up on the task"
    assert rounds == 11  # 5 s of time left, checked before each round's half second
    assert first.inbox.abandoned and cluster.abandoned == [first]
    assert len(cluster.pool) == 1 and cluster.pool[0] is not first
    replacement = cluster.pool[0]
    cluster.tasks.put(a_task("next", func=quick_task))
    wait_for(lambda: cluster.results.qsize() == 1, 10, "the replacement to run the next task")
    assert cluster.results.get()["name"] == "next"
    RELEASE.set()
    first.thread.join(10)
    assert not first.thread.is_alive(), "the abandoned worker took more work"
    assert cluster.results.get(timeout=5)["name"] == "slow"  # its result is still saved
    cluster.guard_once(0.5)
    assert cluster.abandoned == []
    cluster.tasks.put("STOP")
    replacement.thread.join(10)


def test_too_many_abandoned_tasks_end_the_cluster_so_the_process_is_started_afresh(
    monkeypatch,
):
    monkeypatch.setattr(thread_cluster, "MAX_ABANDONED", 2)
    cluster = ThreadCluster(workers=2, timeout=1)
    for _ in range(2):
        cluster._spawn_worker()
    cluster.tasks.put(a_task("a", timeout=1))
    cluster.tasks.put(a_task("b", timeout=1))
    wait_for(lambda: sorted(STARTED) == ["a", "b"], 10, "both tasks to start")
    with pytest.raises(TooManyAbandoned, match="2 tasks past their timeout"):
        for _ in range(20):
            cluster.guard_once(0.5)
    RELEASE.set()
    for _ in cluster.pool:
        cluster.tasks.put("STOP")
    for member in cluster.pool + cluster.abandoned:
        member.thread.join(10)
    assert MAX_ABANDONED >= 2


def test_a_failed_guard_stops_the_cluster_and_says_why(monkeypatch):
    """The controller watches `poll()` as it watches a forked child: a cluster that stopped
    on its own is an exit with its reason, not a silent loss of every background task."""
    cluster = thread_cluster.InProcessCluster.__new__(thread_cluster.InProcessCluster)
    cluster.args, cluster.returncode, cluster.killed = ["task cluster"], None, False
    cluster.cluster = ThreadCluster(workers=1)
    monkeypatch.setattr(thread_cluster.Conf, "GUARD_CYCLE", 0.05)

    def failing_round(cycle: float) -> None:
        raise TooManyAbandoned("4 tasks past their timeout still run")

    monkeypatch.setattr(cluster.cluster, "guard_once", failing_round)
    cluster.cluster.start()
    assert cluster.wait(timeout=30) == 1
    assert cluster.cluster.failure == "4 tasks past their timeout still run"
    started = time.monotonic()
    assert cluster.wait(timeout=1) == 1 and time.monotonic() - started < 1


def test_two_worker_threads_of_one_process_never_share_a_tasks_lease(monkeypatch):
    """The workers are threads of one process: a lease holder named by host and pid alone
    would let a second scheduled backup run beside the first (the backup's holder had no
    token of its own). The second finds the lease taken and does nothing."""
    from zoomies_site.backup import service, tasks  # noqa: PLC0415

    entered, calls = threading.Event(), []

    def slow_backup(now):
        calls.append(now)
        entered.set()
        RELEASE.wait(30)
        return {"took": None, "why": "", "pruned": [], "errors": []}

    def first_backup() -> None:
        try:
            tasks.backup_task()
        finally:
            # A worker thread closes its connection as it ends (thread_cluster._thread); so
            # does this one, or the test database cannot be dropped at the run's end.
            connections.close_all()

    monkeypatch.setattr(service, "scheduled", slow_backup)
    first = threading.Thread(target=first_backup)
    first.start()
    try:
        assert entered.wait(30)
        assert tasks.backup_task() is None
        assert len(calls) == 1
    finally:
        RELEASE.set()
        first.join(30)
