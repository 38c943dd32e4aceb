"""ASGI entry point: daphne serves the admin, API, webhooks, agent protocol and streams.

`POST /webhooks/github` goes to runners.webhook_asgi, a bare ASGI app that calls the same
`runners.webhooks.ingest` as the Django view on its own small thread pool, instead of
through Django's request cycle and its one shared thread for sync views (bench/README.md
has the measurement). The agent protocol's POST routes (join, heartbeat, reports, task
results) go to fleet.agent_asgi, which runs the same views on a pool of threads of its own.
Everything else, those paths under other methods included, is Django's.
"""

import asyncio
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoomies_site.settings")
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (the same reason)
from channels.routing import URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from fleet import agent_asgi  # noqa: E402
from runners import webhook_asgi  # noqa: E402
from zoomies_site.consumers import EventConsumer  # noqa: E402

# How long a cancelled Django request has to end once told its client is gone.
CANCEL_GRACE = 5.0


async def django_until_cancelled(scope, receive, send):
    """Django's app, whose view hears of it when its request is cancelled.

    daphne stops a server by cancelling every open request. Django's handler runs the view
    in a task of its own that only an `http.disconnect` ends, so a cancel left each agent's
    long-poll and each SSE viewer waiting out its time (the web server then ignored SIGTERM
    for 25 s). A cancel here is passed on as the disconnect it amounts to."""
    gone = asyncio.Event()

    async def receive_or_gone():
        if gone.is_set():
            return {"type": "http.disconnect"}
        message = asyncio.ensure_future(receive())
        cancelled = asyncio.ensure_future(gone.wait())
        try:
            await asyncio.wait({message, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Django cancels its disconnect listener once it has answered: neither wait may
            # outlive this call (each was a pending task per request, destroyed by the GC).
            cancelled.cancel()
            if not message.done():
                message.cancel()
        if message.done() and not message.cancelled():
            return message.result()
        return {"type": "http.disconnect"}

    inner = asyncio.ensure_future(django_application(scope, receive_or_gone, send))
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        gone.set()
        await asyncio.wait({inner}, timeout=CANCEL_GRACE)
        inner.cancel()
        raise


async def http_application(scope, receive, send):
    if webhook_asgi.handles(scope):
        return await webhook_asgi.application(scope, receive, send)
    if agent_asgi.handles(scope):
        return await agent_asgi.application(scope, receive, send)
    return await django_until_cancelled(scope, receive, send)


# The admin's live events on a websocket (the browser's session cookie signs it in).
websocket_application = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter([path("ws/events", EventConsumer.as_asgi())]))
)


async def application(scope, receive, send):
    if scope["type"] == "websocket":
        return await websocket_application(scope, receive, send)
    return await http_application(scope, receive, send)
