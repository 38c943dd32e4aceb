"""The floor for live updates: a bare ASGI app that fans a frame out to every open stream.

Served by daphne exactly as the controller's web server is (`python -m daphne -b HOST -p
PORT bench.floor_sse:application`). `GET` (any path) opens a `text/event-stream` and sends
an `overview` frame at once (a stream is ready when it has it, as a viewer of
/api/v1/events is once it has the overview); `POST ?paused=1` (or 0) sends every open
stream a `pool` frame shaped like the controller's (`{"object": {"paused": ...}}`) and
answers 200. What the controller adds over this is the change itself, the outbox, the
relay's tail and rendering, and the channel layer: not the server, the client or 200
streams.
"""

from __future__ import annotations

import asyncio
import json

STREAMS: set[asyncio.Queue[bytes]] = set()
READY = b"retry: 3000\n\nevent: overview\ndata: {}\n\n"
STREAM_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
OK = b'{"ok":true}'
OK_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(OK)).encode())]


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
    if scope["method"] == "POST":
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            more = message.get("more_body", False)
        paused = b"paused=1" in scope.get("query_string", b"")
        data = json.dumps({"kind": "pool.changed", "object": {"paused": paused}})
        frame = f"event: pool\ndata: {data}\n\n".encode()
        for queue in list(STREAMS):
            queue.put_nowait(frame)
        await send({"type": "http.response.start", "status": 200, "headers": OK_HEADERS})
        await send({"type": "http.response.body", "body": OK})
        return
    await stream(receive, send)


async def stream(receive, send) -> None:
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    STREAMS.add(queue)
    await receive()  # the request (a GET has no body)
    # The next message is the client going away.
    gone = asyncio.ensure_future(receive())
    try:
        await send({"type": "http.response.start", "status": 200, "headers": STREAM_HEADERS})
        await send({"type": "http.response.body", "body": READY, "more_body": True})
        while True:
            frame = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({frame, gone}, return_when=asyncio.FIRST_COMPLETED)
            if frame not in done:
                frame.cancel()
                return
            await send({"type": "http.response.body", "body": frame.result(), "more_body": True})
    finally:
        STREAMS.discard(queue)
        gone.cancel()
