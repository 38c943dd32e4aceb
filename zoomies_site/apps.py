from django.apps import AppConfig


class ZoomiesSiteConfig(AppConfig):
    """The site app: settings registry, leases, problems, controller wiring."""

    name = "zoomies_site"
    verbose_name = "Zoomies"
