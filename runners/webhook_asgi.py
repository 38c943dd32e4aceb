"""`POST /webhooks/github` under ASGI, without Django's request cycle (HOOK-01..07).

zoomies_site/asgi.py sends this one route here; everything else, and this path under any
other method, still goes to Django. It does what runners.views.github_webhook does (the view
stays for WSGI: pytest-django's live_server and any WSGI deployment use it) and answers the
same statuses and JSON bodies: read the body, at most one byte past the cap, then the same
`runners.webhooks.ingest`.

Why: under ASGI Django runs every sync view on ONE shared thread (thread_sensitive), so
deliveries queue behind each other and behind the admin and the API, and the view's request
cycle (middleware, URL resolving, the response) costs milliseconds a delivery on these
machines. Here `ingest` runs on a small pool of its own threads instead, through
`sync_to_async(thread_sensitive=False)`, as fleet/api.py's long-poll does. Each call closes
the database connections its pool thread opened before returning: CONN_MAX_AGE is 0, and
no request_finished signal ever reaches a pool thread to close them.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections
from django.utils import timezone

from runners import webhooks
from runners.github.config import webhook_max_body, webhook_secrets

log = logging.getLogger("zoomies.webhooks")

PATH = "/webhooks/github"
# SQLite takes one writer at a time, and the GIL one Python thread: two threads let one
# delivery verify and parse while the other writes. Measured with 1, 2, 4 and 8 (bench/README.md):
# 2 was as fast as any and kept the tail shortest; more only wait longer on the write lock.
POOL_THREADS = 2

_pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="webhook-ingest")

# The headers Django's SecurityMiddleware and XFrameOptionsMiddleware add to the view's answer.
_HEADERS = [
    (b"content-type", b"application/json"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


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
        return webhook_max_body()  # the registry may read the database once its cache ages
    finally:
        _release_connections()


def _ingest(body: bytes, headers: dict[str, str], max_body: int) -> webhooks.Outcome:
    try:
        return webhooks.ingest(
            body=body,
            event=headers.get("x-github-event"),
            delivery_id=headers.get("x-github-delivery"),
            signature=headers.get("x-hub-signature-256"),
            secrets=webhook_secrets(),
            now=timezone.now(),
            max_body=max_body,
        )
    finally:
        _release_connections()


_max_body_async = sync_to_async(_max_body, thread_sensitive=False, executor=_pool)
_ingest_async = sync_to_async(_ingest, thread_sensitive=False, executor=_pool)


async def _answer(send, status: int, body: dict[str, Any]) -> None:
    content = json.dumps(body, cls=DjangoJSONEncoder).encode()
    headers = [*_HEADERS, (b"content-length", str(len(content)).encode())]
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
    """The ASGI app for `POST /webhooks/github`; zoomies_site.asgi routes only that here."""
    headers = _headers(scope)
    try:
        max_body = await _max_body_async()
        raw_length = headers.get("content-length") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            await _answer(send, 400, {"error": "Content-Length is not a number"})
            return
        if length > max_body:
            await _answer(send, 413, {"error": f"the delivery is larger than {max_body} bytes"})
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
        # At most one byte past the cap, as the view reads: ingest answers 413 for that.
        body = b"".join(chunks)[: max_body + 1]
        outcome = await _ingest_async(body, headers, max_body)
    except Exception:
        log.exception("webhook delivery %s failed", headers.get("x-github-delivery"))
        await _answer(send, 500, {"error": "the delivery could not be processed"})
        return
    await _answer(send, outcome.status, outcome.body)
