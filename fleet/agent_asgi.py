"""The agent protocol's hot POST routes under ASGI, on a pool of threads of their own.

zoomies_site/asgi.py sends `POST /api/v1/agent/` join, heartbeat, token/renew, reports,
tasks/<id>/result and tasks/results here, and the task long-poll (`GET tasks`); everything
else (these paths under any other method) stays with Django. The same views of fleet/api.py
answer, called with an ASGIRequest (the POST views on this module's pool, the async
long-poll on the event loop), so the statuses and JSON bodies are the views' own.

The long-poll came here at 1,000 agents (issue 28): through Django's handler every request
runs in a ThreadSensitiveContext, whose sync middleware steps start a thread of the
request's own, and the event loop started and joined one for each of the thousand polls
held open. Heartbeats waited seconds behind those starts and joins (p99 8 s against a
/healthz p99 of 150 ms), and the threads were a good part of the web process's memory.

Why: under daphne Django runs every synchronous view, and every synchronous middleware
step of an async one, on ONE shared thread (thread_sensitive). At 500 agents a heartbeat
waited seconds there behind joins, reports and the admin (docs/performance.md). Here:

* POOL_THREADS long-lived threads, so at most that many agent writes reach the database at
  once: SQLite takes one writer at a time, and a crowd of writers each polling for the
  lock is what ran out its busy timeout at 1,000 agents. Requests beyond that wait on the
  event loop, not inside a database lock.
* Each thread keeps its database connection between calls (no connect per heartbeat). It
  closes it on any error (a broken connection is never reused); the server process's exit
  (zoomies_site/server.py ends in os._exit) closes the rest. CONN_MAX_AGE = 0 was a rule
  for Django's own request threads; no request_finished signal reaches these threads.
* The middleware is not run: these routes have no session, cookie, CSRF or user. The
  security headers the middleware would add are added here.
"""

from __future__ import annotations

import asyncio
import io
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import HttpResponse
from django.urls import Resolver404, resolve

from fleet import api, protocol

log = logging.getLogger("zoomies.fleet")

# Two threads let one request parse and answer while the other writes (the GIL runs one
# Python thread at a time, SQLite one writer); more only wait longer on the write lock,
# as the webhook pool measured (runners/webhook_asgi.py).
POOL_THREADS = 2
THREAD_PREFIX = "agent-api"
# Joins have a thread of their own: a join costs several times a heartbeat and comes in
# bursts (a fleet starting), and heartbeats queued behind hundreds of joins made hosts
# look slow to answer at 1,000 agents (docs/performance.md).
JOIN_THREAD_PREFIX = "agent-join"
HOT_VIEWS = {
    api.join,
    api.heartbeat,
    api.reports,
    api.task_result,
    api.results,
    api.renew_token,
}
# Async views, awaited on the event loop: their database calls go to their own threads.
LONG_POLL_VIEWS = {api.tasks}
MAX_BODY_BYTES = protocol.MAX_BODY_BYTES

_pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix=THREAD_PREFIX)
_join_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=JOIN_THREAD_PREFIX)

# The headers Django's SecurityMiddleware and XFrameOptionsMiddleware add to a view's answer.
_SECURITY_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


def _path(scope: dict[str, Any]) -> str:
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path


def handles(scope: dict[str, Any]) -> bool:
    """True for a POST over HTTP to one of the hot agent routes, or a GET of the long-poll
    (resolved as Django would)."""
    views = {"POST": HOT_VIEWS, "GET": LONG_POLL_VIEWS}.get(scope.get("method", ""))
    if scope["type"] != "http" or views is None:
        return False
    path = _path(scope)
    if not path.startswith("/api/v1/agent/"):
        return False
    try:
        return resolve(path).func in views
    except Resolver404:
        return False


def close_connections() -> None:
    """Close every database connection this thread opened (never inside an atomic block)."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


def _run_view(scope: dict[str, Any], body: bytes) -> HttpResponse:
    """The view's answer, on a pool thread whose connection outlives the call."""
    try:
        request = ASGIRequest(scope, io.BytesIO(body))
        match = resolve(_path(scope))
        return match.func(request, *match.args, **match.kwargs)
    except BaseException:
        close_connections()  # whatever broke, the next call starts on a fresh connection
        raise


_run_view_async = sync_to_async(_run_view, thread_sensitive=False, executor=_pool)
_run_join_async = sync_to_async(_run_view, thread_sensitive=False, executor=_join_pool)


def _is_join(scope: dict[str, Any]) -> bool:
    return _path(scope) == "/api/v1/agent/join"


async def _send(send, response: HttpResponse) -> None:
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.items()
    ]
    headers += [h for h in _SECURITY_HEADERS if not response.has_header(h[0].decode())]
    content = response.content
    headers.append((b"content-length", str(len(content)).encode()))
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": headers})  # fmt: skip
    await send({"type": "http.response.body", "body": content})


async def _until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _long_poll(scope, receive, send) -> None:
    """The long-poll view on the event loop, cancelled if its agent goes away (as Django's
    handler does: a poll nobody waits for holds nothing for the rest of its wait)."""
    match = resolve(_path(scope))
    view = asyncio.ensure_future(
        match.func(ASGIRequest(scope, io.BytesIO(b"")), *match.args, **match.kwargs)
    )
    gone = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait({view, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Also on the server's own cancel (a stop): neither task outlives the request.
        for task in (view, gone):
            if not task.done():
                task.cancel()
    failed = gone.exception() if gone.done() and not gone.cancelled() else None
    if failed is not None:
        log.warning("agent request %s: its connection failed: %s", _path(scope), failed)
    if not view.done() or view.cancelled():
        return  # the agent went away: nobody to answer
    try:
        response = view.result()
    except Exception:
        log.exception("agent request %s failed", _path(scope))
        response = api.error("the request could not be processed", 500)
    await _send(send, response)


async def application(scope, receive, send) -> None:
    """The ASGI app for the hot agent routes; zoomies_site.asgi routes only those here."""
    if scope.get("method") == "GET":
        await _long_poll(scope, receive, send)
        return
    chunks: list[bytes] = []
    received = 0
    more = True
    # At most one byte past the cap: the view's own check answers 413 for that.
    while more and received <= MAX_BODY_BYTES:
        message = await receive()
        if message["type"] == "http.disconnect":
            return  # nobody is waiting for an answer
        chunk = message.get("body", b"")
        chunks.append(chunk)
        received += len(chunk)
        more = message.get("more_body", False)
    body = b"".join(chunks)[: MAX_BODY_BYTES + 1]
    try:
        run = _run_join_async if _is_join(scope) else _run_view_async
        response = await run(scope, body)
    except Exception:
        log.exception("agent request %s failed", _path(scope))
        response = api.error("the request could not be processed", 500)
    await _send(send, response)
