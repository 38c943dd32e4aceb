"""Who may call an API route: the caller's role, narrowed by a token's scopes (AUTH-03/04).

A route needs a role level and, when called with a token, a scope level. By default a read
needs viewer and fleet:read, anything else operator and fleet:write; a view raises either
with `read_level` / `write_level`, and `token_write_level` for what a token must carry
(managing tokens with a token takes the admin scope, so a leaked fleet:write token cannot
mint itself a successor). The token's level is capped by its owner's role at every use.
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from accounts.models import ApiToken
from accounts.roles import (
    ADMIN_SCOPE,
    ALL_SCOPES,
    READ_SCOPE,
    WRITE_SCOPE,
    Level,
    role_level,
    scope_level,
)

__all__ = [
    "ADMIN_SCOPE",
    "ALL_SCOPES",
    "READ_SCOPE",
    "WRITE_SCOPE",
    "HasFleetScope",
    "RoleAccess",
    "required_levels",
]


def required_levels(view, method: str) -> tuple[Level, Level]:
    """(role level, token scope level) that `method` on `view` needs."""
    if method in SAFE_METHODS:
        role = getattr(view, "read_level", Level.READ)
        return role, getattr(view, "token_read_level", role)
    role = getattr(view, "write_level", Level.WRITE)
    return role, getattr(view, "token_write_level", role)


class RoleAccess(BasePermission):
    """Allows a call when the caller's role, and the token's scopes if any, reach the route's.

    Anonymous callers are refused before this (401 through IsAuthenticated semantics);
    an authenticated caller short of the route's level gets 403.
    """

    message = "your role or this token's scopes do not allow this"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated and user.is_active):
            return False
        needed_role, needed_scope = required_levels(view, request.method)
        if role_level(getattr(user, "role", None)) < needed_role:
            self.message = f"this needs the {_role_name(needed_role)} role"
            return False
        if isinstance(request.auth, ApiToken):
            if scope_level(request.auth.scopes) < needed_scope:
                self.message = (
                    f"this token lacks the scope this route needs ({_scope(needed_scope)})"
                )
                return False
        return True


# The name every fleet view already uses.
HasFleetScope = RoleAccess


def _role_name(level: Level) -> str:
    return {Level.READ: "viewer", Level.WRITE: "operator", Level.ADMIN: "admin"}[level]


def _scope(level: Level) -> str:
    return {Level.READ: READ_SCOPE, Level.WRITE: WRITE_SCOPE, Level.ADMIN: ADMIN_SCOPE}[level]
