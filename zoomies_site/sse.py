"""GET /api/v1/events: the event stream as Server-Sent Events (EVT-01, EVT-04).

A plain async Django view returning a StreamingHttpResponse (Channels' AsyncHttpConsumer
delivers nothing once handle() returns). The ORM is touched only in short
sync_to_async calls, never across the wait; a client's disconnect cancels the generator.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.http import JsonResponse, StreamingHttpResponse
from django.utils import timezone
from django.views import View
from rest_framework.exceptions import AuthenticationFailed

from accounts.api_auth import ApiTokenAuthentication
from accounts.roles import Level, effective_level
from zoomies_site import stream

# A comment line this often keeps proxies from closing an idle stream.
KEEPALIVE_SECONDS = 15.0
# What the browser waits before reconnecting after a drop (the SSE `retry:` field).
RETRY_MS = 3000


def _caller(request):
    """(status, detail) when the caller may not read the stream, else None."""
    try:
        found = ApiTokenAuthentication().authenticate(request)
    except AuthenticationFailed as exc:
        return 401, str(exc.detail)
    user, token = found if found else (request.user, None)
    if not (user and user.is_authenticated):
        return 401, "Authentication credentials were not provided."
    if effective_level(user, token) < Level.READ:
        return 403, "your role or this token's scopes do not allow this"
    return None


def _resume_point(request) -> int | None:
    """The id to resume after: `Last-Event-ID` (set by the browser on reconnect) or
    `?after=` (the page's first connection); None to start from now."""
    raw = request.headers.get("Last-Event-ID") or request.GET.get("after")
    if raw in (None, ""):
        return None
    if not raw.isdigit():
        raise ValueError("Last-Event-ID and after must be a non-negative event id")
    return int(raw)


async def event_frames(after: int | None, *, keepalive: float = KEEPALIVE_SECONDS):
    """The stream's text: backlog after `after`, the current overview and problems, then
    live frames from this process's relay, with a keep-alive comment when idle."""
    relay = stream.relay()
    relay.subscribe()
    layer = get_channel_layer()
    channel = await layer.new_channel()
    try:
        # Joined before the backlog is read, and the relay primed before it too: an event
        # committed in between comes twice at worst (skipped below by id), never not at all.
        await layer.group_add(relay.group, channel)
        await sync_to_async(relay.prime)()
        yield f"retry: {RETRY_MS}\n\n"
        last = after
        if after is not None:
            frames, reset = await sync_to_async(stream.backlog)(after)
            if reset:
                yield stream.sse({"id": None, "event": "reset", "data": {"reason": "too far"}})
            for frame in frames:
                last = max(last or 0, frame["id"])
                yield stream.sse(frame)
        for frame in await sync_to_async(relay.current_summary)(timezone.now()):
            yield stream.sse(frame)
        while True:
            try:
                message = await asyncio.wait_for(layer.receive(channel), timeout=keepalive)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            frame = message["frame"]
            if frame.get("id") is not None and last is not None and frame["id"] <= last:
                continue
            yield stream.sse(frame)
    finally:
        relay.unsubscribe()
        await layer.group_discard(relay.group, channel)


class EventStream(View):
    """GET /api/v1/events (class-based, so the route walk finds it)."""

    async def get(self, request):
        refused = await sync_to_async(_caller)(request)
        if refused:
            status, detail = refused
            response = JsonResponse({"detail": detail}, status=status)
            if status == 401:
                response["WWW-Authenticate"] = "Bearer"
            return response
        try:
            after = _resume_point(request)
        except ValueError as exc:
            return JsonResponse({"detail": str(exc)}, status=400)
        response = StreamingHttpResponse(event_frames(after), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
