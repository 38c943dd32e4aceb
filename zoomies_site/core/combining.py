"""Group commit without a thread of its own: callers that arrive while one group is being
written queue up, and the first of them to find the writer free writes everything queued,
up to a cap, in one go ("flat combining"). With one caller at a time each writes its own
alone, as before; under a burst each write transaction carries many.

Used where the callers are already threads that wait for their answer (the agent routes'
pool threads): the writer is whichever of them comes next, on its own database connection,
so there is no extra thread or connection to keep and nothing to stop.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Slot(Generic[Item]):
    __slots__ = ("item", "outcome", "done", "wake")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.outcome: object = None
        self.done = False
        self.wake = threading.Event()


class Combiner(Generic[Item, Result]):
    """`combiner(item)` returns what `write(group)` answered for `item`, or raises it.

    `write` takes the items in arrival order and returns one outcome per item: its result,
    or an exception that is that item's alone (raised to its caller only). An exception out
    of `write` itself is every item's of that group: each caller gets a copy of it."""

    def __init__(self, write: Callable[[list[Item]], Sequence[Result | Exception]], *, most: int):
        self._write = write
        self._most = most
        self._lock = threading.Lock()
        self._queue: deque[_Slot[Item]] = deque()
        self._writing = False

    def waiting(self) -> int:
        """How many items are queued for the next group."""
        with self._lock:
            return len(self._queue)

    def __call__(self, item: Item) -> Result:
        slot = _Slot(item)
        with self._lock:
            self._queue.append(slot)
        while True:
            with self._lock:
                if slot.done:
                    break
                if self._writing:
                    # Set again under this lock by the writer that finishes its group.
                    slot.wake.clear()
                    group = None
                else:
                    self._writing = True
                    taken = min(self._most, len(self._queue))
                    group = [self._queue.popleft() for _ in range(taken)]
            if group is None:
                slot.wake.wait()
                continue
            self._write_group(group)
        return _answer(slot.outcome)  # type: ignore[no-any-return]

    def _write_group(self, group: list[_Slot[Item]]) -> None:
        try:
            outcomes: Sequence[object] = self._write([s.item for s in group])
            if len(outcomes) != len(group):
                raise RuntimeError(f"{len(outcomes)} outcomes for {len(group)} items")
        except BaseException as exc:  # the group's, not one item's: every caller hears it
            outcomes = [_Shared(exc)] * len(group)
        finally:
            with self._lock:
                for slot, outcome in zip(group, outcomes, strict=False):
                    slot.outcome, slot.done = outcome, True
                    slot.wake.set()
                self._writing = False
                if self._queue:
                    self._queue[0].wake.set()  # the next writer: the longest waiting


class _Shared:
    """An exception several callers raise: each raises a copy, chained to it, so no two
    threads write one exception's traceback."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _answer(outcome: object) -> object:
    if isinstance(outcome, _Shared):
        mine = copy.copy(outcome.exc)
        mine.__traceback__ = None
        raise mine from outcome.exc
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
