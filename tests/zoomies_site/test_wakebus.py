"""The wake bus: one-byte datagrams between the processes of one database, over real sockets.

Each test that needs "another process" starts a real one; a wake that never arrives shows as
a wait that returns False (or a poll still waiting when the test's deadline passes), never as
a timing figure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections
from django_q.conf import Conf

from zoomies_site.core import wakebus
from zoomies_site.qbroker import WakeableORM

ROOT = Path(__file__).resolve().parents[2]


def notify_from_another_process(topic: str, directory: Path) -> int:
    """`wakebus.notify` run by a separate Python process; how many listeners it reached."""
    code = (
        "import sys; from pathlib import Path; from zoomies_site.core import wakebus; "
        "print(wakebus.notify(sys.argv[1], Path(sys.argv[2])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, topic, str(directory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(out.stdout.strip())


@pytest.fixture
def bus() -> Iterator[Path]:
    # A short path of its own: AF_UNIX socket paths are limited to 108 bytes. Not named
    # zoomies-wake-*: a controller another test starts sweeps those at its start, and its
    # sweep's datagram would wake this test's listeners (a wake on the wrong topic, seen).
    directory = Path(f"/tmp/zwt-{os.getpid()}-{time.monotonic_ns()}")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_wake_from_another_process_reaches_every_listener_of_its_topic_only(bus):
    first = wakebus.Listener("q", bus)
    second = wakebus.Listener("q", bus)
    other_topic = wakebus.Listener("agent", bus)
    try:
        assert notify_from_another_process("q", bus) == 2
        assert first.wait(30) and second.wait(30)
        assert not other_topic.wait(0)
        assert not first.wait(0), "a wait drains what it was woken by"
    finally:
        for listener in (first, second, other_topic):
            listener.close()
    assert not bus.exists(), "the last listener to close removes its database's directory"


def test_a_socket_left_by_a_killed_process_is_removed_by_the_next_sender(bus):
    live = wakebus.Listener("q", bus)
    # A killed listener: its socket file stays, nobody reads it.
    dead_path = bus / "q.999999.1.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(dead_path))
    dead.close()
    try:
        assert wakebus.notify("q", bus) == 1
        assert not dead_path.exists()
        assert live.drain() == 1
    finally:
        live.close()


def test_no_listener_and_no_directory_is_no_error(bus):
    assert wakebus.notify("q", bus) == 0
    assert wakebus.notify("q", Path("/nonexistent/zoomies-wake")) == 0


def test_two_databases_have_two_buses():
    base = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/a.sqlite3"}
    assert wakebus.bus_directory(base) == wakebus.bus_directory(dict(base))
    assert wakebus.bus_directory(base) != wakebus.bus_directory({**base, "NAME": "/srv/b.sqlite3"})
    pg = {"ENGINE": "django.db.backends.postgresql", "NAME": "z", "HOST": "db", "PORT": 5432}
    assert wakebus.bus_directory(pg) != wakebus.bus_directory({**pg, "HOST": "db2"})
    # Well inside AF_UNIX's 108 bytes with a long topic, pid and serial.
    assert len(str(wakebus.bus_directory(pg) / "agent.4194304.1000000.sock")) < 100


@pytest.mark.django_db(transaction=True)
def test_hook04_an_enqueue_wakes_the_pusher_of_another_broker_before_its_poll(monkeypatch):
    """HOOK-04: a reconcile task asked for by a webhook is taken at once, not after `poll`:
    the pusher's wait (poll set to 60 s here) is cut short by the enqueue's wake."""
    monkeypatch.setattr(Conf, "POLL", 60)
    pusher = WakeableORM(list_key="wake-test")
    webhook_side = WakeableORM(list_key="wake-test")
    listener = pusher._wake_listener()
    assert listener is not None
    waiting, woken = threading.Event(), []
    real_wait = listener.wait

    def recorded_wait(timeout: float) -> bool:
        waiting.set()
        woken.append(real_wait(timeout))
        return woken[-1]

    monkeypatch.setattr(listener, "wait", recorded_wait)
    taken: list = []

    def pusher_thread() -> None:
        try:
            taken.append(pusher.dequeue())
        finally:
            connections.close_all()  # this thread's own connection: none outlives the test

    thread = threading.Thread(target=pusher_thread)
    thread.start()
    try:
        assert waiting.wait(30), "the pusher never started waiting"
        task_id = webhook_side.enqueue("the payload")
        thread.join(30)
        assert not thread.is_alive(), "the enqueue did not wake the waiting pusher"
        assert woken == [True] and taken == [None]
        assert pusher.dequeue() == [(task_id, "the payload")]
    finally:
        thread.join(65)
        listener.close()


def test_the_sweep_removes_dead_sockets_and_empty_directories_but_keeps_live_ones(bus):
    root = bus  # the sweep's root: bus directories inside it are named as in the temp folder
    live_dir, dead_dir = root / "zoomies-wake-live", root / "zoomies-wake-dead"
    live = wakebus.Listener("q", live_dir)
    dead_dir.mkdir()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(dead_dir / "q.999999.1.sock"))
    dead.close()
    try:
        assert wakebus.sweep_stale(root) == 1
        assert not dead_dir.exists()
        assert live.path.exists() and live.drain() == 1
    finally:
        live.close()


@pytest.mark.django_db(transaction=True)
def test_one_wake_per_committed_transaction_and_none_for_a_rolled_back_one():
    from django.db import connection, transaction  # noqa: PLC0415

    listener = wakebus.Listener("t", wakebus.bus_directory(connection.settings_dict))
    try:
        with transaction.atomic():
            for _ in range(5):
                wakebus.notify_on_commit("t")
            assert listener.drain() == 0, "nothing before the commit"
        assert listener.drain() == 1
        with pytest.raises(RuntimeError), transaction.atomic():
            wakebus.notify_on_commit("t")
            raise RuntimeError("rolled back")
        assert listener.drain() == 0
        # Asked first inside a savepoint that rolls back, then again outside it.
        with transaction.atomic():
            with pytest.raises(RuntimeError), transaction.atomic():
                wakebus.notify_on_commit("t")
                raise RuntimeError("savepoint rolled back")
            wakebus.notify_on_commit("t")
        assert listener.drain() == 1
        wakebus.notify_on_commit("t")  # outside a transaction: at once
        assert listener.drain() == 1
    finally:
        listener.close()
