"""The woken reconcile pass's loop: a thread of the controller (or of the scale-out workers'
ticker holder) that runs `reconcile_now` each time the wake bus says something changed.

`runners.wake.wake_reconcile` sends the wake after the commit that made the change, one a
transaction; wakes that arrive during a pass wait in the listener's socket, and the next
wait takes them all and runs one pass. The pass runs under the reconcile lease as every
pass does (SCHED-27), so a periodic pass of the ticker on the task queue, or another
controller's, never runs beside it. Nothing here writes a row of its own: under a burst of
webhooks that is the point (runners/wake.py).

What it does not do is survive its process: a wake lost with it costs one ticker period,
the periodic passes staying on the task queue. A pass that hangs holds the loop, and the
ticker's passes take over once the lease expires (`runners.reconcile.LEASE_TTL`); the hang
is logged each `HUNG_AFTER`. The clock and the pass are parameters, so tests drive it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connection

from zoomies_site.core import wakebus
from zoomies_site.core.faultlog import FaultLog

log = logging.getLogger("zoomies.runners")

# How long a wait lasts before the loop looks at whether it should stop, and at `active`.
WAIT = 1.0
HUNG_AFTER = 300.0  # the task queue's timeout for a pass: past it, say so


def run_reconcile_pass() -> None:
    from runners.reconcile import reconcile_now  # noqa: PLC0415  # the apps are loaded by now

    reconcile_now()


class PassLoop:
    """Start with `start()`; `stop()` ends the thread after its current pass.

    `active` says whether this process should run the woken passes now (the scale-out
    workers run them only while they hold the ticker); while it says no, wakes are taken
    and dropped, and `listening` stays true so senders do not fall back to the queue.
    """

    def __init__(
        self,
        *,
        run: Callable[[], object] = run_reconcile_pass,
        active: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
        topic: str = wakebus.RECONCILE,
    ) -> None:
        self.run = run
        self.active = active
        self.clock = clock
        self.topic = topic
        self.wakes = 0  # waits that ended with a wake
        self.passes = 0
        self.pass_started: float | None = None
        self._stop = threading.Event()
        self._listener: wakebus.Listener | wakebus.RedisListener | None = None
        self._thread: threading.Thread | None = None
        self._faults = FaultLog(log, "the woken reconcile pass")

    @property
    def listening(self) -> bool:
        return self._listener is not None

    def start(self) -> bool:
        """Listen and start the thread; False (logged) when the bus cannot be set up here,
        and the wakes then go to the task queue as before."""
        self._listener = wakebus.listen_or_none(self.topic)
        if self._listener is None:
            return False
        self._thread = threading.Thread(
            target=self._loop, args=(self._listener,), name="reconcile-pass", daemon=True
        )
        self._thread.start()
        return True

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._listener is not None and (self._thread is None or not self._thread.is_alive()):
            self._listener.close()
            self._listener = None

    def hung(self) -> bool:
        """Whether the pass now running has run longer than HUNG_AFTER."""
        started = self.pass_started
        return started is not None and self.clock() - started > HUNG_AFTER

    def _loop(self, listener: wakebus.Listener | wakebus.RedisListener) -> None:
        while not self._stop.is_set():
            try:
                woken = listener.wait(WAIT)
            except Exception as exc:  # a Redis connection lost: the next wait reconnects
                self._faults.failed(exc)
                self._stop.wait(WAIT)
                continue
            if not woken or self._stop.is_set():
                continue
            self.wakes += 1
            if self.active():
                self.step()
        connection.close()  # this thread's own connection

    def step(self) -> None:
        """One woken pass; a fault is logged, never raised, and the loop carries on."""
        self.pass_started = self.clock()
        try:
            self.run()
        except Exception as exc:
            self._faults.failed(exc)
            connection.close()  # a broken connection is not reused by the next pass
        else:
            self._faults.worked()
        finally:
            self.pass_started = None
            self.passes += 1
