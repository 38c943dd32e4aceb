"""Cross-process wake-ups for the processes that share one database: "look now".

The web server, the django-q2 cluster and the controller are separate processes. Each of
them finds new work by looking at the database on an interval (the broker's poll, the task
watcher's look), which puts up to one interval between a webhook and its runner at each
hop. A wake here is a one-byte Unix datagram to every process listening on a topic; the
listener looks at once instead of at the end of its interval.

A wake is only ever a hint: it carries nothing, it is sent after the commit that made the
work visible, and a lost one (a full socket buffer, a listener that started late, a bus
that could not be set up) costs one interval of the looker's own poll, which stays.

The sockets of one database live in one directory of the temporary folder, named for the
database (a hash of its engine, name, host and port), so two controllers on one machine
never wake each other, and a socket path stays well inside the 108 bytes AF_UNIX allows.
A listener killed without closing leaves its socket behind: the next sender that is
refused by it removes it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import select
import socket
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("zoomies.wakebus")

# The topics in use; a listener and its senders name the same one.
TASK_QUEUE = "q"  # a django-q2 task was enqueued (the broker's pusher looks)
AGENT_TASKS = "agent"  # an agent task is pending (the web process's task watcher looks)
EVENTS = "events"  # an event row was committed to the outbox (the web process's relay looks)

_serial = 0
_serial_lock = threading.Lock()


def bus_directory(database: Mapping[str, Any]) -> Path:
    """The directory of the sockets for `database` (a Django DATABASES entry)."""
    identity = "|".join(str(database.get(key) or "") for key in ("ENGINE", "NAME", "HOST", "PORT"))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"zoomies-wake-{digest}"


def _default_directory() -> Path:
    from django.db import connection  # type: ignore[import-untyped]  # noqa: PLC0415

    return bus_directory(connection.settings_dict)


class Listener:
    """One process's socket on one topic. Not shared between threads."""

    def __init__(self, topic: str, directory: Path | None = None) -> None:
        global _serial
        self.topic = topic
        self.directory = directory or _default_directory()
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _serial_lock:
            _serial += 1
            serial = _serial
        self.path = self.directory / f"{topic}.{os.getpid()}.{serial}.sock"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a socket left by an earlier process with this pid
        self._sock.bind(str(self.path))
        self.pid = os.getpid()

    def fileno(self) -> int:
        return self._sock.fileno()

    def drain(self) -> int:
        """Take every wake already sent; how many there were."""
        taken = 0
        while True:
            try:
                self._sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return taken
            taken += 1

    def wait(self, timeout: float) -> bool:
        """Block until a wake arrives or `timeout` seconds pass; True if woken (and drained)."""
        readable, _, _ = select.select([self._sock], [], [], max(timeout, 0.0))
        if not readable:
            return False
        self.drain()
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        if self.pid == os.getpid():  # a forked child must not remove its parent's socket
            with contextlib.suppress(OSError):
                self.path.unlink()
            with contextlib.suppress(OSError):
                self.directory.rmdir()  # only when it was the last socket of this database


_sender: socket.socket | None = None
_sender_pid = 0


def _sending_socket() -> socket.socket:
    global _sender, _sender_pid
    if _sender is None or _sender_pid != os.getpid():
        _sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        _sender.setblocking(False)
        _sender_pid = os.getpid()
    return _sender


def _send(path: Path) -> bool | None:
    """One wake to the socket at `path`: True if it is there to take it (a full buffer
    counts: it is awake already), None if its process is gone (the socket is removed),
    False for any other failure."""
    try:
        _sending_socket().sendto(b"!", str(path))
        return True
    except BlockingIOError:
        return True
    except OSError as error:
        if error.errno in (errno.ECONNREFUSED, errno.ENOENT):
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        log.debug("wake bus: sending to %s failed", path, exc_info=True)
        return False


def notify(topic: str, directory: Path | None = None) -> int:
    """Wake every listener on `topic`; how many were reached. Never raises."""
    try:
        folder = directory or _default_directory()
        paths = list(folder.glob(f"{topic}.*.sock"))
    except Exception:  # no bus here: the listeners' own polls find the work
        log.debug("wake bus: cannot list %s", topic, exc_info=True)
        return 0
    return sum(1 for path in paths if _send(path))


def sweep_stale(root: Path | None = None) -> int:
    """Remove the sockets of processes that are gone, and bus directories left empty.

    A killed process leaves its socket; senders remove the ones they are refused by, but a
    database nobody uses again keeps its directory. The controller sweeps at start. Returns
    how many sockets were removed. A live listener takes the sweep's wake as one more hint.
    """
    removed = 0
    for folder in (root or Path(tempfile.gettempdir())).glob("zoomies-wake-*"):
        removed += sum(1 for path in folder.glob("*.sock") if _send(path) is None)
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if empty
    return removed


def listen_or_none(topic: str) -> Listener | None:
    """A listener on `topic`, or None (logged) when the bus cannot be set up here: the
    caller then polls alone, as it did before the bus."""
    try:
        return Listener(topic)
    except OSError:
        log.warning("wake bus: cannot listen on %s; polling only", topic, exc_info=True)
        return None


_notifiers: dict[str, Any] = {}


def notify_on_commit(topic: str, using: str = "default") -> None:
    """Wake `topic`'s listeners once the current transaction commits (at once outside one).

    Once per transaction, however many writes ask: a burst of 64 deliveries commits 64 event
    rows and sends one wake.
    """
    from django.db import connections, transaction  # noqa: PLC0415

    notifier = _notifiers.get(topic)
    if notifier is None:
        notifier = _notifiers[topic] = lambda: notify(topic)
    connection = connections[using]
    # Django keeps the callbacks of the open transaction, and drops those of a rolled-back
    # savepoint, in `run_on_commit` as (savepoint ids, callback, robust).
    if connection.in_atomic_block and any(
        entry[1] is notifier for entry in connection.run_on_commit
    ):
        return
    transaction.on_commit(notifier, using=using)
