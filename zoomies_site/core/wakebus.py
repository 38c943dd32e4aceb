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

Across machines (issue 26 item 4: several web and worker processes on PostgreSQL), a Unix
socket reaches no one; with `ZOOMIES_REDIS_URL` set, the bus is Redis pub/sub instead, on
one channel per database and topic, with the same Listener surface (a file descriptor to
wait on, drain, wait, close) and the same promise: a hint, never the only way work is found.
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

from zoomies_site.core import environment

log = logging.getLogger("zoomies.wakebus")

# The topics in use; a listener and its senders name the same one.
TASK_QUEUE = "q"  # a django-q2 task was enqueued (the broker's pusher looks)
AGENT_TASKS = "agent"  # an agent task is pending (the web process's task watcher looks)
EVENTS = "events"  # an event row was committed to the outbox (the web process's relay looks)

_serial = 0
_serial_lock = threading.Lock()


REDIS_ENV = "ZOOMIES_REDIS_URL"


def database_digest(database: Mapping[str, Any]) -> str:
    """A short name for one database (a Django DATABASES entry): its engine, name, host, port."""
    identity = "|".join(str(database.get(key) or "") for key in ("ENGINE", "NAME", "HOST", "PORT"))
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def bus_directory(database: Mapping[str, Any]) -> Path:
    """The directory of the sockets for `database` (a Django DATABASES entry)."""
    return Path(tempfile.gettempdir()) / f"zoomies-wake-{database_digest(database)}"


def _default_database() -> Mapping[str, Any]:
    from django.db import connection  # noqa: PLC0415

    settings: Mapping[str, Any] = connection.settings_dict
    return settings


def _default_directory() -> Path:
    return bus_directory(_default_database())


def redis_url() -> str:
    return environment.read(REDIS_ENV)


def redis_channel(topic: str, database: Mapping[str, Any] | None = None) -> str:
    return f"zoomies-wake:{database_digest(database or _default_database())}:{topic}"


class RedisListener:
    """One process's subscription to one topic on Redis. Not shared between threads."""

    def __init__(self, topic: str, url: str, channel: str | None = None) -> None:
        import redis  # noqa: PLC0415  # only where Redis is configured

        self.topic = topic
        self.channel = channel or redis_channel(topic)
        self._client = redis.Redis.from_url(url, socket_timeout=5)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        self._pubsub.subscribe(self.channel)
        # The subscription is confirmed before the listener is handed out, so a wake sent
        # after construction is never one the server dropped for want of a subscriber.
        deadline = 5.0
        while self._pubsub.subscribed is False or self._pubsub.connection is None:
            self._pubsub.get_message(timeout=0.1)
            deadline -= 0.1
            if deadline <= 0:
                raise OSError(f"redis did not confirm the subscription to {self.channel}")
        self._pubsub.get_message(timeout=0.5)  # the confirmation itself, taken and ignored

    def fileno(self) -> int:
        connection = self._pubsub.connection
        if connection is None or connection._sock is None:
            raise OSError("the Redis connection is closed")
        fd: int = connection._sock.fileno()
        return fd

    def drain(self) -> int:
        taken = 0
        while self._pubsub.get_message(timeout=0.0) is not None:
            taken += 1
        return taken

    def wait(self, timeout: float) -> bool:
        if self._pubsub.get_message(timeout=max(timeout, 0.0)) is None:
            return False
        self.drain()
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pubsub.close()
        with contextlib.suppress(Exception):
            self._client.close()


_publisher: Any = None
_publisher_key: tuple[int, str] = (0, "")


def _publish(topic: str, url: str) -> int:
    """One wake to every subscriber of `topic` on Redis; how many received it."""
    global _publisher, _publisher_key
    import redis  # noqa: PLC0415  # only where Redis is configured

    if _publisher is None or _publisher_key != (os.getpid(), url):
        _publisher = redis.Redis.from_url(url, socket_timeout=2)
        _publisher_key = (os.getpid(), url)
    try:
        received: int = _publisher.publish(redis_channel(topic), b"!")
        return received
    except redis.RedisError:
        log.debug("wake bus: publishing %s to Redis failed", topic, exc_info=True)
        _publisher = None
        return 0


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
    if directory is None and (url := redis_url()):
        try:
            return _publish(topic, url)
        except Exception:  # no bus: the listeners' own polls find the work
            log.debug("wake bus: cannot publish %s", topic, exc_info=True)
            return 0
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


def listen_or_none(topic: str) -> Listener | RedisListener | None:
    """A listener on `topic` (on Redis when ZOOMIES_REDIS_URL is set), or None (logged) when
    the bus cannot be set up here: the caller then polls alone, as it did before the bus."""
    try:
        if url := redis_url():
            return RedisListener(topic, url)
        return Listener(topic)
    except Exception:
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
