"""State changes owned by accounts: users and API tokens.

Each is one durable transaction that writes its rows and its audit row; views, the API, the
admin and the commands all call these, so no change to a user or a token skips its audit row.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from accounts import audit
from accounts.models import ApiToken, User
from accounts.roles import SCOPE_LEVEL, role_level, scopes_up_to

TOKEN_PREFIX = "zpt_"  # noqa: S105  # a name or prefix, not a secret
PREFIX_LENGTH = 12  # "zpt_" and 8 characters of the secret: shown, searchable, not enough to use


class AccountError(ValueError):
    """A request the accounts rules refuse, with a sentence the caller can act on."""


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_scopes(user: User, scopes: list[str]) -> list[str]:
    """The scopes, sorted, or AccountError: unknown ones, or more than the owner's role."""
    unknown = sorted(set(scopes) - set(SCOPE_LEVEL))
    if unknown:
        raise AccountError(
            f"unknown scope(s) {', '.join(unknown)}; the scopes are {', '.join(SCOPE_LEVEL)}"
        )
    allowed = scopes_up_to(role_level(user.role))
    beyond = sorted(set(scopes) - set(allowed))
    if beyond:
        raise AccountError(
            f"a {user.role} may not hold a token with {', '.join(beyond)}: "
            f"a token never exceeds its owner's role (allowed: {', '.join(allowed) or 'none'})"
        )
    return sorted(set(scopes))


def create_api_token(
    *,
    user: User,
    name: str,
    scopes: list[str],
    expires_at: datetime | None = None,
    actor: str,
) -> tuple[ApiToken, str]:
    """Mint a token; returns the row and the plain secret, which is never stored (AUTH-05)."""
    scopes = check_scopes(user, list(scopes))
    if not name.strip():
        raise AccountError("a token needs a name")
    if expires_at is not None and expires_at <= timezone.now():
        raise AccountError("the expiry is in the past")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic(durable=True):
        token = ApiToken.objects.create(
            user=user,
            name=name.strip(),
            prefix=secret[:PREFIX_LENGTH],
            secret_hash=hash_secret(secret),
            scopes=scopes,
            expires_at=expires_at,
        )
        audit.record(
            actor=actor,
            action="api_token.create",
            target=token,
            detail={
                "name": token.name,
                "prefix": token.prefix,
                "user": user.get_username(),
                "scopes": scopes,
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
        )
    return token, secret


def revoke_api_token(token: ApiToken, *, actor: str, now: datetime | None = None) -> bool:
    """Mark the token revoked (the row stays); False if it already was."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        changed = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=now, revoked_by=actor
        )
        if changed:
            audit.record(
                actor=actor,
                action="api_token.revoke",
                target=token,
                detail={"name": token.name, "prefix": token.prefix},
                at=now,
            )
    token.refresh_from_db(fields=["revoked_at", "revoked_by"])
    return bool(changed)


def create_user(
    *,
    username: str,
    role: str,
    actor: str,
    password: str | None = None,
    email: str = "",
    oidc_subject: str | None = None,
) -> User:
    """A new user with `role`; a password is hashed with argon2id, None leaves it unusable."""
    if role not in User.Role.values:
        raise AccountError(f"unknown role {role!r}; the roles are {', '.join(User.Role.values)}")
    with transaction.atomic(durable=True):
        if User.objects.filter(username=username).exists():
            raise AccountError(f"a user called {username!r} already exists")
        user = User(username=username, email=email, role=role, oidc_subject=oidc_subject)
        user.set_password(password) if password else user.set_unusable_password()
        user.save()
        audit.record(
            actor=actor,
            action="user.create",
            target=user,
            detail={"username": username, "role": role, "oidc": bool(oidc_subject)},
        )
    return user


def _keep_an_admin(fresh: User, after: dict) -> None:
    """Refuse the change that would leave no active admin to manage users and settings."""
    was_admin = fresh.is_active and fresh.role == User.Role.ADMIN
    stays_admin = after.get("is_active", fresh.is_active) and (
        after.get("role", fresh.role) == User.Role.ADMIN
    )
    if was_admin and not stays_admin:
        others = User.objects.select_for_update().filter(role=User.Role.ADMIN, is_active=True)
        if not others.exclude(pk=fresh.pk).exists():
            raise AccountError(f"{fresh.get_username()} is the last active admin")


def update_user(user: User, *, actor: str, keep_an_admin: bool = False, **changes) -> bool:
    """Apply `changes` (role, email, first_name, last_name, is_active); False if none differ.

    With `keep_an_admin` (the API's calls), a change that leaves no active admin is refused.
    """
    if "role" in changes and changes["role"] not in User.Role.values:
        raise AccountError(f"unknown role {changes['role']!r}")
    with transaction.atomic(durable=True):
        fresh = User.objects.select_for_update().get(pk=user.pk)
        before = {k: getattr(fresh, k) for k in changes}
        after = {k: v for k, v in changes.items() if before[k] != v}
        if not after:
            return False
        if keep_an_admin:
            _keep_an_admin(fresh, after)
        for key, value in after.items():
            setattr(fresh, key, value)
        fresh.save(update_fields=list(after))
        audit.record(
            actor=actor,
            action="user.update",
            target=fresh,
            detail={"before": {k: before[k] for k in after}, "after": after},
        )
    for key, value in after.items():
        setattr(user, key, value)
    return True


def deactivate_user(user: User, *, actor: str) -> bool:
    """Deactivate, never delete: the row and its audit trail stay, sessions and tokens stop
    working (every check wants an active user). False if already inactive."""
    with transaction.atomic(durable=True):
        fresh = User.objects.select_for_update().get(pk=user.pk)
        if not fresh.is_active:
            return False
        _keep_an_admin(fresh, {"is_active": False})
        fresh.is_active = False
        fresh.save(update_fields=["is_active"])
        audit.record(
            actor=actor,
            action="user.deactivate",
            target=fresh,
            detail={"username": fresh.get_username(), "role": fresh.role},
        )
    user.is_active = False
    return True
