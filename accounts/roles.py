"""What each role may do (AUTH-03), and how a token's scopes narrow it (AUTH-04).

Three roles, each a level that includes the ones below it:

- viewer (READ): reads everything but secrets;
- operator (WRITE): also changes pools, runners and hosts (drains, cordons, join tokens);
- admin (ADMIN): also users, tokens of anyone, settings, installations and backups.

A token's scopes are levels too (fleet:read, fleet:write, admin). What a request made with a
token may do is the lower of the token's level and its owner's role, worked out when the
token is used, so demoting a user takes the power from every token they minted.
"""

from __future__ import annotations

from enum import IntEnum

NONE, READ, WRITE, ADMIN = 0, 1, 2, 3


class Level(IntEnum):
    NONE = NONE
    READ = READ
    WRITE = WRITE
    ADMIN = ADMIN


READ_SCOPE = "fleet:read"
WRITE_SCOPE = "fleet:write"
ADMIN_SCOPE = "admin"
SCOPE_LEVEL = {READ_SCOPE: Level.READ, WRITE_SCOPE: Level.WRITE, ADMIN_SCOPE: Level.ADMIN}
ALL_SCOPES = tuple(SCOPE_LEVEL)

ROLE_LEVEL = {"viewer": Level.READ, "operator": Level.WRITE, "admin": Level.ADMIN}
ROLE_FOR_LEVEL = {level: role for role, level in ROLE_LEVEL.items()}

# Models whose rows are secrets or credentials: a viewer does not see them in the admin.
SECRET_MODELS = frozenset(
    {"accounts.user", "accounts.apitoken", "fleet.jointoken", "zoomies_site.settingvalue"}
)
# What an operator may add, change and delete in the admin: pools, runners, hosts and joins.
OPERATOR_MODELS = frozenset(
    {"runners.pool", "runners.runner", "fleet.host", "fleet.jointoken", "fleet.machine"}
)
OPERATOR_VISIBLE = SECRET_MODELS & OPERATOR_MODELS


def role_level(role: str | None) -> Level:
    return ROLE_LEVEL.get(role or "", Level.NONE)


def scope_level(scopes) -> Level:
    """A token's level: its strongest scope (an unknown scope counts for nothing)."""
    return max((SCOPE_LEVEL.get(s, Level.NONE) for s in scopes or ()), default=Level.NONE)


def scopes_up_to(level: int) -> list[str]:
    """The scopes a user at `level` may give a token."""
    return [scope for scope, lvl in SCOPE_LEVEL.items() if lvl <= level]


def effective_level(user, token=None) -> Level:
    """The caller's level: the role's, lowered to the token's scopes when a token is used."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return Level.NONE
    level = role_level(getattr(user, "role", None))
    if token is not None:
        level = min(level, scope_level(token.scopes))
    return Level(level)


def _split(perm: str) -> tuple[str, str, str]:
    app_label, _, codename = perm.partition(".")
    action, _, model = codename.partition("_")
    return app_label, action, model


def role_has_perm(role: str, perm: str) -> bool:
    """Django's permission strings ("runners.change_pool") decided by the role alone."""
    level = role_level(role)
    if level >= Level.ADMIN:
        return True
    app_label, action, model = _split(perm)
    name = f"{app_label}.{model}"
    if level >= Level.WRITE:
        if name in OPERATOR_MODELS and action in ("view", "add", "change", "delete"):
            return True
        return action == "view" and name not in SECRET_MODELS - OPERATOR_VISIBLE
    if level >= Level.READ:
        return action == "view" and name not in SECRET_MODELS
    return False


def role_has_module(role: str, app_label: str) -> bool:
    return role_level(role) >= Level.READ
