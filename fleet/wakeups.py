"""Waking long-polling agents: one watcher per process, not one query per agent (TASK-13).

A waiting long-poll registers an asyncio Event for its host and awaits it. One watcher
thread per process looks, while anybody is waiting, at which of the waiting hosts have a
pending task (one indexed query every `POLL_INTERVAL`) and sets those hosts' Events. An
enqueue in this process also sets them at once through `notify_host`. A task written by
another process (a django-q2 worker's reconcile pass, a second web process) sends a wake on
the wake bus after its commit (`zoomies_site.core.wakebus`), which cuts the watcher's wait
short, so the interval is only the safety net for a lost wake.

Why a thread and not a task on the request's event loop: a loop is not guaranteed to
outlive the request that would have started the task (under WSGI every async view runs in
a loop of its own, which is closed when it returns), and a thread's query can never block
a loop that is serving other agents. Waiters on any loop are woken through
`loop.call_soon_threadsafe`.

The watcher looks at task state, not at change notices, so a task enqueued between a
poll's first take and its registration here is still found on the next look.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

from django.db import connection

from fleet.models import AgentTask
from fleet.states import TaskState
from zoomies_site.core import wakebus

log = logging.getLogger("zoomies.fleet")

# Seconds between the watcher's looks while agents wait: the worst-case delay for a task
# written by another process. Well under a second, and one cheap query whatever the fleet.
POLL_INTERVAL = 0.25


@dataclass(eq=False)
class _Waiter:
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.event.set)
        except RuntimeError:  # its loop has closed: the poll is over anyway
            pass


class TaskWatcher:
    """The per-process registry of waiting hosts and the one thread that looks for work."""

    def __init__(self, interval: float = POLL_INTERVAL) -> None:
        self.interval = interval
        self.looks = 0  # queries made so far (tests and metrics read it)
        self._lock = threading.Lock()
        self._waiters: dict[int, set[_Waiter]] = {}
        self._someone_waiting = threading.Event()
        self._thread: threading.Thread | None = None
        self._bus: wakebus.Listener | bool | None = None  # False: could not be set up

    # -- the waiting side (async, on any loop) ------------------------------------------

    async def wait(self, host_id: int, timeout: float) -> bool:
        """Wait until `host_id` may have a pending task or `timeout` passes; True if woken."""
        waiter = _Waiter(asyncio.get_running_loop())
        self._add(host_id, waiter)
        try:
            await asyncio.wait_for(waiter.event.wait(), timeout=max(timeout, 0))
            return True
        except TimeoutError:
            return False
        finally:
            self._remove(host_id, waiter)

    def waiting_hosts(self) -> list[int]:
        with self._lock:
            return list(self._waiters)

    def notify(self, host_id: int) -> int:
        """Wake every poll waiting for `host_id`; thread-safe. Returns how many were woken."""
        with self._lock:
            waiters = list(self._waiters.get(host_id, ()))
        for waiter in waiters:
            waiter.wake()
        return len(waiters)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _add(self, host_id: int, waiter: _Waiter) -> None:
        with self._lock:
            self._waiters.setdefault(host_id, set()).add(waiter)
            self._someone_waiting.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="zoomies-task-watcher", daemon=True
                )
                self._thread.start()

    def _remove(self, host_id: int, waiter: _Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(host_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[host_id]

    # -- the watcher thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._someone_waiting.wait()
            with self._lock:
                hosts = list(self._waiters)
                if not hosts:
                    # Cleared under the lock that `_add` sets it under: no wake-up is lost.
                    self._someone_waiting.clear()
            if not hosts:
                self._close_connection()
                continue
            self._drain_bus()  # wakes sent before this look are answered by it
            try:
                ready = self._look(hosts)
            except Exception:  # a locked or restarted database: look again next time
                log.debug("task watcher: look failed", exc_info=True)
                self._close_connection()
                ready = set()
            for host_id in ready:
                self.notify(host_id)
            self._pause()

    def _listener(self) -> wakebus.Listener | None:
        if self._bus is None:
            self._bus = wakebus.listen_or_none(wakebus.AGENT_TASKS) or False
        return self._bus or None

    def _drain_bus(self) -> None:
        if listener := self._listener():
            listener.drain()

    def _pause(self) -> None:
        """Wait out the interval, or less when another process says a task is pending."""
        if listener := self._listener():
            listener.wait(self.interval)
        else:
            time.sleep(self.interval)

    def _look(self, host_ids: list[int]) -> set[int]:
        self.looks += 1
        return set(
            AgentTask.objects.filter(host_id__in=host_ids, state=TaskState.PENDING)
            .values_list("host_id", flat=True)
            .distinct()
        )

    @staticmethod
    def _close_connection() -> None:
        # This thread's own connection, kept while agents wait and dropped when none do.
        try:
            connection.close()
        except Exception:
            log.debug("task watcher: closing its connection failed", exc_info=True)


watcher = TaskWatcher()


async def wait_for_work(host_id: int, timeout: float) -> bool:
    """Await a hint that `host_id` has a pending task, for at most `timeout` seconds."""
    return await watcher.wait(host_id, timeout)


def notify_host(host_id: int) -> int:
    """The in-process hint that `host_id` has a new pending task (call after commit)."""
    return watcher.notify(host_id)


def announce_pending_tasks() -> None:
    """Tell the watchers of the other processes to look now, once this transaction commits."""
    wakebus.notify_on_commit(wakebus.AGENT_TASKS)
