"""ASGI entry point: daphne serves the admin, API, webhooks, agent protocol and streams.

`POST /webhooks/github` goes to runners.webhook_asgi, a bare ASGI app that calls the same
`runners.webhooks.ingest` as the Django view on its own small thread pool, instead of
through Django's request cycle and its one shared thread for sync views (bench/README.md
has the measurement). Everything else, that path under other methods included, is Django's.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoomies_site.settings")
django_application = get_asgi_application()

from runners import webhook_asgi  # noqa: E402  (needs the apps loaded by the line above)


async def application(scope, receive, send):
    if webhook_asgi.handles(scope):
        return await webhook_asgi.application(scope, receive, send)
    return await django_application(scope, receive, send)
