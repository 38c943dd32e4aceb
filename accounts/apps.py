from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class AccountsConfig(AppConfig):
    name = "accounts"


class ZoomiesAdminConfig(AdminConfig):
    """django.contrib.admin with the role-checking, auditing site as `admin.site`."""

    default_site = "accounts.admin_site.ZoomiesAdminSite"
