"""The host's one create-or-prewarm slot (AGENT-01), handed out first come, first served
with creates ahead of prewarms (AGENT-02), and the hold on starts after the engine stopped
answering (AGENT-09, AGENT-10)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class FifoSlot:
    """The host's one create-or-prewarm slot (AGENT-01). Waiting creates are admitted in
    ticket order, ahead of every waiting background prewarm, which go in ticket order after
    them (AGENT-02); a waiter may give up (AGENT-06/07). A prewarm holding the slot is not
    interrupted: the create behind it goes next.

    threading.Lock promises no order, and the order the task threads happen to reach it is
    not the order the tasks arrived in, so a ticket is taken when the task is taken.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._waiting: dict[int, bool] = {}  # ticket -> whether it is a background prewarm
        self._held = False

    def ticket(self, *, background: bool = False) -> int:
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._waiting[ticket] = background
            return ticket

    def _front(self) -> int | None:
        return min(self._waiting, key=lambda t: (self._waiting[t], t), default=None)

    def acquire(
        self, ticket: int, give_up: Callable[[], bool] = lambda: False, poll: float = 0.1
    ) -> bool:
        """Wait for the slot; False (and the ticket given back) once `give_up()` says so."""
        with self._cond:
            while self._held or self._front() != ticket:
                if give_up():
                    self._drop(ticket)
                    return False
                self._cond.wait(poll)
            self._waiting.pop(ticket, None)
            if give_up():
                self._cond.notify_all()
                return False
            self._held = True
            return True

    def abandon(self, ticket: int) -> None:
        """Give back a ticket that will never be used to acquire the slot."""
        with self._cond:
            self._drop(ticket)

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def wake(self) -> None:
        """Make waiters re-check their give_up condition now."""
        with self._cond:
            self._cond.notify_all()

    def _drop(self, ticket: int) -> None:
        self._waiting.pop(ticket, None)
        self._cond.notify_all()


class StartHold:
    """AGENT-09: after a runtime transport failure (an engine that did not answer), further
    starts wait 5 s, then 10, 20, 40, 60 s at most; a successful start clears the hold.

    Only a silence opens it: a create or pull that outran its own budget, or an engine that
    answered with an error, does not (AGENT-10). Running jobs are not touched and no daemon
    is restarted. The clock is a parameter, so tests move time instead of sleeping.
    """

    FIRST = 5.0
    MAX = 60.0

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._delay = 0.0
        self._until = 0.0

    def failed(self) -> float:
        """A transport failure: open (or lengthen) the hold; answers its length."""
        with self._lock:
            self._delay = self.FIRST if self._delay == 0 else min(self._delay * 2, self.MAX)
            self._until = self._clock() + self._delay
            return self._delay

    def succeeded(self) -> None:
        with self._lock:
            self._delay = 0.0
            self._until = 0.0

    def remaining(self) -> float:
        """Seconds until starts may go on; 0 when there is no hold."""
        with self._lock:
            return max(0.0, self._until - self._clock())
