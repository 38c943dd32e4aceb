"""The floor for webhook ingest: a bare ASGI app that reads the body and answers 200.

Served by daphne exactly as the controller's web server is (`python -m daphne -b HOST -p
PORT bench.floor_asgi:application`), so the difference between the two is Zoomies: Django,
the signature check, the database writes and the wake, not the server or the client.
"""

from __future__ import annotations

BODY = b'{"ok":true}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    received = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        received += len(message.get("body", b""))
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
