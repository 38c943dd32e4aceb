"""ASGI entry point: daphne serves the admin, API, webhooks, agent protocol and streams."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoomies_site.settings")
application = get_asgi_application()
