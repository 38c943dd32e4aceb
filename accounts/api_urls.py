"""/api/v1/tokens, /api/v1/users and /api/v1/audit."""

from django.urls import path

from accounts.api import (
    AuditList,
    TokenList,
    TokenRevoke,
    UserDeactivate,
    UserDetail,
    UserList,
)

urlpatterns = [
    path("tokens", TokenList.as_view(), name="api-tokens"),
    path("tokens/<int:pk>/revoke", TokenRevoke.as_view(), name="api-token-revoke"),
    path("users", UserList.as_view(), name="api-users"),
    path("users/<int:pk>", UserDetail.as_view(), name="api-user"),
    path("users/<int:pk>/deactivate", UserDeactivate.as_view(), name="api-user-deactivate"),
    path("audit", AuditList.as_view(), name="api-audit"),
]
