"""`POST /webhooks/github` under ASGI, without Django's request cycle (HOOK-01..07).

zoomies_site/asgi.py sends this one route here; everything else, and this path under any
other method, still goes to Django. It answers what runners.views.github_webhook answers
(the view serves WSGI: pytest-django's live_server and any WSGI deployment), with the same
statuses and JSON bodies, through the same runners.webhook_writer: read the body, at most
one byte past the cap, hand it to the writer thread, and answer once its burst has
committed, or 503 when the database has not taken it within the writer's ANSWER_BUDGET.

Why not a Django view: under ASGI Django runs every sync view on ONE shared thread
(thread_sensitive), so deliveries would queue behind each other and behind the admin and
the API, and the request cycle (middleware, URL resolving, the response) costs a
millisecond a delivery on these machines. Here the event loop only reads and answers; the
one database read it may need (the size cap, when the writer has not read it lately) runs
on a thread of its own, which closes its connection after.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connections
from django.utils import timezone

from runners import webhook_writer, webhooks
from runners.github.config import webhook_max_body

log = logging.getLogger("zoomies.webhooks")

PATH = "/webhooks/github"

_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-settings")

# The headers Django's SecurityMiddleware and XFrameOptionsMiddleware add to the view's answer.
_HEADERS = [
    (b"content-type", b"application/json"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


class _AnswerRelay:
    """Tells waiting routes that the writer has answered, one loop wake a burst.

    asyncio.wrap_future wakes the event loop once per delivery (a write to its self-pipe
    from the writer thread, and a read and a callback on the loop): a tenth of the writer's
    time under load (docs/performance.md). Here the first answer of a burst schedules one
    call on the loop and the rest of the burst rides along with it. The waiter only says
    "done"; the route reads the answer itself from the writer's future.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}

    def watch(self, future: Future, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """An asyncio future on `loop` that is done once `future` is."""
        waiter: asyncio.Future[None] = loop.create_future()
        future.add_done_callback(lambda _: self._done(loop, waiter))
        return waiter

    def _done(self, loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]) -> None:
        with self._lock:
            batch = self._ready.setdefault(loop, [])
            batch.append(waiter)
            first = len(batch) == 1
        if not first:
            return  # the call the batch's first answer scheduled will see this one too
        try:
            loop.call_soon_threadsafe(self._release, loop)
        except RuntimeError:  # the loop has closed: nobody waits on it any more
            with self._lock:
                self._ready.pop(loop, None)

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            batch = self._ready.pop(loop, [])
        for waiter in batch:
            if not waiter.done():  # never set twice, whoever else may have cancelled it
                waiter.set_result(None)


_relay = _AnswerRelay()


def handles(scope: dict[str, Any]) -> bool:
    """True for the requests this app answers: `POST /webhooks/github` over HTTP."""
    if scope["type"] != "http" or scope.get("method") != "POST":
        return False
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path == PATH


def _release_connections() -> None:
    # As fleet/api.py does: never inside an atomic block (a test's own).
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


def _max_body() -> int:
    try:
        # The registry may read the database once its cache ages.
        return webhook_writer.remember_max_body(webhook_max_body())
    finally:
        _release_connections()


_max_body_async = sync_to_async(_max_body, thread_sensitive=False, executor=_pool)


async def _within(awaitable, deadline: float):
    """Await until the loop's clock reaches `deadline`; TimeoutError after that."""
    remaining = deadline - asyncio.get_running_loop().time()
    return await asyncio.wait_for(awaitable, timeout=max(remaining, 0.001))


async def _answer(send, outcome: webhooks.Outcome, retry_after: bool = False) -> None:
    status = outcome.status
    content = json.dumps(outcome.body, cls=DjangoJSONEncoder).encode()
    headers = [*_HEADERS, (b"content-length", str(len(content)).encode())]
    if retry_after:
        headers.append((b"retry-after", b"60"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    """The request headers by lower-cased name, read as Django's ASGIRequest reads them.

    A name with an underscore is dropped (it could pose as its hyphenated twin), and a
    repeated header is joined with commas, so a second signature header spoils the first
    here exactly as it does in the view.
    """
    seen: dict[str, list[str]] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").lower()
        if "_" not in name:
            seen.setdefault(name, []).append(raw_value.decode("latin-1"))
    return {name: ",".join(values) for name, values in seen.items()}


async def application(scope, receive, send) -> None:
    """The ASGI app for `POST /webhooks/github`; zoomies_site.asgi routes only that here.

    The database gets the writer's ANSWER_BUDGET seconds in all (the size cap's read, if
    due, and the writer's burst); a delivery it has not recorded in time, or refused with a
    database error, is answered 503 and is not recorded (issue 21 item 19): GitHub's
    redelivery of it records it, so nothing is lost or recorded twice.
    """
    headers = _headers(scope)
    delivery_id = headers.get("x-github-delivery")
    deadline = asyncio.get_running_loop().time() + webhook_writer.ANSWER_BUDGET
    try:
        max_body = webhook_writer.known_max_body()
        if max_body is None:
            max_body = await _within(_max_body_async(), deadline)
    except (TimeoutError, DatabaseError) as exc:
        log.warning("webhook delivery %s: the size cap could not be read: %s", delivery_id, exc)
        await _answer(send, webhook_writer.busy(delivery_id), retry_after=True)
        return
    raw_length = headers.get("content-length") or "0"
    try:
        length = int(raw_length)
    except ValueError:
        await _answer(send, webhooks.Outcome(400, {"error": "Content-Length is not a number"}))
        return
    if length > max_body:
        too_large = {"error": f"the delivery is larger than {max_body} bytes"}
        await _answer(send, webhooks.Outcome(413, too_large))
        return
    chunks: list[bytes] = []
    received = 0
    more = True
    while more and received <= max_body:
        message = await receive()
        if message["type"] == "http.disconnect":
            return  # nobody is waiting for an answer, and nothing was recorded
        chunk = message.get("body", b"")
        chunks.append(chunk)
        received += len(chunk)
        more = message.get("more_body", False)
    # At most one byte past the cap, as the view reads: the check answers 413 for that.
    request = webhook_writer.Request(
        body=b"".join(chunks)[: max_body + 1],
        event=headers.get("x-github-event"),
        delivery_id=delivery_id,
        signature=headers.get("x-hub-signature-256"),
        received_at=timezone.now(),
        max_body=max_body,
        answer_by=deadline,  # the loop's clock is time.monotonic(), the writer's
    )
    future = webhook_writer.submit(request)
    # The writer answers by the deadline (it stops waiting for the database then); past it
    # and the grace, a delivery it never began is withdrawn, so a 503 is never recorded
    # later (issue 21 item 19). asyncio.wait itself cancels nothing.
    loop = asyncio.get_running_loop()
    waiting = {_relay.watch(future, loop)}
    grace = deadline + webhook_writer.LATE_GRACE - loop.time()
    done, _ = await asyncio.wait(waiting, timeout=max(grace, 0.001))
    if not done:
        if webhook_writer.past_due(future):
            await _answer(send, webhook_writer.busy(delivery_id), retry_after=True)
            return
        last = deadline - webhook_writer.ANSWER_BUDGET + webhook_writer.LAST_ANSWER
        done, _ = await asyncio.wait(waiting, timeout=max(last - loop.time(), 0.001))
        if not done:
            await _answer(send, webhook_writer.busy(delivery_id, unknown=True), retry_after=True)
            return
    outcome = webhook_writer.settle(future, delivery_id)
    await _answer(send, outcome, retry_after=outcome.status == 503)
