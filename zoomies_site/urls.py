"""URL roots."""

from django.contrib import admin
from django.urls import include, path

from zoomies_site.metrics_view import metrics_view
from zoomies_site.views import healthz

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/agent/", include("fleet.urls")),
    path("api/v1/", include("zoomies_site.api_urls")),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("", include("accounts.urls")),
    path("", include("runners.urls")),
    path("", include("zoomies_site.dashboard_urls")),
]
