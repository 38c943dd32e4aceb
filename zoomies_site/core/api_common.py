"""What every /api/v1/ route shares: pagination and the one error shape (issue 10 item 6).

Every list answers `{"next", "previous", "results"}` and takes `?limit=`: rows of a table
in cursor pages (Pages), a list worked out afresh for each request in ListPages.

Every error body has a `detail` sentence. A validation error also names each bad field at
the top level with its messages, so a client can point at the field:

    {"detail": "invalid input: name", "name": ["Pool names are ..."]}
"""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

log = logging.getLogger("zoomies.api")


class TokenScheme(OpenApiAuthenticationExtension):
    """How the schema names `Authorization: Bearer zpt_…` (accounts.api_auth)."""

    target_class = "accounts.api_auth.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "an API token, zpt_…"}


class DetailSerializer(serializers.Serializer):
    """The one error shape, `{"detail": …}`, for the schema's answers."""

    detail = serializers.CharField()


class Conflict(exceptions.APIException):
    """The request is well formed but the resource's state forbids it (a pool in use)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "the resource's state does not allow this"
    default_code = "conflict"


class Pages(CursorPagination):
    """Cursor pages, newest first: `{"next", "previous", "results"}` as the audit and
    token lists answer. `?limit=` picks the page size, up to MAX."""

    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000
    ordering = "-pk"


class NamePages(Pages):
    """Pages of rows with a unique name (pools, hosts), in name order."""

    ordering = "name"


class ListPages(Pages):
    """Pages of a list computed for each request (settings, problems, backups), in the list's
    own order, with Pages' shape, `?limit=` and browsable controls. The cursor holds an
    offset: a row that comes or goes between two requests shifts the next page by one, which
    for these short lists worked out afresh is all a cursor over rows would have saved."""

    # DRF caps a cursor's offset to keep a database OFFSET cheap; a list in memory is not.
    offset_cutoff = None

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        self.page_size = self.get_page_size(request)
        self.base_url = request.build_absolute_uri()
        cursor = self.decode_cursor(request)
        self.offset = cursor.offset if cursor else 0
        rows = list(queryset)
        self.page = rows[self.offset : self.offset + self.page_size]
        self.has_next = self.offset + self.page_size < len(rows)
        self.has_previous = self.offset > 0
        self.display_page_controls = self.has_next or self.has_previous
        return self.page

    def get_next_link(self):
        if not self.has_next:
            return None
        return self.encode_cursor(Cursor(self.offset + self.page_size, False, None))

    def get_previous_link(self):
        if not self.has_previous:
            return None
        return self.encode_cursor(Cursor(max(self.offset - self.page_size, 0), False, None))


def page_of(view: APIView, rows) -> Response:
    """A plain APIView's list in its pagination_class's pages (a GenericAPIView would ask the
    browsable renderer for a queryset these lists do not have)."""
    view.paginator = view.pagination_class()
    page = view.paginator.paginate_queryset(rows, view.request, view=view)
    return view.paginator.get_paginated_response(page)


def exception_handler(exc, context):
    """accounts' handler (the 413), then every body brought to the one shape."""
    response = api_exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if isinstance(data, list):
        response.data = {"detail": " ".join(str(m) for m in data) or "invalid input"}
    elif isinstance(data, dict) and "detail" not in data:
        fields = [k for k in data if k != "non_field_errors"]
        summary = "invalid input" + (f": {', '.join(fields)}" if fields else "")
        extra = data.get("non_field_errors")
        if extra:
            summary += " (" + " ".join(str(m) for m in extra) + ")"
        response.data = {"detail": summary, **data}
    return response


def error(status_code: int, detail: str) -> Response:
    return Response({"detail": detail}, status=status_code)


ERROR_SCHEMA = {
    "type": "object",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
    "additionalProperties": True,
    "description": "The one error shape: a sentence, and for a validation error each bad "
    "field by name with its messages.",
}
ERROR_STATUSES = {
    "400": "Bad input; the body names each bad field.",
    "401": "No credential, or one that is not valid.",
    "403": "The caller's role or token scopes do not allow this.",
    "404": "No such resource.",
    "409": "The resource's state does not allow this.",
    "413": "The request body is too large.",
}


def add_error_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: every operation documents the error shape for
    the statuses any route may answer, so a client (and schemathesis) knows what it gets."""
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    ref = {"$ref": "#/components/schemas/Error"}
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for code, description in ERROR_STATUSES.items():
                operation["responses"].setdefault(
                    code,
                    {"description": description, "content": {"application/json": {"schema": ref}}},
                )
    return result


def api_exception_handler(exc, context):
    """DRF's handler, plus: a body over DATA_UPLOAD_MAX_MEMORY_SIZE is a 413, not a traceback.

    Django raises RequestDataTooBig when a view reads such a body; left to Django it is
    answered with an HTML 400 and logged as an ERROR with its traceback, though the client,
    not the server, is at fault.
    """
    # Imported here: rest_framework.views imports this module through the API settings.
    from rest_framework.views import exception_handler  # noqa: PLC0415

    if isinstance(exc, RequestDataTooBig):
        request = context.get("request")
        log.warning("%s: the request body is too large (%s)", getattr(request, "path", "?"), exc)
        return Response(
            {"detail": "the request body is too large"},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    return exception_handler(exc, context)
