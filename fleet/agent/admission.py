"""The host's one create slot (AGENT-01), handed out first come, first served (AGENT-02)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class FifoSlot:
    """A lock whose waiters are admitted in ticket order; a waiter may give up (AGENT-06/07).

    threading.Lock promises no order, and the order the task threads happen to reach it is
    not the order the tasks arrived in, so a ticket is taken when the task is taken.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._serving = 0
        self._abandoned: set[int] = set()

    def ticket(self) -> int:
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            return ticket

    def acquire(
        self, ticket: int, give_up: Callable[[], bool] = lambda: False, poll: float = 0.1
    ) -> bool:
        """Wait for the slot; False (and the ticket given back) once `give_up()` says so."""
        with self._cond:
            while ticket != self._serving:
                if give_up():
                    self._abandon(ticket)
                    return False
                self._cond.wait(poll)
            if give_up():
                self._advance()
                return False
            return True

    def abandon(self, ticket: int) -> None:
        """Give back a ticket that will never be used to acquire the slot."""
        with self._cond:
            if ticket == self._serving:
                self._advance()
            else:
                self._abandon(ticket)

    def release(self) -> None:
        with self._cond:
            self._advance()

    def wake(self) -> None:
        """Make waiters re-check their give_up condition now."""
        with self._cond:
            self._cond.notify_all()

    def _abandon(self, ticket: int) -> None:
        if ticket > self._serving:
            self._abandoned.add(ticket)

    def _advance(self) -> None:
        self._serving += 1
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1
        self._cond.notify_all()
