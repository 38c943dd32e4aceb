"""Site-level views: readiness."""

from __future__ import annotations

from django.db import connection
from django.http import JsonResponse
from django.views.defaults import page_not_found

from zoomies_site.core import dbhealth


def healthz(request):
    """Ready when the database answers and takes writes; the controller waits for this
    before its agent. Degraded (503, naming the problem) while the controller finds the
    database unwritable (issue 11 item 5), first: the controller knows it is riding an
    outage out, even one in which this process cannot read the database either."""
    degraded = dbhealth.read()
    if degraded is not None:
        return JsonResponse(
            {"status": "degraded", "problems": dbhealth.problems(), "since": degraded.get("since")},
            status=503,
        )
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # the answer is the error, not a 500 page
        return JsonResponse({"status": "unavailable", "error": str(exc)}, status=503)
    return JsonResponse({"status": "ok"})


def not_found(request, exception=None):
    """404 for a URL no route matches. Under /api/ it is the API's one error shape (a
    negative id, `/api/v1/pools/-1`, matches no `<int:pk>` route and was Django's HTML
    page); elsewhere Django's own page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "No such resource."}, status=404)
    return page_not_found(request, exception)
