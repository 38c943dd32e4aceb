"""URLs of the runners app, mounted at the site root."""

from django.urls import path

from runners import views
from runners.logs import RunnerLogs

app_name = "runners"

urlpatterns = [
    path("webhooks/github", views.github_webhook, name="github-webhook"),
    # Beside the REST API's runner routes (zoomies_site/api_urls.py), as a plain async view:
    # an SSE stream must not be a DRF view, which would hold a sync thread for its life.
    path("api/v1/runners/<int:pk>/logs", RunnerLogs.as_view(), name="api-runner-logs"),
]
