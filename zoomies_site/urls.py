"""URL roots."""

from django.contrib import admin
from django.urls import include, path

from zoomies_site.views import healthz

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/agent/", include("fleet.urls")),
    path("api/v1/", include("zoomies_site.api_urls")),
    path("healthz", healthz, name="healthz"),
    path("", include("runners.urls")),
]
