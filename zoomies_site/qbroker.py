"""django-q2's ORM broker, woken by the wake bus instead of only by its poll.

The stock ORM broker looks for queued tasks and, when it finds none, sleeps `poll` seconds:
a reconcile pass asked for by a webhook waited on average half of that before a worker took
it. Here an enqueue wakes the pusher of every cluster on this database once its transaction
commits (`zoomies_site.core.wakebus`), and the pusher waits on that wake with `poll` as the
safety net, so a task is taken within milliseconds while an idle cluster still looks only
once per `poll`.
"""

from __future__ import annotations

import logging
import os
import time

from django.db import connections
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf

from zoomies_site.core import wakebus
from zoomies_site.core.faultlog import KNOWN_FAULTS, FaultLog

_faults = FaultLog(logging.getLogger("zoomies.workers"), "the task queue's look for tasks")


def close_broker_connection() -> None:
    """The broker's connection, closed so the next look opens a fresh one."""
    try:
        connections[Conf.ORM].close()
    except Exception:  # noqa: S110  # closing a broken connection may itself fail: nothing to do
        pass


class WakeableORM(ORM):
    _listener: wakebus.Listener | None = None
    _listener_pid = 0

    def enqueue(self, task):
        task_id = super().enqueue(task)
        wakebus.notify_on_commit(wakebus.TASK_QUEUE, using=Conf.ORM)
        return task_id

    def dequeue(self):
        listener = self._wake_listener()
        if listener is not None:
            listener.drain()  # wakes sent before this look are answered by it
        try:
            tasks = self._take()
        except KNOWN_FAULTS as exc:
            # A locked, read-only or restarted database: django-q2's pusher would log a
            # traceback, sleep 10 s and die, and its sentinel log the reincarnation (issue 21
            # item 22). It waits a poll instead, on a fresh connection, and tries again.
            _faults.failed(exc)
            close_broker_connection()
            tasks = None
        else:
            _faults.worked()
        if tasks:
            return tasks
        if listener is None:
            time.sleep(Conf.POLL)
        else:
            listener.wait(Conf.POLL)
        return None

    def _take(self) -> list[tuple[int, str]]:
        """Lock and return up to BULK queued tasks (the stock broker's look, without its sleep)."""
        now_due = self.get_connection().filter(key=self.list_key, lock__lt=timezone.now())[
            : Conf.BULK
        ]
        taken = []
        for task in now_due:
            locked = (
                self.get_connection()
                .filter(id=task.id, lock=task.lock)
                .update(lock=self.timeout(task))
            )
            if locked:  # else another cluster was faster to it
                taken.append((task.pk, task.payload))
        return taken

    def _wake_listener(self) -> wakebus.Listener | None:
        # One socket per process: the broker object may have been made before a fork.
        if self._listener is None or self._listener_pid != os.getpid():
            try:
                self._listener = wakebus.Listener(wakebus.TASK_QUEUE)
                self._listener_pid = os.getpid()
            except OSError:
                return None  # no bus: the poll alone, as the stock broker does
        return self._listener
