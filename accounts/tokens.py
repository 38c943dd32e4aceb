"""API token lookup. Secrets are shown once and stored as SHA-256 (AUTH-05).

Minting and revoking are actions (accounts.actions); `create_api_token` is re-exported here
for the callers that import it from this module.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from accounts.actions import TOKEN_PREFIX, create_api_token, hash_secret
from accounts.models import ApiToken

__all__ = ["TOKEN_PREFIX", "create_api_token", "hash_secret", "token_for_secret", "touch"]

# last_used_at is a hint for "is this token still in use", not an audit record: written at
# most once a minute per token, so a busy script does not turn every read into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def token_for_secret(secret: str, now: datetime | None = None) -> ApiToken | None:
    """The live token for `secret`: not revoked, not expired, its owner active."""
    now = now or timezone.now()
    token = ApiToken.objects.select_related("user").filter(secret_hash=hash_secret(secret)).first()
    if token is None or token.revoked_at is not None or not token.user.is_active:
        return None
    if token.expires_at is not None and token.expires_at <= now:
        return None
    return token


def touch(token: ApiToken, now: datetime | None = None) -> bool:
    """Record a use, unless one was recorded within the last minute; True if it wrote."""
    now = now or timezone.now()
    if token.last_used_at is not None and now - token.last_used_at < LAST_USED_RESOLUTION:
        return False
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now
    return True
