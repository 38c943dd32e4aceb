"""URL roots."""

from django.contrib import admin
from django.urls import include, path

from capacity.views import machine_seed
from fleet.provider_setup_views import setup_enroll, setup_script
from zoomies_site.metrics_view import metrics_view
from zoomies_site.views import healthz, not_found

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/agent/", include("fleet.urls")),
    path("api/v1/", include("zoomies_site.api_urls")),
    path("healthz", healthz, name="healthz"),
    # A rented guest's cloud-init seed (issue 24): no session, only its claim code.
    path("machines/seed/<str:code>/<str:item>", machine_seed, name="machine-seed"),
    # Proxmox onboarding from the hypervisor (MACH-21): the setup's capability is the key.
    path("machines/setup/<str:capability>/script", setup_script, name="provider-setup-script"),
    path("machines/setup/<str:capability>/enroll", setup_enroll, name="provider-setup-enroll"),
    path("metrics", metrics_view, name="metrics"),
    path("", include("accounts.urls")),
    path("", include("runners.urls")),
    path("", include("zoomies_site.dashboard_urls")),
]

handler404 = not_found
