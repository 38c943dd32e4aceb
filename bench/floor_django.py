"""The Django floor for webhook ingest and memory: a hello-world Django app under daphne.

    python -m daphne -b HOST -p PORT bench.floor_django:application

One plain synchronous view that answers `{"ok": true}` to any method (no database, no
middleware but CommonMiddleware, CSRF off as it is for the webhook), run by Django's ASGI
handler as a Zoomies view is. Between bench/floor_asgi.py (the server alone) and the
controller, it is what Django's request cycle costs before any work of ours.
"""

from __future__ import annotations

import django
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

settings.configure(
    DEBUG=False,
    SECRET_KEY="bench-floor-not-secret",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=["django.middleware.common.CommonMiddleware"],
    INSTALLED_APPS=[],
    DATABASES={},
    USE_TZ=True,
)
django.setup()


@csrf_exempt
def hello(request: HttpRequest) -> JsonResponse:
    request.body  # noqa: B018  (read it, as a webhook view does)
    return JsonResponse({"ok": True})


urlpatterns = [path("webhooks/github", hello), path("healthz", hello)]

from django.core.asgi import get_asgi_application  # noqa: E402

application = get_asgi_application()
