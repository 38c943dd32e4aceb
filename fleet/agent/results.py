"""The agent's task results, posted in groups (issue 28).

A burst hands the agent hundreds of creates, each answered by its own thread. Posted one by
one, each result was a request, a token check and a write transaction at the controller,
and under a burst they queued for SQLite's write lock one at a time (a result was recorded
0.8 s after its take, p50). Here the results that are ready at the same moment go in one
`POST tasks/results`, recorded in one transaction.

There is no timer and no thread of its own: the task thread whose result finds no post
under way posts it at once, with every result queued behind it (a single job's result is
not held back); results that arrive meanwhile wait, and the first of them posts the next
group when the answer comes. So a group is one round trip's worth of results.

A controller without the route (older than the agent: 404 or 405) gets one request a
result, as before, and is asked again for the route every REGROUP_AFTER seconds: an
agent outlives the controller it first met, and an upgrade must not wait for its restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet import protocol
from fleet.agent.client import ControllerClient, ControllerError, Unauthorized

log = logging.getLogger("fleet.agent")

MAX_GROUP = protocol.MAX_RESULTS
# What a controller without `POST tasks/results` answers it.
NO_ROUTE = (404, 405)
# How long one request a result is kept before the group route is tried again.
REGROUP_AFTER = 600.0


@dataclass(eq=False)
class _Waiting:
    item: protocol.TaskResultItem
    # Set when the result is answered, or when it is this thread's turn to post a group.
    event: threading.Event = field(default_factory=threading.Event)
    answered: bool = False
    outcome: bool | Exception = False


class ResultPoster:
    """Posts the task threads' results, grouped as described above.

    `post` answers as `ControllerClient.post_result` does: True when the controller took the
    result, False when it refused it for good (not this host's task, or no longer in
    flight: neither is worth a retry), or raises ControllerError, and the caller tries again
    after its own wait.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._queue: list[_Waiting] = []
        self._posting = False  # a thread is posting a group; the queue waits for it
        self._ungrouped_at: float | None = None  # when the controller last lacked the route

    @property
    def grouped(self) -> bool:
        """Whether the next group goes as one `tasks/results`: until a controller answers
        that it has no such route, and again REGROUP_AFTER seconds after that answer."""
        at = self._ungrouped_at
        return at is None or self._clock() - at >= REGROUP_AFTER

    def post(
        self,
        client: ControllerClient,
        task_id: int,
        *,
        ok: bool,
        error: str | None,
        attempt: int | None,
        report: Mapping[str, Any] | None = None,
    ) -> bool:
        result = protocol.TaskResult(ok=ok, error=error, attempt=attempt, report=report)
        waiting = _Waiting(protocol.TaskResultItem(task_id, result))
        with self._lock:
            self._queue.append(waiting)
            my_turn = not self._posting
            self._posting = True
        while True:
            if my_turn:
                self._post_group(client)
            waiting.event.wait()
            with self._lock:
                if waiting.answered:
                    break
                # Woken unanswered: the group before it is answered, and this result is
                # at the front of the queue, so this thread posts the next group.
                waiting.event.clear()
                my_turn = True
        if isinstance(waiting.outcome, Exception):
            raise waiting.outcome
        return waiting.outcome

    def _post_group(self, client: ControllerClient) -> None:
        with self._lock:
            group = self._queue[:MAX_GROUP]
            del self._queue[:MAX_GROUP]
        outcomes = self._send(client, [w.item for w in group])
        with self._lock:
            for waiting, outcome in zip(group, outcomes, strict=True):
                waiting.outcome = outcome
                waiting.answered = True
                waiting.event.set()
            if self._queue:
                self._queue[0].event.set()  # the next group's turn, on its first thread
            else:
                self._posting = False

    def _send(
        self, client: ControllerClient, items: list[protocol.TaskResultItem]
    ) -> list[bool | Exception]:
        """One outcome per item; never raises, so no waiting thread is left hanging."""
        try:
            if self.grouped:
                try:
                    outcomes: list[bool | Exception] = [
                        o.accepted for o in client.post_results(items)
                    ]
                    self._ungrouped_at = None
                    return outcomes
                except Unauthorized:
                    raise
                except ControllerError as exc:
                    if exc.status not in NO_ROUTE:
                        raise
                    self._ungrouped_at = self._clock()
                    log.info(
                        "the controller has no tasks/results (%s): one request a result for "
                        "the next %.0f s",
                        exc,
                        REGROUP_AFTER,
                    )
            return [self._send_one(client, item) for item in items]
        except Exception as exc:  # each waiting thread raises it as its own
            return [exc] * len(items)

    @staticmethod
    def _send_one(client: ControllerClient, item: protocol.TaskResultItem) -> bool | Exception:
        r = item.result
        try:
            return client.post_result(
                item.id, ok=r.ok, error=r.error, attempt=r.attempt, report=r.report
            )
        except ControllerError as exc:
            return exc
