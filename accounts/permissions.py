"""Scope checks for API tokens (AUTH-04). A session user is checked by role instead."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from accounts.models import ApiToken, User

READ_SCOPE = "fleet:read"
WRITE_SCOPE = "fleet:write"
ALL_SCOPES = (READ_SCOPE, WRITE_SCOPE)


class HasFleetScope(BasePermission):
    """GET needs fleet:read, anything else fleet:write; a viewer session may only read."""

    message = "this token lacks the scope this route needs"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        needed = READ_SCOPE if request.method in SAFE_METHODS else WRITE_SCOPE
        if isinstance(request.auth, ApiToken):
            scopes = set(request.auth.scopes)
            return needed in scopes or (needed == READ_SCOPE and WRITE_SCOPE in scopes)
        if needed == READ_SCOPE:
            return True
        return user.is_superuser or user.role in (User.Role.ADMIN, User.Role.OPERATOR)
