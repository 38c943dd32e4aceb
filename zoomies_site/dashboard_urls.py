"""The dashboard's pages, mounted at the site root."""

from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from zoomies_site import dashboard, dashboard_github, dashboard_pools, dashboard_users

app_name = "dashboard"

urlpatterns = [
    path("", dashboard.overview_page, name="overview"),
    path("pools", dashboard.pools_page, name="pools"),
    path("pools/new", dashboard_pools.pool_form_page, name="pool-new"),
    path("pools/<int:pk>/edit", dashboard_pools.pool_form_page, name="pool-edit"),
    path("runners", dashboard.runners_page, name="runners"),
    path("jobs", dashboard.jobs_page, name="jobs"),
    path("hosts", dashboard.hosts_page, name="hosts"),
    path("machines", dashboard.machines_page, name="machines"),
    path("machines/<int:pk>/release", dashboard.machine_release, name="machine-release"),
    path("capacity", dashboard.capacity_page, name="capacity"),
    path("audit", dashboard.audit_page, name="audit"),
    path("settings", dashboard.settings_page, name="settings"),
    path("settings/github-app", dashboard_github.github_app_start, name="github-app-start"),
    path(
        "settings/github-app/created",
        dashboard_github.github_app_created,
        name="github-app-created",
    ),  # fmt: skip
    path("settings/backups", dashboard.backup_take, name="backup-take"),
    path("settings/backups/<str:name>/verify", dashboard.backup_verify, name="backup-verify"),
    path("users", dashboard_users.users_page, name="users"),
    path("users/new", dashboard_users.user_create, name="user-create"),
    path("users/<int:pk>/role", dashboard_users.user_role, name="user-role"),
    path("users/<int:pk>/deactivate", dashboard_users.user_deactivate, name="user-deactivate"),
    path("tokens/<int:pk>/revoke", dashboard_users.token_revoke, name="token-revoke"),
    # Browsers ask for it on every page (the admin's too); a 404 is a console error.
    path("favicon.ico", RedirectView.as_view(url=static("dashboard/favicon.svg")), name="favicon"),
]
