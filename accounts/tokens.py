"""API token minting and lookup. Secrets are shown once and stored as SHA-256 (AUTH-05)."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from accounts import audit
from accounts.models import ApiToken, User

TOKEN_PREFIX = "zpt_"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_api_token(
    *, user: User, name: str, scopes: list[str], expires_at: datetime | None = None, actor: str
) -> tuple[ApiToken, str]:
    """Mint a token; returns the row and the plain secret, which is never stored."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user,
            name=name,
            prefix=secret[:12],
            secret_hash=hash_secret(secret),
            scopes=sorted(set(scopes)),
            expires_at=expires_at,
        )
        audit.record(
            actor=actor, action="api_token.create", target=token, detail={"scopes": scopes}
        )
    return token, secret


def token_for_secret(secret: str) -> ApiToken | None:
    token = ApiToken.objects.select_related("user").filter(secret_hash=hash_secret(secret)).first()
    if token is None or not token.user.is_active:
        return None
    if token.expires_at is not None and token.expires_at <= timezone.now():
        return None
    return token
