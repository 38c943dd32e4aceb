"""URLs of the runners app, mounted at the site root."""

from django.urls import path

from runners import views

app_name = "runners"

urlpatterns = [
    path("webhooks/github", views.github_webhook, name="github-webhook"),
]
