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

    Each waiter sleeps on an event of its own, set when it reaches the front of a free slot
    or when `wake` asks every waiter to look at its give-up condition: a burst queues
    hundreds of creates here, and waking them all at every release (and each every tenth
    of a second) kept the agent's other threads, its task poll among them, from the
    interpreter (issue 28).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_ticket = 0
        # ticket -> its waiter's event; a dict keeps insertion order, which is ticket order.
        self._creates: dict[int, threading.Event] = {}
        self._background: dict[int, threading.Event] = {}
        self._held = False

    def ticket(self, *, background: bool = False) -> int:
        with self._lock:
            ticket = self._next_ticket
            self._next_ticket += 1
            (self._background if background else self._creates)[ticket] = threading.Event()
            return ticket

    def _front(self) -> int | None:
        for queue in (self._creates, self._background):
            for ticket in queue:
                return ticket
        return None

    def _event(self, ticket: int) -> threading.Event | None:
        return self._creates.get(ticket) or self._background.get(ticket)

    def acquire(
        self, ticket: int, give_up: Callable[[], bool] = lambda: False, poll: float = 1.0
    ) -> bool:
        """Wait for the slot; False (and the ticket given back) once `give_up()` says so.

        `poll` is only a safety net: a waiter is woken when its turn comes or by `wake`."""
        while True:
            with self._lock:
                event = self._event(ticket)
                if event is None:
                    return False  # given back already
                if give_up():
                    self._drop(ticket)
                    return False
                if not self._held and self._front() == ticket:
                    self._remove(ticket)
                    self._held = True
                    return True
                event.clear()  # under the lock: a set() after this is not lost
            event.wait(poll)

    def abandon(self, ticket: int) -> None:
        """Give back a ticket that will never be used to acquire the slot."""
        with self._lock:
            self._drop(ticket)

    def release(self) -> None:
        with self._lock:
            self._held = False
            self._call_front()

    def wake(self) -> None:
        """Make waiters re-check their give_up condition now."""
        with self._lock:
            for queue in (self._creates, self._background):
                for event in queue.values():
                    event.set()

    def _remove(self, ticket: int) -> None:
        self._creates.pop(ticket, None)
        self._background.pop(ticket, None)

    def _drop(self, ticket: int) -> None:
        self._remove(ticket)
        self._call_front()

    def _call_front(self) -> None:
        """Wake the waiter whose turn it now is, if the slot is free."""
        front = self._front()
        if not self._held and front is not None:
            self._event(front).set()  # type: ignore[union-attr]


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
