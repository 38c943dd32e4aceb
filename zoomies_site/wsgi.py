"""WSGI entry point, for tools that want one; the controller serves ASGI."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoomies_site.settings")
application = get_wsgi_application()
