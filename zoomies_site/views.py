"""Site-level views: readiness."""

from __future__ import annotations

from django.db import connection
from django.http import JsonResponse


def healthz(request):
    """Ready when the database answers; the controller waits for this before its agent."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # the answer is the error, not a 500 page
        return JsonResponse({"status": "unavailable", "error": str(exc)}, status=503)
    return JsonResponse({"status": "ok"})
