from django.apps import AppConfig


class ZoomiesSiteConfig(AppConfig):
    """The site app: settings registry, leases, problems, controller wiring."""

    name = "zoomies_site"
    verbose_name = "Zoomies"

    def ready(self) -> None:
        from django.core import checks  # noqa: PLC0415  # in ready(): the apps are loaded

        from zoomies_site.checks import settings_findings  # noqa: PLC0415  # in ready(): the apps are loaded

        # An error finding stops startup (CONF-04).
        checks.register(settings_findings, "zoomies")
