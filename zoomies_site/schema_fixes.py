"""Schema descriptions for two APIViews outside this app that drf-spectacular cannot read
(they name no serializer): the document then says what they answer without changing them.
Registered by import from zoomies_site.api."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiViewExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema


class TokenRevokeSchema(OpenApiViewExtension):
    target_class = "accounts.api.TokenRevoke"

    def view_replacement(self):
        from accounts.api import TokenSerializer  # noqa: PLC0415  # loaded with the URLconf, after apps

        class Described(self.target_class):
            @extend_schema(request=None, responses={200: TokenSerializer})
            def post(self, request, pk: int):
                return super().post(request, pk)

        return Described


class CapacityEventsSchema(OpenApiViewExtension):
    target_class = "capacity.api.CapacityEvents"

    def view_replacement(self):
        class Described(self.target_class):
            @extend_schema(responses={200: OpenApiTypes.OBJECT})
            def get(self, request):
                return super().get(request)

        return Described


class BackupVerifySchema(OpenApiViewExtension):
    target_class = "zoomies_site.backup.api.BackupVerify"

    def view_replacement(self):
        class Described(self.target_class):
            @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
            def post(self, request, name: str):
                return super().post(request, name)

        return Described


# The event stream is a plain async Django view (an SSE stream must not hold a DRF
# thread), which drf-spectacular never sees; this hook writes its operation instead.
EVENT_STREAM = {
    "operationId": "events_stream",
    "summary": "The event stream (Server-Sent Events)",
    "description": (
        "Every change to a pool, runner, job or host as an SSE frame: `id:` the event's id, "
        "`event:` the resource (pool, runner, job, host), `data:` JSON "
        '`{"kind", "id", "object"}` where `object` is the resource\'s GET shape (null when '
        "it was deleted). The current `overview` and `problems` follow the backlog (no id) "
        "and are sent again when they change; `reset` (no id) means the client is too far "
        "behind to resume and should reload. A comment line is sent when idle. The stream "
        "does not end; a client reconnects with `Last-Event-ID` (or `?after=`) to resume."
    ),
    "tags": ["events"],
    "parameters": [
        {
            "in": "header",
            "name": "Last-Event-ID",
            "required": False,
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
            "description": "Resume after this event id (the browser sends it on reconnect).",
        },
        {
            "in": "query",
            "name": "after",
            "required": False,
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
            "description": "Resume after this event id (a page's first connection).",
        },
    ],
    "security": [{"apiToken": []}, {"cookieAuth": []}],
    "responses": {
        "200": {
            "description": "The stream: SSE frames, never closed by the server.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
    },
}


def add_event_stream(result, generator, request, public):
    """drf-spectacular postprocessing hook: GET /api/v1/events, as zoomies_site.sse serves it
    (before `add_error_responses`, which gives it the error statuses like any route)."""
    result.setdefault("paths", {})["/api/v1/events"] = {"get": EVENT_STREAM}
    return result
